"""What the workflow's aggregate rules ask for, from the plan and the stage manifest: the studies'
files, the runs the report reads, the report's inputs and ``all`` (rules/common.smk, Snakefile)."""

from __future__ import annotations

from mwm.plan.runs import Plan
from mwm.workflow.stages import REPORT_INPUTS, study_files

__all__ = ["Targets"]


class Targets:
    """The targets of ``plan``'s config: its report (``workflow.report``) reads the studies
    ``report_studies`` and, when ``reads_runs``, the grid's runs."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.report_studies, self.reads_runs = REPORT_INPUTS[plan.cfg["workflow"]["report"]]

    def study_outputs(self, *names: str) -> list[str]:
        """The files the named studies write (the stage manifest), in the config's study folder."""
        return [f"{self.plan.folders['studies']}/{f}" for f in study_files(names)]

    def runs(self, foreign: list[str]) -> list[str]:
        """The runs the config makes: the foreign runs' markers, the runs its report reads, and the
        solver study's captures."""
        reads = self.plan.records() if self.reads_runs else []
        return list(dict.fromkeys([*foreign, *reads, *self.plan.solver_sequences()]))

    def report_inputs(self) -> list[str]:
        """What the report job reads: the runs (when it reads them) and its studies' files."""
        return [*(self.plan.records() if self.reads_runs else []), *self.study_outputs(*self.report_studies)]

    def all(self, foreign: list[str]) -> list[str]:
        """``all``: the foreign runs' markers and the figures folder (which needs everything else)."""
        return [*foreign, self.plan.folders["figures"]]
