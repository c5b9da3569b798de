"""The paper (``config/config.yaml``, ``ci.yaml``, ``paper.yaml``, ``long.yaml``): every run, study, table and
figure, and the ledger of the paper's claims (:data:`mwm.paper.CLAIMS`)."""

from mwm.experiments import STUDY_NAMES, Experiment

EXPERIMENT = Experiment(STUDY_NAMES, True, "the paper: every run, study, table, figure and the ledger",
                        "mwm.report.builders:full")
