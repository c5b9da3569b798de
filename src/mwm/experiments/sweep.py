"""The learning-rate sweep (``config/sweep.yaml``): one rate for every assignment is one of the paper's stated
limitations; its ``sweep.*`` rules are in :mod:`mwm.paper`."""

from mwm.experiments import Experiment

EXPERIMENT = Experiment((), True, "the learning-rate sweep's figures, table and ledger rows from the grid's runs "
                        "(config/sweep.yaml)", "mwm.report.builders:sweep")
