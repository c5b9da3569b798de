"""Reading a prepared token folder: ``meta.json`` + ``train.bin`` + ``val.bin``.

Opening checks that every file is there and that each bin's byte size is the one
``meta.json`` records (cheap: a truncated or replaced file is caught at once);
:meth:`TokenDataset.verify_checksums` reads both bins in full against their
recorded SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .errors import DataError

__all__ = ["TokenDataset", "FORMAT", "FORMAT_VERSION", "SPLITS", "sha256_file"]

FORMAT = "mwm-tokens"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
_HASH_CHUNK = 1 << 23


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
    return meta


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

    def verify_checksums(self) -> None:
        """Read both bins in full and compare with meta.json's SHA-256; DataError names the file."""
        for split in SPLITS:
            entry = self.meta["splits"][split]
            path, _ = self._checked_bin(entry)
            got = sha256_file(path)
            if got != entry["sha256"]:
                raise DataError(f"{path}: sha256 {got} differs from meta.json's {entry['sha256']}: "
                                f"the file was altered; prepare it again")

    def __repr__(self) -> str:
        c = self.meta.get("corpus", {}).get("name", "?")
        return (f"TokenDataset({str(self.folder)!r}, corpus={c}, vocab_size={self.vocab_size}, "
                f"train={self.tokens('train')}, val={self.tokens('val')})")
