"""The inner-solver study alone (``config/widths.yaml``): its Pareto figure and table, from its own short
capture trainings; no grid run is read."""

from mwm.experiments import Experiment

EXPERIMENT = Experiment(("solvers",), False, "the solver study's Pareto figure and table alone, from its own "
                        "short capture trainings (config/widths.yaml)", "mwm.report.builders:solvers")
