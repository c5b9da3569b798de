"""Reading a prepared token folder: ``meta.json`` + ``train.bin`` + ``val.bin``.

Opening checks ``meta.json`` against itself (``meta_sha256``, the SHA-256 of its
own canonical content, and cross-checks: vocab_size and eot_id against the
tokenizer and remap, data_hash against data), that every file is there and that
each bin's byte size is the one ``meta.json`` records (cheap: a truncated or
replaced file is caught at once). :meth:`TokenDataset.verify_checksums` reads both
bins in full: SHA-256 against ``meta.json`` and every id below ``vocab_size`` (an
error names the file and the offset). :meth:`TokenDataset.verify_cached` (what
training calls) does the same once per data folder and caches the verdict in
``.verified.json`` keyed by each bin's size, mtime, inode and inode change time and by
meta.json's hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from mwm.errors import DataError

__all__ = ["TokenDataset", "FORMAT", "FORMAT_VERSION", "SPLITS", "sha256_file", "meta_digest", "VERIFIED_NAME"]

FORMAT = "mwm-tokens"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
_HASH_CHUNK = 1 << 23
VERIFIED_NAME = ".verified.json"


def meta_digest(meta: dict) -> str:
    """SHA-256 of meta.json's content without its own ``meta_sha256`` (canonical JSON)."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _cross_check(path: Path, meta: dict) -> None:
    """meta.json's fields that follow from one another must agree (an edit shows)."""
    if "meta_sha256" in meta and meta["meta_sha256"] != meta_digest(meta):
        raise DataError(f"{path}: its content does not match its meta_sha256 (the file was edited); "
                        f"prepare the data again")
    tok, remap = meta.get("tokenizer") or {}, meta.get("remap")
    if isinstance(remap, dict) and "k" in remap:
        want_vocab = remap["k"] + 1
        kept = remap.get("kept_ids") or []
        want_eot = kept.index(tok.get("eot")) if tok.get("eot") in kept else None
    else:
        want_vocab, want_eot = tok.get("n_vocab"), tok.get("eot")
    for key, want in (("vocab_size", want_vocab), ("eot_id", want_eot)):
        if want is not None and meta.get(key) != want:
            raise DataError(f"{path}: {key} is {meta.get(key)!r}, but its tokenizer and remap give {want}; "
                            f"the file was edited or damaged: prepare the data again")
    if "data" in meta and "data_hash" in meta:
        from mwm.config import config_hash

        if config_hash(meta["data"]) != meta["data_hash"]:
            raise DataError(f"{path}: data_hash does not match its data section (the file was edited)")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_CHUNK):
            h.update(block)
    return h.hexdigest()


