"""Atomic file writes and append-only CSV logs.

Every product is written to a temporary file in the same folder and renamed
into place, so a killed job never leaves a half-written file. This is the one
atomic writer of the package; files get the permissions the umask gives
(0644 under 022), so teammates on a shared cluster can read them. JSON is
strict: a non-finite float is written as ``null`` and named under
``non_finite`` with its value. Logs are CSV files
appended one whole line per ``write`` and flushed, so they can be read while a
run is going (a reader should ignore an unterminated last line).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_bytes", "current_umask", "strict_json",
           "atomic_write_json", "atomic_savez", "atomic_torch_save", "CsvLog", "read_csv_rows"]


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux /proc)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename ``tmp_path`` onto ``path`` (mode 0666 & ~umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600
        os.close(fd)
        fd = -1
        writer(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    def w(p: Path):
        with open(p, "w", newline="") as fh:
            fh.write(text)

    return atomic_write(path, w)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda p: p.write_bytes(data))


def strict_json(obj: Any) -> tuple[Any, dict]:
    """``obj`` with every non-finite float replaced by None, and {dotted key: 'nan'/'inf'/'-inf'}."""
    bad: dict[str, str] = {}

    def clean(o, where):
        if isinstance(o, dict):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(o)]
        if isinstance(o, (np.floating, np.integer)):
            o = o.item()
        if isinstance(o, float) and not math.isfinite(o):
            bad[where] = "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
            return None
        return o

    return clean(obj, ""), bad


def atomic_write_json(path: str | Path, obj: Any, sort_keys: bool = True) -> Path:
    """Strict JSON: NaN/Inf become null, and a top-level mapping gets ``non_finite``
    naming each such key and its value (the reason for the null)."""
    obj, bad = strict_json(obj)
    if bad and isinstance(obj, dict):
        obj["non_finite"] = bad
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


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


class _KeepWriteError:
    """The binary file ``torch.save`` writes to, keeping the OSError of a failed write:
    PyTorch reports one only as "unexpected pos" (a full disk read as a RuntimeError)."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    """``torch.save`` atomically; a failed write (ENOSPC, EIO, a quota) raises the OS's
    own OSError naming ``path``, whatever PyTorch turned it into; ``path`` is untouched."""
    import torch

    def w(p: Path):
        with open(p, "wb") as fh:
            sink = _KeepWriteError(fh)
            try:
                torch.save(obj, sink)
                fh.flush()
            except Exception as exc:
                err = sink.error if sink.error is not None else exc
                if isinstance(err, OSError):
                    raise OSError(err.errno, err.strerror or str(err), str(path)) from exc
                raise

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
