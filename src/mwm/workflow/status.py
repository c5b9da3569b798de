"""Where is my run? One table of every training run of a config, plus its studies and report.

    python -m mwm.workflow.status [--config config/paper.yaml] [--results results] [--figures paper_figures]

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

Under the tables: the wall and CPU time of every finished job, summed per stage, from
Snakemake's benchmark files (``logs/<config>/benchmarks/<stage>/*.tsv``, one per job; the wall
time is exact, the CPU time a lower bound, since Snakemake samples it every 30 s), and one ETA
line for the whole DAG (:func:`dag_eta`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mwm.config import ConfigError, load_config
from mwm.plan.runs import FIGURES_ROOT, Plan, config_dir, identity_checkable, identity_problem
from mwm.workflow.stages import REPORT_INPUTS, STAGES as STAGE_FILES, STUDIES

__all__ = ["RunStatus", "run_status", "collect", "format_table", "read_benchmarks", "stage_times", "dag_eta", "main"]

#: Files whose presence marks a study as done (what each study writes last).
STUDY_MARKERS = {name: STAGE_FILES[name].file("derived") for name in STUDIES}
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
    plan = Plan(cfg, results)
    if not plan.trains:  # nothing beyond the solver study's captures
        return out
    for run in plan.runs():
        variant, seed = run.variant, run.seed
        expected = plan.identity(variant, seed)
        status, f = run_status(run.dir, run.ckpt_dir, expected["train"]["max_iters"], now, expected)
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
    studies = config_dir("studies", cfg["name"], results)
    made = REPORT_INPUTS[cfg["workflow"]["report"]][0]  # the studies this config's report reads
    for name, marker in STUDY_MARKERS.items():
        if name not in made:
            continue
        p = studies / marker
        rows.append([f"study {name}", "completed" if p.exists() else "pending", str(p),
                     f"{_duration(now - p.stat().st_mtime)} ago" if p.exists() else "-"])
    report = config_dir("figures", cfg["name"], figures_root=figures)
    for what, p in (("report", report / "ledger.md"), ("html report", report / "report.html")):
        rows.append([what, "completed" if p.exists() else "pending", str(p),
                     f"{_duration(now - p.stat().st_mtime)} ago" if p.exists() else "-"])
    return rows


#: The stages of the DAG, in its order (the folders of logs/<config>/benchmarks/, named by
#: rules/common.smk's ``bench``); the studies are ``study_<name>`` of :data:`STUDY_MARKERS`.
STAGES = ("data", *(f"study_{name}" for name in STUDY_MARKERS), "train", "report")


def read_benchmarks(logs: Path) -> dict[str, dict[str, dict]]:
    """``{stage: {job: {"s": wall seconds, "cpu_time": CPU seconds, "max_rss": peak MB}}}`` from Snakemake's
    benchmark TSVs under ``logs/benchmarks/`` (a job benchmarked over repeats: their mean; an
    unreadable or partial file is skipped: the job is still being written or was cut)."""
    out: dict[str, dict[str, dict]] = {}
    root = logs / "benchmarks"
    for path in sorted(root.glob("*/**/*.tsv")):
        try:
            rows = list(csv.DictReader(io.StringIO(path.read_text()), delimiter="\t"))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        vals = [(_float(r.get("s")), _float(r.get("cpu_time")), _float(r.get("max_rss"))) for r in rows]
        vals = [v for v in vals if v[0] is not None]
        if not vals:
            continue
        stage = path.relative_to(root).parts[0]
        job = path.relative_to(root / stage).with_suffix("").as_posix()
        cpus = [c for _, c, _ in vals if c is not None]
        rss = [m for _, _, m in vals if m is not None]
        out.setdefault(stage, {})[job] = {"s": sum(v[0] for v in vals) / len(vals),
                                          "cpu_time": sum(cpus) / len(cpus) if cpus else None,
                                          "max_rss": max(rss) if rss else None}
    return out


def stage_times(bench: dict[str, dict[str, dict]]) -> list[list[str]]:
    """Rows (stage, jobs, wall, CPU, wall share) of the finished jobs, in DAG order, and a total.
    The share is of the jobs' wall time, which Snakemake measures exactly (its CPU time is sampled)."""
    order = [s for s in STAGES if s in bench] + sorted(set(bench) - set(STAGES))
    cpu = {s: sum(j["cpu_time"] or 0.0 for j in bench[s].values()) for s in order}
    wall = {s: sum(j["s"] for j in bench[s].values()) for s in order}
    total_wall = sum(wall.values())
    rows = []
    for s in order:
        rows.append([s, str(len(bench[s])), _duration(wall[s]), _duration(cpu[s]),
                     f"{100 * wall[s] / total_wall:.0f}%" if total_wall > 0 else "-"])
    if rows:
        rows.append(["total", str(sum(len(bench[s]) for s in order)), _duration(total_wall),
                     _duration(sum(cpu.values())), "100%" if total_wall > 0 else "-"])
    return rows


