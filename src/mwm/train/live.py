"""Live training curves where ML users look: TensorBoard and DVCLive, optional (``workflow.loggers``).

A run's CSV logs stay its record (the report reads them). With a logger chosen, every row a run
writes to ``metrics.csv``, ``eval.csv``, ``spectral.csv`` and ``attention.csv`` also goes, as it is
written, to TensorBoard event files (``<run>/tensorboard/``) and DVCLive's metric files
(``<run>/dvclive/``), so a 30-hour run can be watched in ``tensorboard --logdir results/runs`` or
with ``dvc plots``. When a run starts or resumes, its live logs are rebuilt from its CSVs (already
cut back to the checkpoint's step), so a resumed run shows each step once. Both also get the run's
parameters (its identity, flattened to dotted keys: :func:`flat_params`): TensorBoard's hparams,
DVCLive's ``params.yaml``. The live folders are rebuilt from the CSVs, so DVC does not hash them
(``.dvcignore``): choosing a logger leaves the ``runs`` stage's output as it was.

Tags: ``train/loss``, ``train/lr``, ``train/muon_lr`` (every step); ``eval/train_loss``,
``eval/val_loss``; ``sigma_max/<matrix>`` (every evaluation; logit growth's bound);
``logit_range_max/layer<L>.head<H>`` (attention logits, every evaluation).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from mwm.config.names import LOGGERS  # the loggers a config may choose

__all__ = ["LOGGERS", "scalars", "flat_params", "LiveLogs", "TeeLog"]


def scalars(table: str, row: dict) -> list[tuple[str, float]]:
    """The (tag, value) pairs of one CSV row of ``table`` (a key of the run's logs); [] for the others."""
    if table == "metrics":
        return [(f"train/{k if k != 'train_loss' else 'loss'}", float(row[k])) for k in ("train_loss", "lr", "muon_lr")]
    if table == "eval":
        return [("eval/train_loss", float(row["train_loss"])), ("eval/val_loss", float(row["val_loss"]))]
    if table == "spectral":
        return [(f"sigma_max/{row['name']}", float(row["sigma_max"]))]
    if table == "attention":
        return [(f"logit_range_max/layer{row['layer']}.head{row['head']}", float(row["logit_range_max"]))]
    return []


def flat_params(params: dict, prefix: str = "") -> dict[str, int | float | str | bool]:
    """``params`` with nested sections flattened to dotted keys; ``None`` and lists as their text
    (TensorBoard's hparams take numbers, strings and booleans only)."""
    out: dict[str, int | float | str | bool] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = "null" if value is None else str(value)
    return out


class LiveLogs:
    """The chosen loggers of one run folder, rebuilt from its CSVs (``tables``: key -> path), with the run's
    ``params`` (nested; see :func:`flat_params`)."""

    def __init__(self, names: Iterable[str], run_dir: str | Path, tables: dict[str, Path], params: dict | None = None):
        names = list(names)
        unknown = sorted(set(names) - set(LOGGERS))
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown}; choose from {list(LOGGERS)}")
        self.dir = Path(run_dir)
        self.tb = self.live = None
        for name in names:
            shutil.rmtree(self.dir / name, ignore_errors=True)  # rebuilt below from the CSVs
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"))
        if "dvclive" in names:
            from dvclive import Live

            self.live = Live(dir=str(self.dir / "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None)
        if params:
            self._log_params(flat_params(params))
        from mwm.io import read_csv_rows

        for table, path in tables.items():
            if Path(path).exists():
                self.write(table, read_csv_rows(path))
        self.flush()

    def _log_params(self, flat: dict) -> None:
        if self.tb is not None:
            from torch.utils.tensorboard.summary import hparams

            # in the run's own event file, tied to its val-loss series (no separate hparams run)
            for summary in hparams(flat, {"eval/val_loss": float("nan")}):
                self.tb.file_writer.add_summary(summary)
        if self.live is not None:
            self.live.log_params(flat)

    def write(self, table: str, rows: dict | Iterable[dict]) -> None:
        for row in [rows] if isinstance(rows, dict) else rows:
            step = int(row["step"])
            for tag, value in scalars(table, row):
                if self.tb is not None:
                    self.tb.add_scalar(tag, value, step)
                if self.live is not None:
                    self.live.step = step
                    self.live.log_metric(tag, value)

    def flush(self) -> None:
        if self.tb is not None:
            self.tb.flush()
        if self.live is not None:
            self.live.make_summary()

    def close(self) -> None:
        self.flush()
        if self.tb is not None:
            self.tb.close()


class TeeLog:
    """A run's CSV log whose rows also go to its live logs."""

    def __init__(self, log, table: str, live: LiveLogs):
        self.log, self.table, self.live = log, table, live

    def write(self, rows) -> None:
        rows = [rows] if isinstance(rows, dict) else list(rows)
        self.log.write(rows)
        self.live.write(self.table, rows)

    def __getattr__(self, name):
        return getattr(self.log, name)
