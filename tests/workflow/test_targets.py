"""mwm.workflow.targets: what the aggregate rules ask for, from the plan and the stage manifest."""

from mwm.config import load_config
from mwm.plan.runs import Plan
from mwm.workflow.stages import REPORT_INPUTS, study_files
from mwm.workflow.targets import Targets


def test_a_report_that_reads_runs_asks_for_them_and_its_studies(tiny_config):
    plan = Plan(load_config(tiny_config(grid__assignments=["none", "dgram"])), "out")
    t = Targets(plan)
    studies, reads = REPORT_INPUTS[plan.cfg["workflow"]["report"]]
    assert reads and t.report_studies == studies
    assert t.study_outputs("alpha") == [f"out/studies/tiny/{f}" for f in study_files(("alpha",))]
    assert t.report_inputs() == [*plan.records(), *t.study_outputs(*studies)]
    markers = ["out/runs/tiny/.retrain/none/seed0/1.json"]
    assert t.runs(markers)[:1] == markers and set(plan.records()) <= set(t.runs(markers))
    assert len(t.runs(markers)) == len(set(t.runs(markers)))  # no target twice
    assert t.all(markers) == [*markers, "paper_figures/tiny"]


def test_a_solver_only_report_reads_no_grid_run(tiny_config):
    plan = Plan(load_config(tiny_config(workflow__report="solvers")), "out")
    t = Targets(plan)
    assert not t.reads_runs and t.report_inputs() == t.study_outputs(*t.report_studies)
    assert t.runs([]) == plan.solver_sequences()
