"""The experiments a config can run, one table: what ``workflow.report`` names. Each entry says which
studies its report reads and whether it reads (and so trains) the grid's runs; the schema's vocabulary
of ``workflow.report``, the stage manifest's report inputs, the plan and the report's entry point all
read it here (standard library only: the config's schema loads it).

Adding an experiment is an entry here, its report (a builder in ``mwm.report.__main__.BUILDERS``, which
a test holds to this table), its claims in :mod:`mwm.paper` and its config.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Experiment", "EXPERIMENTS", "STUDY_NAMES"]

#: The numerical studies, in the stage manifest's order (:data:`mwm.workflow.stages.STUDIES` holds to it).
STUDY_NAMES = ("alpha", "absorption", "audits", "solvers")


@dataclass(frozen=True)
class Experiment:
    """``studies``: the studies its report reads; ``reads_runs``: whether it reads the grid's runs (a report
    that does not trains none of them, only what its studies capture); ``about``: one line for the docs."""

    studies: tuple[str, ...]
    reads_runs: bool
    about: str


EXPERIMENTS: dict[str, Experiment] = {
    "full": Experiment(STUDY_NAMES, True, "the paper: every run, study, table, figure and the ledger"),
    "solvers": Experiment(("solvers",), False, "the solver study's Pareto figure and table alone, from its own "
                          "short capture trainings (config/widths.yaml)"),
    "sweep": Experiment((), True, "the learning-rate sweep's figures, table and ledger rows from the grid's runs "
                        "(config/sweep.yaml)"),
    "mechanism": Experiment(("solvers",), True, "the causal experiment's arms, contrasts and ledger rows, with the "
                            "solver study on a run's captured pairs (config/mechanism.yaml)"),
    "mechanism2": Experiment((), True, "the second causal experiment: each DGram-attention baseline judged on its "
                             "own, with manipulation checks (config/mechanism2.yaml)"),
    "mechanism3": Experiment((), True, "its third round: one rate where the baselines fail, a solver arm that "
                             "passes its check, the solver check per module kind (config/mechanism3.yaml)"),
}
