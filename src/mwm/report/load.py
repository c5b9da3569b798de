"""Reading what the report is built from. A run or study result the config asks
for but that is missing is an error naming it, never a silently shorter table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mwm.plan.runs import FINAL_STATUSES, RUN_FILES, Plan

__all__ = ["ReportError", "RunData", "read_run", "read_grid", "load_runs", "spectra_steps", "load_spectrum"]


class ReportError(ValueError):
    """Missing or malformed results; the message names the file."""


@dataclass
class RunData:
    variant: str
    seed: int
    dir: Path
    summary: dict
    eval: pd.DataFrame
    spectral: pd.DataFrame
    attention: pd.DataFrame
    metrics: pd.DataFrame
    solver: pd.DataFrame


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except Exception as exc:  # pandas raises several types for a broken file
        raise ReportError(f"cannot read {path}: {exc}") from exc


#: Logs in which a step appears once (the others hold one row per step and matrix, layer or head).
ONE_ROW_PER_STEP = ("metrics.csv", "eval.csv")


def _read_log(path: Path) -> pd.DataFrame:
    """A run's CSV log, whole: every line ends, has the header's fields and an integer step, and no row
    is there twice (in metrics.csv and eval.csv, no step). A log cut short or written twice would
    otherwise pass into a figure; the error names the file and the line."""
    text = path.read_text(errors="replace")
    if text and not text.endswith("\n"):
        raise ReportError(f"{path}: line {text.count(chr(10)) + 1} is cut short (the file ends inside it); "
                          "rerun the run")
    lines = text.splitlines()
    header = lines[0].split(",") if lines else []
    step_at = header.index("step") if "step" in header else None
    seen_rows: dict[str, int] = {}
    seen_steps: dict[str, int] = {}
    for i, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        if len(fields) != len(header):
            raise ReportError(f"{path}: line {i} has {len(fields)} fields, the header {len(header)}; rerun the run")
        if step_at is not None and not fields[step_at].isdigit():
            raise ReportError(f"{path}: line {i} has step {fields[step_at]!r}, not a step number; rerun the run")
        if line in seen_rows:
            raise ReportError(f"{path}: line {i} repeats line {seen_rows[line]}; rerun the run")
        seen_rows[line] = i
        if step_at is not None and path.name in ONE_ROW_PER_STEP:
            if fields[step_at] in seen_steps:
                raise ReportError(f"{path}: line {i} is a second row of step {fields[step_at]} (first on line "
                                  f"{seen_steps[fields[step_at]]}); rerun the run")
            seen_steps[fields[step_at]] = i
    return _read_csv(path)


def read_run(d: Path, variant: str, seed: int) -> RunData:
    """The files of the finished run in folder ``d`` (nothing checked but that ``summary.json`` is JSON)."""
    try:
        summary = json.loads((d / "summary.json").read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{d / 'summary.json'} is not valid JSON: {exc}") from exc
    return RunData(variant, seed, d, summary, _read_log(d / "eval.csv"), _read_log(d / "spectral.csv"),
                   _read_log(d / "attention.csv"), _read_log(d / "metrics.csv"), _read_log(d / "solver.csv"))


def read_grid(plan: Plan) -> tuple[dict[tuple[str, int], RunData], list[str]]:
    """Every finished run of ``plan``'s grid as it is on disk (nothing checked), and one line per run whose
    files are missing."""
    runs, missing = {}, []
    for variant in plan.variants:
        for seed in plan.seeds:
            d = plan.run(variant, seed).dir
            absent = [f for f in RUN_FILES if not (d / f).exists()]
            if absent:
                missing.append(f"{d} (missing {', '.join(absent)})")
            else:
                runs[variant, seed] = read_run(d, variant, seed)
    return runs, missing


def load_runs(cfg: dict, root: str | Path = "results") -> dict[tuple[str, int], RunData]:
    """Every (variant, seed) of the config's grid."""
    foreign = []
    plan = Plan(cfg, root)
    runs, missing = read_grid(plan)
    for (variant, seed), run in runs.items():
        check_backed(run)
        problem = plan.problem(run.summary, variant, seed)
        if problem:
            foreign.append(f"{run.dir / 'summary.json'}: {problem}")
    if missing:
        raise ReportError("training runs missing for the report:\n  " + "\n  ".join(missing))
    if foreign:
        raise ReportError(
            f"training runs that are not config {cfg['name']!r}'s own (a hand run with overrides, an edited "
            "config whose runs were not retrained, or a copy); the report would show them as the config's:\n  "
            + "\n  ".join(foreign)
            + "\nRun the workflow (snakemake ... all): it moves such runs to results/hand/foreign/ and retrains "
              "them from the config; or restore the config they were trained with")
    return runs




def check_backed(run: RunData) -> None:
    """A summary must be backed by its logs: a finished status, one metrics row per step
    done (0 .. steps_done-1) and no evaluation past it. An interrupted rerun of an old
    run could otherwise show the old result over logs that restart at step 0."""
    path = run.dir / "summary.json"
    status = run.summary.get("status")
    if status not in FINAL_STATUSES:
        raise ReportError(f"{path}: status {status!r} is not a finished run ({', '.join(FINAL_STATUSES)}); "
                          f"rerun it")
    steps = run.summary.get("steps_done")
    logged = sorted(run.metrics["step"].astype(int)) if "step" in run.metrics else []
    if not isinstance(steps, int) or logged != list(range(steps)):
        last = logged[-1] if logged else None
        raise ReportError(f"{path} says steps_done={steps}, but {run.dir / 'metrics.csv'} holds {len(logged)} "
                          f"step rows (last step {last}): the logs do not back the summary (an interrupted "
                          f"rerun?); rerun the run")
    if "step" in run.eval and len(run.eval) and int(run.eval["step"].max()) > steps:
        raise ReportError(f"{run.dir / 'eval.csv'} holds an evaluation at step {int(run.eval['step'].max())}, "
                          f"past the summary's steps_done={steps}; rerun the run")


def spectra_steps(run: RunData) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run.dir / "spectra").glob("step_*.npz"))


def load_spectrum(run: RunData, step: int, key: str) -> np.ndarray:
    path = run.dir / "spectra" / f"step_{step:06d}.npz"
    try:
        with np.load(path) as z:
            return z[f"sv/{key}"]
    except (OSError, KeyError) as exc:
        raise ReportError(f"{path}: no singular values for {key}") from exc
