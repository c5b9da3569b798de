"""Where is my run? One table of every training run of a config, plus its studies and report.

    python -m mwm.status [--config config/paper.yaml] [--results results] [--figures paper_figures]

Reads only the run folders (``results/runs/<config>/<variant>/seed<S>/``, the checkpoint's
copy of the logs under ``results/checkpoints/``, ``results/studies/<config>/`` and
``paper_figures/<config>/``), so it works on a cluster's shared filesystem while jobs run.
A run is

- ``completed`` / ``unstable`` / ``failed``: its ``summary.json`` says so (written at the end);
- ``running``: logs but no summary yet (``updated`` tells how long ago it last wrote: a job
  killed without a checkpoint stays ``running`` until Snakemake retries or gives up);
- ``pending``: nothing yet, or only a checkpoint (a preempted job waiting for its retry:
  the step is where it resumes);
- ``mismatch``: a summary whose recorded settings are not the config's own for that run (a
  hand run with overrides, an edited config not yet retrained); the lines under the table
  name the keys that differ. The report refuses such runs.

A run's step count is out of the ``max_iters`` it ran with (its summary's), and a config whose
report is the solver study alone (``workflow.report: solvers``) lists no training runs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, load_config
from .runs import checkpoint_dir, expected_identity, grid_variants, identity_checkable, identity_problem, run_dir

__all__ = ["RunStatus", "run_status", "collect", "format_table", "main"]

#: Files whose presence marks a study as done (what each study writes last).
STUDY_MARKERS = {"alpha": "alpha_derived.json", "absorption": "absorption_derived.json", "audits": "audits.json",
                 "solvers": "solvers_derived.json"}
#: Steps averaged for ms/step (the most recent ones).
RECENT = 50


@dataclass
class RunStatus:
    variant: str
    seed: int
    status: str
    step: int | None
    max_iters: int
    val_loss: float | None
    ms_per_step: float | None
    onset: int | None
    updated: float | None  # seconds since the run last wrote a log
    note: str | None = None  # why a run is a mismatch

    @property
    def eta_s(self) -> float | None:
        if self.status not in ("running", "pending") or self.ms_per_step is None or self.step is None:
            return None
        return max(self.max_iters - self.step, 0) * self.ms_per_step / 1000


def _tail_rows(path: Path, max_bytes: int = 1 << 16) -> list[dict]:
    """The last complete rows of a CSV log that may be growing (an unterminated last line is
    ignored), reading at most ``max_bytes`` from its end."""
    try:
        with open(path, "rb") as fh:
            header = fh.readline().decode()
            size = fh.seek(0, 2)
            start = max(len(header), size - max_bytes)
            fh.seek(start)
            chunk = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    if start > len(header):
        chunk = chunk.split("\n", 1)[1] if "\n" in chunk else ""  # drop the partial first line
    if not chunk.endswith("\n"):
        chunk = chunk.rsplit("\n", 1)[0] + "\n" if "\n" in chunk else ""
    rows = list(csv.DictReader(io.StringIO(header + chunk)))
    return [r for r in rows if None not in r.values()]


def _float(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def run_status(folder: Path, ckpt_folder: Path, max_iters: int, now: float | None = None,
               expected: dict | None = None) -> tuple[str, dict]:
    """(status, fields) of one run folder; ``expected``: the config's identity of the run
    (a summary that does not match it is a ``mismatch``)."""
    now = time.time() if now is None else now
    summary_path = folder / "summary.json"
    logs = folder if (folder / "metrics.csv").exists() else ckpt_folder / "logs"
    metrics = _tail_rows(logs / "metrics.csv")
    evals = _tail_rows(logs / "eval.csv")
    times = [_float(r.get("step_time")) for r in metrics[-RECENT:]]
    times = [t for t in times if t is not None]
    fields = {
        "step": int(float(metrics[-1]["step"])) + 1 if metrics else None,
        "val_loss": _float(evals[-1].get("val_loss")) if evals else None,
        "ms_per_step": 1000 * sum(times) / len(times) if times else None,
        "onset": None,
        "updated": None,
        "max_iters": max_iters,
    }
    written = [p.stat().st_mtime for p in (logs / "metrics.csv", logs / "eval.csv") if p.exists()]
    if written:
        fields["updated"] = max(now - max(written), 0.0)
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return "failed", {**fields, "note": f"unreadable summary.json: {exc}"}
        fields.update(step=summary.get("steps_done", fields["step"]), onset=summary.get("onset_step"))
        if isinstance(summary.get("max_iters"), int):
            fields["max_iters"] = summary["max_iters"]
        if summary.get("final_val_loss") is not None:
            fields["val_loss"] = _float(summary["final_val_loss"])
        if summary.get("mean_step_time") is not None:
            fields["ms_per_step"] = 1000 * summary["mean_step_time"]
        status = str(summary.get("status", "failed"))
        if expected is not None and not identity_checkable(summary):
            fields["note"] = "its summary records no identity or config_hash: it cannot be checked against the config"
        elif expected is not None:
            problem = identity_problem(summary, expected)
            if problem:
                return "mismatch", {**fields, "note": f"{problem} (its summary: {status})"}
        return status, fields
    if (folder / "metrics.csv").exists():
        return "running", fields
    return "pending", fields


def collect(cfg: dict, results: Path, now: float | None = None) -> list[RunStatus]:
    out = []
    if cfg["workflow"]["report"] == "solvers":  # trains nothing beyond the solver study's captures
        return out
    for variant in grid_variants(cfg["grid"]):
        for seed in cfg["grid"]["seeds"]:
            expected = expected_identity(cfg, variant, seed)
            status, f = run_status(run_dir(results, cfg["name"], variant, seed),
                                   checkpoint_dir(results, cfg["name"], variant, seed),
                                   expected["train"]["max_iters"], now, expected)
            out.append(RunStatus(variant, seed, status, f["step"], f["max_iters"], f["val_loss"], f["ms_per_step"],
                                 f["onset"], f["updated"], f.get("note")))
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def format_table(runs: list[RunStatus]) -> str:
    header = ["variant", "seed", "status", "step", "val loss", "ms/step", "ETA", "onset", "updated"]
    rows = [[r.variant, r.seed, r.status,
             "-" if r.step is None else f"{r.step}/{r.max_iters}",
             "-" if r.val_loss is None else f"{r.val_loss:.4f}",
             "-" if r.ms_per_step is None else f"{r.ms_per_step:.1f}",
             _duration(r.eta_s),
             "-" if r.onset is None else r.onset,
             "-" if r.updated is None else f"{_duration(r.updated)} ago"] for r in runs]
    return _table(header, rows)


def products(cfg: dict, results: Path, figures: Path, now: float | None = None) -> list[list[str]]:
    """(what, status, where, updated) of the studies and the report."""
    now = time.time() if now is None else now
    rows = []
    studies = results / "studies" / cfg["name"]
    for name, marker in STUDY_MARKERS.items():
        p = studies / marker
        rows.append([f"study {name}", "completed" if p.exists() else "pending", str(p),
                     f"{_duration(now - p.stat().st_mtime)} ago" if p.exists() else "-"])
    report = figures / cfg["name"]
    for what, p in (("report", report / "ledger.md"), ("html report", report / "report.html")):
        rows.append([what, "completed" if p.exists() else "pending", str(p),
                     f"{_duration(now - p.stat().st_mtime)} ago" if p.exists() else "-"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mwm.status",
                                description="status of every training run, study and report of a config "
                                            "(reads only the run folders)")
    p.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
    p.add_argument("--results", default="results", help="results folder (default: %(default)s)")
    p.add_argument("--figures", default="paper_figures", help="report folder (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    now = time.time()
    runs = collect(cfg, Path(a.results), now)
    counts = {s: sum(r.status == s for r in runs) for s in dict.fromkeys(r.status for r in runs)}
    print(f"config {cfg['name']} ({a.config}): {len(runs)} runs, "
          + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(format_table(runs))
    for r in runs:
        if r.note:
            print(f"  {r.variant} seed{r.seed}: {r.note}")
    print()
    print(_table(["product", "status", "file", "updated"], products(cfg, Path(a.results), Path(a.figures), now)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
