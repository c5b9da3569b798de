"""What the optimizer knows without torch: its vocabulary, the paper's settings, and how
assignment patterns map onto the hidden matrices.

Standard library only, so :mod:`mwm.config.names` (read by the Snakefile) and the schema can
take these from here, and the optimizer's math imports nothing of the package outside
``mwm.optim``. The config passes its settings in as plain values; :data:`PAPER_TRAIN` holds
the values a config that leaves a key out gets (the schema's ``$default: PAPER_TRAIN.<key>``).
"""

from __future__ import annotations

import fnmatch
from typing import Mapping

__all__ = [
    "ATTN_KEYS",
    "MLP_KEYS",
    "ADAMW",
    "NAMED_ASSIGNMENTS",
    "RETRACTIONS",
    "POLARS",
    "SOLVERS",
    "PRECISIONS",
    "MSIGN_STEPS",
    "NORMALIZE_SCOPES",
    "SOLVER_KEYS",
    "MSIGN_KEYS",
    "PAPER_TRAIN",
    "match_patterns",
]

#: Name fragments of the hidden matrices (the 2-D weights that go to Muon).
ATTN_KEYS = ("attn.c_attn", "attn.c_proj")
MLP_KEYS = ("mlp.c_fc", "mlp.c_proj")

#: The assignment (and parameter target) that puts everything on AdamW.
ADAMW = "adamw"

#: name -> (attention manifold, MLP manifold); ``None`` means AdamW only.
NAMED_ASSIGNMENTS: dict[str, tuple[str, str] | None] = {
    "none": ("none", "none"),
    "stiefel": ("stiefel", "stiefel"),
    "dgram": ("dgram", "dgram"),
    "hetero": ("stiefel", "dgram"),
    "hetero-inv": ("dgram", "stiefel"),
    "oblique": ("oblique", "oblique"),
    ADAMW: None,
}

#: DGram retractions: the paper's, and the column-norm one of the ablation.
RETRACTIONS = ("paper", "colnorm")
#: How a DGram retraction forms its inverse square root of the Gram (:mod:`mwm.optim.manifolds`): one
#: float64 ``eigh`` per matrix (the default), or ``eigvalsh`` per matrix for the values and a batched
#: float64 Newton-Schulz iteration for the rest (matmuls only, one call per bank).
POLARS = ("eigh", "newton-schulz")
#: Manifold Muon's inner solvers (:mod:`mwm.optim.solvers`): the paper's dual ascent, and ADMM.
SOLVERS = ("dual_ascent", "admm")
#: msign precisions (:mod:`mwm.optim.msign`): ``float32``, and ``bfloat16`` as the released code runs it.
PRECISIONS = ("float32", "bfloat16")
#: Polar Express steps of every msign in the Manifold Muon reference code (8 published triples, the
#: last repeated).
MSIGN_STEPS = 10
#: Which modules' inner solves ``train.solver_normalize`` scale-normalizes (:func:`mwm.optim.solvers.scaled_solve`):
#: module kind(s) per scope.
NORMALIZE_SCOPES: dict[str, tuple[str, ...]] = {"all": ("attn", "mlp"), "attn": ("attn",), "mlp": ("mlp",)}

#: The train keys of the inner solve, per :class:`mwm.optim.solvers.SolverSettings` field (``steps``:
#: ``solver_max_steps`` when set, else the paper's ``dual_ascent_steps``): what a
#: ``grid.solver_comparison`` candidate may change.
SOLVER_KEYS: dict[str, tuple[str, ...]] = {
    "solver": ("solver",), "alpha": ("dual_ascent_alpha",), "steps": ("solver_max_steps", "dual_ascent_steps"),
    "tol": ("solver_tol",), "rho": ("admm_rho",), "warm_start": ("warm_start",), "normalize": ("solver_normalize",)}
#: The train keys of every msign of a step, per ``SolverSettings`` field.
MSIGN_KEYS: dict[str, tuple[str, ...]] = {"msign_steps": ("msign_steps",), "precision": ("msign_precision",)}

#: The optimizer's settings in the released train.py (the paper's), by ``train`` key: the schema's
#: defaults of these keys, and what ``SolverSettings.defaults()`` and ``OptimizerSettings.defaults()``
#: give. ``msign_precision`` is float32, the control, cheaper on CPU; paper.yaml sets the released bfloat16.
PAPER_TRAIN: dict[str, object] = {
    "learning_rate": 6.0e-4,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.95,
    "muon_lr": 0.02,
    "muon_momentum": 0.95,
    "dual_ascent_alpha": 0.1,
    "dual_ascent_steps": 20,
    "msign_steps": MSIGN_STEPS,
    "msign_precision": "float32",
    "solver": "dual_ascent",
    "warm_start": False,
    "solver_tol": None,
    "solver_max_steps": None,
    "admm_rho": 1.0,
    "dgram_retraction": "paper",
}


def match_patterns(hidden: list[str], patterns: Mapping[str, str]) -> dict[str, str]:
    """``{hidden matrix: manifold}`` of an ordered ``{glob: manifold}`` mapping (first match wins,
    unmatched matrices get ``none``); ValueError naming every pattern that matches no matrix
    (a pattern only ever shadowed by earlier ones included)."""
    out, used = {}, {pat: 0 for pat in patterns}
    for name in hidden:
        out[name] = "none"
        for pat, manifold in patterns.items():
            if fnmatch.fnmatchcase(name, pat):
                out[name] = manifold
                used[pat] += 1
                break
    unused = [pat for pat, k in used.items() if k == 0]
    if unused:
        sample = ", ".join(hidden[:4]) + (", ..." if len(hidden) > 4 else "")
        raise ValueError(
            f"assignment pattern(s) {unused} match no hidden matrix (names look like: {sample}); "
            "patterns are shell globs over full parameter names"
        )
    return out
