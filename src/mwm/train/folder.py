"""A run's folder on disk: its logs, and their copy beside its checkpoint.

Where a run lives is the plan's (:func:`mwm.plan.runs.run_dir`, :func:`mwm.plan.runs.checkpoint_dir`);
what training writes there, cuts back on resume and mirrors beside the checkpoint is this module's.
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

from mwm.io import CsvLog, atomic_write, read_csv_rows
from mwm.plan.runs import checkpoint_dir, run_dir

__all__ = ["RUN_LOGS", "RUN_STEP_FOLDERS", "RunFolder"]

#: The append-only CSV logs of a run, as ``{key: file}`` (cut back to a checkpoint on resume).
RUN_LOGS = {"metrics": "metrics.csv", "eval": "eval.csv", "spectral": "spectral.csv", "attention": "attention.csv",
            "solver": "solver.csv"}
#: Folders of per-step arrays (``step_NNNNNN.npz``) a run writes.
RUN_STEP_FOLDERS = ("spectra", "sequence")


class RunFolder:
    """The files of one run: its folder ``dir`` (:func:`run_dir`), its checkpoint
    ``ckpt_path`` and the copy of its logs beside the checkpoint, ``mirror``
    (:func:`checkpoint_dir`). The workflow deletes a failed job's declared outputs (the
    logs) before it retries; the copy lets the retry resume anyway. Rank 0 alone calls
    the methods that write."""
    def __init__(self, root: str | Path, config_name: str, variant: str, seed: int):
        self.dir = run_dir(root, config_name, variant, seed)
        self.ckpt_dir = checkpoint_dir(root, config_name, variant, seed)
        self.ckpt_path = self.ckpt_dir / "ckpt.pt"
        self.mirror = self.ckpt_dir / "logs"

    def open_logs(self, columns: dict[str, list[str]], resume_step: int) -> dict:
        """``{key: CsvLog}`` for the logs of ``columns`` (keys of :data:`RUN_LOGS`), each
        with its rows at or after ``resume_step`` dropped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        logs = {key: CsvLog(self.dir / RUN_LOGS[key], cols) for key, cols in columns.items()}
        for log in logs.values():
            log.truncate_from(resume_step)
        return logs

    def save_mirror(self) -> None:
        """Copy the logs, pairs and new per-step arrays beside the checkpoint."""
        _copy_run_files(self.dir, self.mirror, replace_steps=False)

    def restore_mirror(self) -> bool:
        """Copy the checkpoint's logs back into the run folder; False when there are none."""
        if not (self.mirror / RUN_LOGS["metrics"]).exists():
            return False
        _copy_run_files(self.mirror, self.dir, replace_steps=True)
        return True

    def extent(self, step: int, where: Path | None = None) -> dict:
        """What the run's files below ``step`` are, in ``where`` (default the run folder): per log its
        number of complete rows below ``step`` (None: absent or unreadable), per step folder the
        names of its arrays below ``step``, and whether pairs.npz exists. A checkpoint records its
        logs' extent; a resume continues only files that show the same (:meth:`holds`)."""
        base = self.dir if where is None else where
        out: dict = {name: _rows_below(base / name, step) for name in RUN_LOGS.values()}
        for sub in RUN_STEP_FOLDERS:
            out[sub] = sorted(f.name for f in (base / sub).glob("step_*.npz") if _step_of(f) < step)
        out["pairs.npz"] = (base / "pairs.npz").is_file()
        return out

    def holds(self, step: int, extent: dict | None, where: Path | None = None) -> bool:
        """Whether the files in ``where`` (default the run folder) are those a checkpoint at ``step``
        recorded (``extent``): every log with the same rows below ``step``, every per-step array and
        pairs.npz it had. Without a recorded extent (an older checkpoint): metrics.csv holds every step
        below ``step``."""
        base = self.dir if where is None else where
        if extent is None:
            path = base / RUN_LOGS["metrics"]
            try:
                steps = [int(r["step"]) for r in read_csv_rows(path)] if path.exists() else None
            except (KeyError, ValueError, TypeError):
                return False
            return steps is not None and set(range(step)) <= set(steps)
        now = self.extent(step, base)
        for name in RUN_LOGS.values():
            if name in extent and now[name] != extent[name]:
                return False
        for sub in RUN_STEP_FOLDERS:
            if not set(extent.get(sub, ())) <= set(now[sub]):
                return False
        return not extent.get("pairs.npz") or now["pairs.npz"]

    def logs_reach(self, step: int, extent: dict | None = None) -> bool:
        """Whether the run folder can continue from a checkpoint at ``step`` (:meth:`holds`)."""
        return self.holds(step, extent)

    def mirror_holds(self, step: int, extent: dict | None) -> bool:
        """Whether the copy beside the checkpoint can (:meth:`holds`)."""
        return (self.mirror / RUN_LOGS["metrics"]).exists() and self.holds(step, extent, self.mirror)

    def set_aside(self) -> Path:
        """Move the checkpoint, its copy of the logs and the run folder's logs, pairs and per-step arrays
        into ``<checkpoint folder>.unusable`` (replacing an earlier one) rather than delete them, so a
        run that cannot continue starts afresh and loses nothing to a wrong guess. Returns that folder."""
        aside = self.ckpt_dir.with_name(self.ckpt_dir.name + ".unusable")
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir(parents=True)
        if self.ckpt_dir.is_dir():
            os.replace(self.ckpt_dir, aside / "checkpoint")
        run = aside / "run"
        run.mkdir()
        for name in (*RUN_LOGS.values(), "pairs.npz"):
            if (self.dir / name).exists():
                os.replace(self.dir / name, run / name)
        for sub in RUN_STEP_FOLDERS:
            if (self.dir / sub).is_dir():
                (run / sub).mkdir()
                for f in (self.dir / sub).glob("step_*.npz"):
                    os.replace(f, run / sub / f.name)
        return aside

    def invalidate_products(self, start: int, capture_pairs_step: int | None) -> None:
        """Before the logs are cut back to ``start``: remove the summary and the products a
        finished run leaves (final.pt; pairs.npz, spectra and sequence steps not before ``start``), so an
        interrupted rerun never looks complete (the summary comes back at the end)."""
        (self.dir / "summary.json").unlink(missing_ok=True)
        (self.dir / "final.pt").unlink(missing_ok=True)
        if capture_pairs_step is None or capture_pairs_step >= start:
            (self.dir / "pairs.npz").unlink(missing_ok=True)
        for sub in RUN_STEP_FOLDERS:
            for f in (self.dir / sub).glob("step_*.npz"):
                if int(f.stem.split("_")[1]) >= start:
                    f.unlink()

    def discard_logs(self) -> None:
        """Remove the run folder's logs, pairs and per-step arrays (a run starting at step 0 rewrites them
        all; a stale log with a foreign header or a non-integer step would fail every retry)."""
        for name in (*RUN_LOGS.values(), "pairs.npz"):
            (self.dir / name).unlink(missing_ok=True)
        for sub in RUN_STEP_FOLDERS:
            for f in (self.dir / sub).glob("step_*.npz"):
                f.unlink()

    def drop_checkpoint(self) -> None:
        """Remove the checkpoint and its copy of the logs (nothing left to resume)."""
        self.ckpt_path.unlink(missing_ok=True)
        shutil.rmtree(self.mirror, ignore_errors=True)


