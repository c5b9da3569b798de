"""Build every table and figure and the ledger for one config.

    python -m mwm.report --config config/config.yaml [--results results] [--out paper_figures/<name>]

Reads ``results/runs/<name>/...`` and ``results/studies/<name>/``; a run or
study result the config asks for that is missing is an error naming it. A config
with ``workflow.report: solvers`` gets the solver study's figure and table alone; one with
``workflow.report: sweep`` the learning-rate sweep's (:mod:`mwm.report.sweep`); one with
``workflow.report: mechanism`` the causal experiment's (:mod:`mwm.report.mechanism`) and the solver study
on the pairs one of its runs captured; one with ``workflow.report: mechanism2`` the second causal
experiment's, per baseline (:mod:`mwm.report.mechanism2`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from mwm.config import ConfigError, load_config
from mwm.errors import write_failure
from mwm.workflow.owner import check_owner
from mwm.plan.runs import check_grid, config_dir
from mwm.report.ledger import (build_ledger, build_mechanism2_ledger, build_mechanism_ledger, build_sweep_ledger,
                               write_ledger)
from mwm.report.load import ReportError, load_runs
from mwm.report.mechanism import mechanism_report
from mwm.report.mechanism2 import mechanism2_report
from mwm.report.solver_training import solver_training_report
from mwm.report.sweep import sweep_report
from mwm.report.studies import SOLVER_STUDY_FILES, load_studies, solver_study_report, studies_report
from mwm.report.training import training_report, write_run_metrics


def build(cfg: dict, results: Path, out: Path) -> Path:
    folder = config_dir("studies", cfg["name"], results)
    if cfg["workflow"]["report"] == "solvers":  # a config that measures the inner solvers alone
        solver_study_report(load_studies(folder, required=SOLVER_STUDY_FILES, cfg=cfg), out)
        return out
    runs = load_runs(cfg, results)
    out.mkdir(parents=True, exist_ok=True)
    write_run_metrics(runs, out)  # every report with runs: one file that `dvc exp show` compares
    if cfg["workflow"]["report"] == "sweep":  # a learning-rate sweep: its figures, tables and ledger rows
        write_ledger(build_sweep_ledger(cfg, sweep_report(cfg, runs, out)), out)
        return out
    if cfg["workflow"]["report"] == "mechanism":  # the causal experiment, and the solver study on its pairs
        write_ledger(build_mechanism_ledger(cfg, mechanism_report(cfg, runs, out)), out)
        solver_study_report(load_studies(folder, required=SOLVER_STUDY_FILES, cfg=cfg), out)
        return out
    if cfg["workflow"]["report"] == "mechanism2":  # the second causal experiment, from its runs alone
        write_ledger(build_mechanism2_ledger(cfg, mechanism2_report(cfg, runs, out)), out)
        return out
    studies = load_studies(folder, cfg=cfg)
    out.mkdir(parents=True, exist_ok=True)
    numbers = training_report(cfg, runs, out)
    studies_report(studies, out)
    solver_training_report(cfg, runs, studies, out)
    write_ledger(build_ledger(cfg, numbers["results"], runs, studies), out)
    return out


#: Files that mark a folder as a report's (what every kind of report writes).
REPORT_MARKS = ("ledger.csv", "metrics.json", "table_solvers.csv")


def build_whole(cfg: dict, results: Path, out: Path) -> Path:
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
        build(cfg, results, fresh)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    if out.exists():
        os.rename(out, old)
    os.rename(fresh, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default=None, help="default: paper_figures/<config name>")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
        check_grid(cfg["grid"])
        check_owner(args.results, cfg, args.config)  # a copied config keeping the name is refused
        out = Path(args.out) if args.out else config_dir("figures", cfg["name"])
        build_whole(cfg, Path(args.results), out)
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
