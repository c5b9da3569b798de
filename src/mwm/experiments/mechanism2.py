"""Round 2 of the per-baseline mechanism experiment (``config/mechanism2.yaml``; its rules first landed in
98b3c03, before its config): each DGram-attention baseline judged on its own at two rates, with a fixed solve on
every matrix, one on attention only (secondary) and attention on unit queries and keys."""

from mwm.experiments import Experiment, MechRound

#: What each kind of arm does, as the rules say it.
ARMS = {"solver": "a fixed inner solve on every constrained matrix",
        "solver_attn": "a fixed inner solve on attention only",
        "saturation": "attention logits from unit-norm queries and keys at a fixed scale, weights and inner solve "
                      "untouched"}

ROUND = MechRound(
    prefix="mech2",
    rebuild="config/mechanism2.yaml (the second pre-registered mechanism experiment, 12 seeds per baseline)",
    rates=(2.56, 5.12), min_seeds=12, kinds=("solver", "solver_attn", "saturation"),
    primary=("solver", "saturation"), per_kind_check=False, arms=ARMS)

EXPERIMENT = Experiment((), True, "the second causal experiment: each DGram-attention baseline judged on its own, "
                        "with manipulation checks (config/mechanism2.yaml)", "mwm.report.builders:mechanism_round",
                        ROUND)
