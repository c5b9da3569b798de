"""Local text files or globs, one file one document, UTF-8 decoded in blocks."""

from __future__ import annotations

import codecs
import glob
import hashlib
import os
from pathlib import Path
from typing import Sequence
from mwm.errors import DataError
from mwm.data.corpora.units import READ_BLOCK, Source, last_safe_cut, iter_pieces




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
                    cut = last_safe_cut(buf, max(scan, 1), len(buf))
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
