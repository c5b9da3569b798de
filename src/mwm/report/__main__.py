"""Build every table and figure and the ledger for one config.

    python -m mwm.report --config config/config.yaml [--results results] [--out paper_figures/<name>]

Reads ``results/runs/<name>/...`` and ``results/studies/<name>/``; a run or
study result the config asks for that is missing is an error naming it. What the report holds is its
experiment's (``workflow.report``, a module of :mod:`mwm.experiments`): the function that module names
(:mod:`mwm.report.builders`) builds it.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
from pathlib import Path

from mwm.config import ConfigError, load_config
from mwm.errors import write_failure
from mwm.experiments import EXPERIMENTS
from mwm.paths import inside
from mwm.report import style
from mwm.workflow.owner import check_owner
from mwm.plan.runs import check_grid, config_dir
from mwm.report.load import ReportError, load_runs
from mwm.report.training import write_run_metrics


def build(cfg: dict, results: Path, out: Path, incomplete: str | None = None) -> Path:
    """Every table and figure and the ledger of ``cfg`` from ``results`` into ``out``; ``incomplete`` (a
    partial report): no ledger rule is applied, each row says so with that line."""
    experiment = EXPERIMENTS[cfg["workflow"]["report"]]
    folder = config_dir("studies", cfg["name"], results)
    runs = None
    if experiment.reads_runs:
        runs = load_runs(cfg, results)
        out.mkdir(parents=True, exist_ok=True)
        write_run_metrics(runs, out)  # every report with runs: one file that `dvc exp show` compares
    experiment.builder()(cfg, runs, folder, out, incomplete)
    return out


#: Files that mark a folder as a report's (what every kind of report writes).
REPORT_MARKS = ("ledger.csv", "metrics.json", "table_solvers.csv")


def build_whole(cfg: dict, results: Path, out: Path, incomplete: str | None = None) -> Path:
    """:func:`build` into a fresh folder beside ``out``, then put it in ``out``'s place: no figure of an
    earlier report (another setting, a variant the config no longer has) stays beside the new ones, as under
    Snakemake, which deletes the folder first. An ``out`` holding files that are not a report's is refused."""
    if out.is_dir() and any(out.iterdir()) and not any((out / m).is_file() for m in REPORT_MARKS):
        raise ReportError(f"--out {out} holds files that are not a report's ({next(out.iterdir()).name}, ...); the "
                          "report replaces its folder whole: give a new or empty folder")
    fresh, old = out.with_name(f".{out.name}.building"), out.with_name(f".{out.name}.replaced")
    for leftover in (fresh, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    try:
        build(cfg, results, fresh, incomplete)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    if out.exists():
        os.rename(out, old)
    os.rename(fresh, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def partial_view(cfg: dict, results: Path) -> tuple[dict, str]:
    """For a config whose grid is trained in part: the config cut to the seeds at which every variant has
    finished (the report draws whole seeds), and the line every page of its report carries."""
    from mwm.plan.runs import Plan
    from mwm.workflow.publish import finished_problem

    plan = Plan(cfg, results)
    done = {(v, s) for v in plan.variants for s in plan.seeds if finished_problem(plan, v, s) is None}
    seeds = [s for s in plan.seeds if all((v, s) in done for v in plan.variants)]
    total = len(plan.variants) * len(plan.seeds)
    if not seeds:
        raise ReportError(f"no seed of config {cfg['name']!r} has every variant finished ({len(done)} of {total} "
                          "runs are): a partial report draws whole seeds")
    if len(seeds) == len(plan.seeds):
        raise ReportError(f"every run of config {cfg['name']!r} is finished: run the report without --partial")
    view = copy.deepcopy(cfg)
    view["grid"]["seeds"] = seeds
    drawn = len(seeds) * len(plan.variants)
    return view, (f"PARTIAL: {drawn} of {total} runs (seeds {', '.join(map(str, seeds))} of "
                  f"{', '.join(map(str, plan.seeds))}); no verdict is drawn from part of the grid")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=None,
                    help="default: paper_figures/<config name> (with --partial: <results>/partial/<config name>)")
    ap.add_argument("--partial", action="store_true",
                    help="a grid trained in part (a long config run in slices): the seeds every variant has "
                         "finished, every figure and page stamped with how many runs it holds, and no ledger "
                         "verdict (each row: not judged: incomplete)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
        check_grid(cfg["grid"])
        check_owner(args.results, cfg, args.config)  # a copied config keeping the name is refused
        if not args.partial:
            out = Path(args.out) if args.out else config_dir("figures", cfg["name"])
            build_whole(cfg, Path(args.results), out)
        else:  # never in paper_figures/<name>/, whose every number comes from the whole grid
            view, stamp = partial_view(cfg, Path(args.results))
            out = Path(args.out) if args.out else inside(Path(args.results) / "partial", cfg["name"],
                                                         what="config name (in the partial reports)")
            style.STAMP = stamp
            try:
                build_whole(view, Path(args.results), out, incomplete=stamp)
            finally:
                style.STAMP = None
            print(stamp)
    except (ConfigError, ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or full paper_figures/: one line, not a traceback
        print(f"error: {write_failure(exc, 'the report')} (--out)", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
