"""The first pre-registered causal experiment (``config/mechanism.yaml``): capping attention's singular values
against the scale-normalized solve, with an MLP-cap control; its ``mech.*`` rules are in :mod:`mwm.paper`, and
the solver study runs on the pairs one of its runs captured."""

from mwm.experiments import Experiment

EXPERIMENT = Experiment(("solvers",), True, "the causal experiment's arms, contrasts and ledger rows, with the "
                        "solver study on a run's captured pairs (config/mechanism.yaml)",
                        "mwm.report.builders:mechanism")
