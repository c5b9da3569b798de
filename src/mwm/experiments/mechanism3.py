"""Round 3 of the per-baseline mechanism experiment (``config/mechanism3.yaml``): the one rate and the seed
count its pilot chose (docs/mechanism.md, "Round 3"), a solver arm that passes its check in attention and in the
MLP apart, and no attention-only arm."""

from mwm.experiments import Experiment, MechRound
from mwm.experiments.mechanism2 import ARMS as ROUND2_ARMS

ROUND = MechRound(
    prefix="mech3",
    rebuild="config/mechanism3.yaml (the third pre-registered mechanism experiment: one rate, 12 seeds per "
            "baseline, the solver check per module kind)",
    rates=(10.24,), min_seeds=12, kinds=("solver", "saturation"), primary=("solver", "saturation"),
    per_kind_check=True,
    arms={"solver": "the scale-normalized inner solve by ADMM (rho 1, 10 iterations) on every constrained matrix",
          "saturation": ROUND2_ARMS["saturation"]})

EXPERIMENT = Experiment((), True, "its third round: one rate where the baselines fail, a solver arm that passes "
                        "its check, the solver check per module kind (config/mechanism3.yaml)",
                        "mwm.report.builders:mechanism_round", ROUND)