def _step_of(f: Path) -> int:
    try:
        return int(f.stem.split("_")[1])
    except (IndexError, ValueError):
        return -1  # not a step array: never counted


def _rows_below(path: Path, step: int) -> int | None:
    """The complete rows of a CSV log whose step is below ``step``; None when it is absent or a row's step
    is not an integer (a log that cannot be continued)."""
    if not path.is_file():
        return None
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header or "step" not in header:
                return None
            idx, n = header.index("step"), 0
            for fields in reader:
                if len(fields) != len(header):
                    continue  # a torn last row: truncate_from drops it too
                n += int(fields[idx]) < step
            return n
    except (ValueError, UnicodeDecodeError, csv.Error):
        return None


def _copy_run_files(src: Path, dst: Path, replace_steps: bool) -> None:
    """Copy a run's logs, pairs.npz and per-step arrays from ``src`` to ``dst``; per-step
    files already at ``dst`` are kept unless ``replace_steps`` (they never change)."""

    for name in (*RUN_LOGS.values(), "pairs.npz"):
        if (src / name).exists():
            atomic_write(dst / name, lambda p, name=name: shutil.copyfile(src / name, p))
    for sub in RUN_STEP_FOLDERS:
        if (src / sub).is_dir():
            for f in sorted((src / sub).glob("step_*.npz")):
                if replace_steps or not (dst / sub / f.name).exists():
                    atomic_write(dst / sub / f.name, lambda p, f=f: shutil.copyfile(f, p))

