"""How each experiment (:data:`mwm.experiments.EXPERIMENTS`) builds its report: one function per kind of
report, named by the experiment's ``report``, each called with the config, its runs (None where the
experiment reads none), its studies' folder, the report's folder and the partial report's line (or None)."""

from __future__ import annotations

from pathlib import Path

from mwm.report.ledger import (build_ledger, build_mechanism2_ledger, build_mechanism_ledger, build_sweep_ledger,
                               write_ledger)
from mwm.report.mechanism import mechanism_report
from mwm.report.mechanism2 import mechanism2_report
from mwm.report.solver_training import solver_training_report
from mwm.report.studies import SOLVER_STUDY_FILES, load_studies, solver_study_report, studies_report
from mwm.report.sweep import sweep_report
from mwm.report.training import training_report

__all__ = ["full", "solvers", "sweep", "mechanism", "mechanism_round"]


def full(cfg: dict, runs, folder: Path, out: Path, incomplete: str | None) -> None:
    """The paper's report: every run, study, table and figure, and the ledger."""
    studies = load_studies(folder, cfg=cfg)
    numbers = training_report(cfg, runs, out)
    studies_report(studies, out)
    solver_training_report(cfg, runs, studies, out)
    write_ledger(build_ledger(cfg, numbers["results"], runs, studies), out, incomplete)


def solvers(cfg: dict, runs, folder: Path, out: Path, incomplete: str | None) -> None:
    """A config that measures the inner solvers alone: the solver study's figure and table."""
    solver_study_report(load_studies(folder, required=SOLVER_STUDY_FILES, cfg=cfg), out)


def sweep(cfg: dict, runs, folder: Path, out: Path, incomplete: str | None) -> None:
    """A learning-rate sweep: its figures, tables and ledger rows."""
    write_ledger(build_sweep_ledger(cfg, sweep_report(cfg, runs, out)), out, incomplete)


def mechanism(cfg: dict, runs, folder: Path, out: Path, incomplete: str | None) -> None:
    """The causal experiment, and the solver study on its pairs."""
    write_ledger(build_mechanism_ledger(cfg, mechanism_report(cfg, runs, out)), out, incomplete)
    solver_study_report(load_studies(folder, required=SOLVER_STUDY_FILES, cfg=cfg), out)


def mechanism_round(cfg: dict, runs, folder: Path, out: Path, incomplete: str | None) -> None:
    """A round of the per-baseline causal experiment (an experiment with a ``round``), from its runs."""
    write_ledger(build_mechanism2_ledger(cfg, mechanism2_report(cfg, runs, out)), out, incomplete)