def read_meta(folder: Path) -> dict:
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} does not exist: prepare the data first (python -m mwm.data prepare ...)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        raise DataError(f"{path}: not an {FORMAT} meta file (format: {fmt!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {meta.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    for split in SPLITS:
        entry = meta.get("splits", {}).get(split)
        if not isinstance(entry, dict) or not {"file", "bytes", "tokens", "sha256"} <= set(entry):
            raise DataError(f"{path}: splits.{split} lacks file/bytes/tokens/sha256")
    _cross_check(path, meta)
    return meta


#: What a verified bin must still show to skip hashing it again. The inode's change time is one key
#: no edit, copy or ``touch`` can restore (an edit with its mtime put back changes it), so a file
#: altered in place is hashed again; a moved checkout (a rename updates it) is hashed once more.
_FILE_KEY = ("size", "mtime_ns", "ctime_ns", "inode")


def _file_key(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


class TokenDataset:
    """A prepared token folder, memory-mapped.

    ``meta`` is ``meta.json``; ``vocab_size`` the model's vocabulary (K + 1 after
    the small-vocab remap, else 50257); ``split(name)`` the ids of ``train`` or
    ``val`` as a read-only ``np.memmap`` of uint16.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DataError(f"{self.folder} is not a folder of prepared tokens (it does not exist)")
        self.meta = read_meta(self.folder)
        self.dtype = np.dtype(self.meta.get("dtype", "<u2"))
        if self.dtype.kind != "u" or self.dtype.itemsize != 2:
            raise DataError(f"{self.folder / 'meta.json'}: dtype {self.meta.get('dtype')!r}, expected uint16")
        self._maps = {}
        for split in SPLITS:
            entry = self.meta["splits"][split]
            path, size = self._checked_bin(entry)
            if entry["bytes"] != entry["tokens"] * self.dtype.itemsize:
                raise DataError(f"{self.folder / 'meta.json'}: splits.{split} has {entry['bytes']} bytes "
                                f"for {entry['tokens']} tokens")
            self._maps[split] = np.memmap(path, dtype=self.dtype, mode="r") if size else np.empty(0, self.dtype)

    def _checked_bin(self, entry: dict) -> tuple[Path, int]:
        """Path and size of a split's bin, refused (DataError naming the file) when it is
        missing or its size differs from meta.json's."""
        path = self.folder / entry["file"]
        if not path.is_file():
            raise DataError(f"{path} does not exist (meta.json lists it with {entry['tokens']} tokens)")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise DataError(
                f"{path}: {size} bytes on disk, meta.json says {entry['bytes']} "
                f"({entry['tokens']} tokens): the file is truncated or from another run; prepare it again")
        return path, size

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eot(self) -> int:
        """The end-of-text id in this folder's ids (remapped if the vocabulary is)."""
        return int(self.meta["eot_id"])

    def split(self, name: str) -> np.memmap:
        if name not in self._maps:
            raise DataError(f"split {name!r} is not one of {list(SPLITS)} in {self.folder}")
        return self._maps[name]

    def tokens(self, name: str) -> int:
        return len(self.split(name))

    def _scan(self, split: str) -> dict:
        """Read one bin in full: its SHA-256 and largest id; DataError naming the file and
        the offset of the first id outside the vocabulary."""
        entry = self.meta["splits"][split]
        path, size = self._checked_bin(entry)
        h, top, offset = hashlib.sha256(), -1, 0
        vocab = self.vocab_size
        with open(path, "rb") as fh:
            while block := fh.read(_HASH_CHUNK):
                h.update(block)
                ids = np.frombuffer(block, dtype=self.dtype)
                if len(ids):
                    m = int(ids.max())
                    if m >= vocab:
                        i = offset + int(np.argmax(ids >= vocab))
                        raise DataError(f"{path}: token id {int(ids[i - offset])} at token offset {i} (byte "
                                        f"{i * self.dtype.itemsize}) is outside the vocabulary of {vocab} ids "
                                        f"(meta.json vocab_size); prepare the data again")
                    top = max(top, m)
                offset += len(ids)
        got = h.hexdigest()
        if got != entry["sha256"]:
            raise DataError(f"{path}: sha256 {got} differs from meta.json's {entry['sha256']}: "
                            f"the file was altered; prepare it again")
        return {**_file_key(path.stat()), "sha256": got, "max_id": top}

    def verify_checksums(self) -> dict:
        """Read both bins in full: SHA-256 against meta.json and every id inside the
        vocabulary; DataError names the file (and the offset). Writes nothing."""
        return {split: self._scan(split) for split in SPLITS}

    def _verdict_key(self) -> str:
        return hashlib.sha256((self.folder / "meta.json").read_bytes()).hexdigest()

    def _write_verdict(self, splits: dict) -> None:
        from mwm.io import atomic_write_json

        try:
            atomic_write_json(self.folder / VERIFIED_NAME, {"meta": self._verdict_key(), "splits": splits})
        except OSError:  # a read-only data folder: verified every time instead
            pass

    def verified(self) -> bool:
        """Whether ``.verified.json`` still vouches for both bins: meta.json's hash and each bin's
        :func:`_file_key`, checksum and largest id as they were when last hashed."""
        try:
            cached = json.loads((self.folder / VERIFIED_NAME).read_text())
            fresh = cached["meta"] == self._verdict_key()
            for split in SPLITS:
                st = (self.folder / self.meta["splits"][split]["file"]).stat()
                c = cached["splits"][split]
                fresh = (fresh and {k: c[k] for k in _FILE_KEY} == _file_key(st)
                         and c["sha256"] == self.meta["splits"][split]["sha256"] and c["max_id"] < self.vocab_size)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return fresh

    def verify_cached(self) -> bool:
        """:meth:`verify_checksums` once per data folder: skipped (returns False) while
        :meth:`verified`, else run and its verdict cached."""
        if self.verified():
            return False
        self._write_verdict(self.verify_checksums())
        return True

    def __repr__(self) -> str:
        c = self.meta.get("corpus", {}).get("name", "?")
        return (f"TokenDataset({str(self.folder)!r}, corpus={c}, vocab_size={self.vocab_size}, "
                f"train={self.tokens('train')}, val={self.tokens('val')})")