def dag_eta(runs: list[RunStatus], product_rows: list[list[str]], bench: dict[str, dict[str, dict]],
            jobs: int | None = None) -> tuple[float | None, str]:
    """(seconds until the DAG is done, or None if no estimate; how it was estimated).

    The running runs' own ETAs plus, for each job not finished, its stage's benchmarked mean
    wall time; training jobs with no benchmark yet use the runs' own ms/step (finished ones
    first) times their max_iters. Spread over ``jobs`` at once (default: the runs running now,
    at least one)."""
    mean = {s: sum(j["s"] for j in b.values()) / len(b) for s, b in bench.items() if b}
    running = [r for r in runs if r.status == "running"]
    pending = [r for r in runs if r.status in ("pending", "mismatch")]
    known_ms = [r.ms_per_step for r in runs if r.status in ("completed", "unstable") and r.ms_per_step] or \
        [r.ms_per_step for r in running if r.ms_per_step]
    left, unknown = 0.0, []
    for r in running:
        if r.eta_s is not None:
            left += r.eta_s
        else:
            unknown.append(f"{r.variant} seed{r.seed}")
    for r in pending:
        if "train" in mean:
            left += mean["train"]
        elif known_ms:
            left += r.max_iters * sum(known_ms) / len(known_ms) / 1000
        else:
            unknown.append(f"{r.variant} seed{r.seed}")
    for what, state, *_ in product_rows:
        stage = what.replace("study ", "study_") if what.startswith("study ") else what
        if state == "completed" or stage not in ("report",) + tuple(f"study_{n}" for n in STUDY_MARKERS):
            continue
        if stage in mean:
            left += mean[stage]
        else:
            unknown.append(stage)
    if not running and not pending and not unknown and left == 0.0:
        return 0.0, "nothing left"
    if unknown and left == 0.0:  # every job to come unknown: no estimate, not "0s"
        return None, f"no benchmark or ms/step yet for {', '.join(unknown[:6])}" + \
            (f" and {len(unknown) - 6} more" if len(unknown) > 6 else "")
    at_once = jobs or max(1, len(running))
    how = f"{len(running)} running, {len(pending)} training runs and the unfinished studies/report to come, " \
          f"{at_once} job(s) at once"
    if unknown:
        how += f"; not counted (no benchmark or ms/step yet): {', '.join(unknown[:6])}" + \
            (f" and {len(unknown) - 6} more" if len(unknown) > 6 else "")
    return left / at_once, how


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mwm.workflow.status",
                                description="status of every training run, study and report of a config "
                                            "(reads only the run folders)")
    p.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
    p.add_argument("--results", default="results", help="results folder (default: %(default)s)")
    p.add_argument("--figures", default=FIGURES_ROOT, help="report folder (default: %(default)s)")
    p.add_argument("--logs", default="logs", help="logs folder, with benchmarks/ per config (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=None,
                   help="jobs the DAG runs at once, for the ETA (default: the runs running now, at least 1)")
    a = p.parse_args(argv)
    if a.jobs is not None and a.jobs < 1:
        print(f"error: --jobs must be at least 1, got {a.jobs}", file=sys.stderr)
        return 2
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
    found = config_dir("runs", cfg["name"], a.results)
    if not found.is_dir():  # run from another folder, or before any run: say so, not just "pending"
        print(f"no results found: {found} does not exist here ({Path.cwd()}); run from the repository root "
              "or pass --results")
    print(format_table(runs))
    for r in runs:
        if r.note:
            print(f"  {r.variant} seed{r.seed}: {r.note}")
    print()
    prods = products(cfg, Path(a.results), Path(a.figures), now)
    print(_table(["product", "status", "file", "updated"], prods))
    bench = read_benchmarks(Path(a.logs) / cfg["name"])
    print()
    if bench:
        print("finished jobs per stage (Snakemake benchmarks, " + str(Path(a.logs) / cfg["name"] / "benchmarks") + "):")
        print(_table(["stage", "jobs", "wall", "CPU (sampled)", "wall share"], stage_times(bench)))
        print("  CPU (sampled): Snakemake reads a job's CPU time every 30 s, so this misses up to 30 s a job "
              "(a lower bound); time the whole DAG with /usr/bin/time -v for its total")
    else:
        print(f"no Snakemake benchmarks yet under {Path(a.logs) / cfg['name'] / 'benchmarks'}")
    eta, how = dag_eta(runs, prods, bench, a.jobs)
    print(f"ETA for the whole DAG: {'unknown' if eta is None else _duration(eta)} ({how})")
    return 0


def _main_to_pipe(argv: list[str] | None = None) -> int:
    """:func:`main`, quiet when its reader goes away (``mwm.workflow.status | head``)."""
    try:
        return main(argv)
    except BrokenPipeError:
        sys.stderr.close()  # nothing more can be said; keep Python's exit from printing a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(_main_to_pipe())
