"""Atomic file writes and append-only CSV logs.

Every product is written to a temporary file in the same folder and renamed
into place, so a killed job never leaves a half-written file. Logs are CSV files
appended one whole line per ``write`` and flushed, so they can be read while a
run is going (a reader should ignore an unterminated last line).
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_json", "atomic_savez", "atomic_torch_save", "CsvLog",
           "read_csv_rows"]


def atomic_write(path: str | Path, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` then rename ``tmp_path`` onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def atomic_savez(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    def w(p: Path):
        with open(p, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    atomic_write(path, w)


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    import torch

    def w(p: Path):
        with open(p, "wb") as fh:
            torch.save(obj, fh)

    atomic_write(path, w)


class CsvLog:
    """Append-only CSV with a fixed header; ``truncate_from(step)`` drops rows at or after ``step``."""

    def __init__(self, path: str | Path, columns: list[str]):
        self.path = Path(path)
        self.columns = list(columns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            atomic_write_text(self.path, ",".join(self.columns) + "\n")
        else:
            with open(self.path) as fh:
                header = fh.readline().strip().split(",")
            if header != self.columns:
                raise ValueError(f"{self.path}: existing header {header} differs from {self.columns}")

    def write(self, rows: dict | Iterable[dict]) -> None:
        rows = [rows] if isinstance(rows, dict) else list(rows)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.columns, extrasaction="raise", lineterminator="\n")
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in r.items()})
        with open(self.path, "a") as fh:
            fh.write(buf.getvalue())
            fh.flush()

    def truncate_from(self, step: int) -> None:
        """Keep the header and the complete rows whose ``step`` is below ``step``."""
        with open(self.path) as fh:
            text = fh.read()
        lines = text.split("\n")
        keep = [lines[0]]
        idx = self.columns.index("step")
        for line in lines[1:]:
            if not line:
                continue
            fields = next(csv.reader([line]))
            if len(fields) == len(self.columns) and int(fields[idx]) < step:
                keep.append(line)
        atomic_write_text(self.path, "\n".join(keep) + "\n")


def _fmt(v):
    if isinstance(v, float):
        return repr(v)
    return v


def read_csv_rows(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))
