"""The package's vocabulary: assignment names, their manifold table, variant names.

Torch-free (standard library only), so the Snakefile and ``rules/common.smk`` can
use it without importing torch (``tests/test_names.py`` checks). Every other module
takes these names from here instead of spelling them again.

Named assignments (Table 3 of the paper, plus two extras):

============  ==========  ========
name          attention   MLP
============  ==========  ========
none          none        none       (plain Muon everywhere)
stiefel       stiefel     stiefel
dgram         dgram       dgram
hetero        stiefel     dgram
hetero-inv    dgram       stiefel
oblique       oblique     oblique
adamw         --          --         (AdamW on every parameter)
============  ==========  ========

A training *variant* is the assignment name, suffixed ``-colnorm`` when a
DGram-using assignment trains with the column-norm retraction (the retraction
ablation): :func:`variant_name` builds it, :func:`parse_variant` takes it apart.
The studies name their manifold variants the same way (:data:`STUDY_MANIFOLDS`).
"""

from __future__ import annotations

from typing import Mapping

__all__ = [
    "ATTN_KEYS",
    "MLP_KEYS",
    "ATTN_MATRICES",
    "MLP_MATRICES",
    "ADAMW",
    "NAMED_ASSIGNMENTS",
    "PAPER_ASSIGNMENTS",
    "UNCONSTRAINED",
    "RETRACTIONS",
    "SOLVERS",
    "NORMALIZE_SCOPES",
    "PRECISIONS",
    "MSIGN_STEPS",
    "COLNORM_SUFFIX",
    "STUDY_MANIFOLDS",
    "assignment_pair",
    "uses_dgram",
    "variant_name",
    "parse_variant",
    "is_colnorm",
]

#: Name fragments of the hidden matrices (the 2-D weights that go to Muon).
ATTN_KEYS = ("attn.c_attn", "attn.c_proj")
MLP_KEYS = ("mlp.c_fc", "mlp.c_proj")
#: Their short names (the ``matrix`` column of ``spectral.csv``): attention's and the MLP's.
ATTN_MATRICES = tuple(k.rsplit(".", 1)[1] for k in ATTN_KEYS)
MLP_MATRICES = tuple(k.rsplit(".", 1)[1] for k in MLP_KEYS)

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
#: The five assignments the paper trains (Table 3).
PAPER_ASSIGNMENTS = ("none", "stiefel", "dgram", "hetero", "hetero-inv")
#: Named assignments that constrain no matrix to a manifold.
UNCONSTRAINED = ("none", ADAMW)

#: DGram retractions: the paper's, and the column-norm one of the ablation.
RETRACTIONS = ("paper", "colnorm")
#: Manifold Muon's inner solvers (:mod:`mwm.optim.solvers`): the paper's dual ascent, and ADMM.
SOLVERS = ("dual_ascent", "admm")
#: The train keys of the inner solve, per :class:`mwm.optim.solvers.SolverSettings` field (``steps``:
#: ``solver_max_steps`` when set, else the paper's ``dual_ascent_steps``): what a
#: ``grid.solver_comparison`` candidate may change.
SOLVER_KEYS: dict[str, tuple[str, ...]] = {
    "solver": ("solver",), "alpha": ("dual_ascent_alpha",), "steps": ("solver_max_steps", "dual_ascent_steps"),
    "tol": ("solver_tol",), "rho": ("admm_rho",), "warm_start": ("warm_start",), "normalize": ("solver_normalize",)}
#: The train keys of every msign of a step, per ``SolverSettings`` field.
MSIGN_KEYS: dict[str, tuple[str, ...]] = {"msign_steps": ("msign_steps",), "precision": ("msign_precision",)}
#: Which modules' inner solves ``train.solver_normalize`` scale-normalizes (:func:`mwm.optim.solvers.scaled_solve`):
#: module kind(s) per scope.
NORMALIZE_SCOPES: dict[str, tuple[str, ...]] = {"all": ("attn", "mlp"), "attn": ("attn",), "mlp": ("mlp",)}
#: Live loggers a config may choose (``workflow.loggers``, :mod:`mwm.train.live`; each writes the run's folder
#: of its own name), with the package each needs installed (checked before any job starts).
LOGGERS = {"tensorboard": "tensorboard", "dvclive": "dvclive"}
#: msign precisions (:mod:`mwm.optim.msign`): ``float32``, and ``bfloat16`` as the released code runs it.
PRECISIONS = ("float32", "bfloat16")
#: Polar Express steps of every msign in the Manifold Muon reference code (8 published triples, the
#: last repeated): :data:`mwm.optim.msign.DEFAULT_STEPS`, and the schema's ``train.msign_steps`` default
#: (``$default: MSIGN_STEPS``).
MSIGN_STEPS = 10
#: What a variant trained with the column-norm retraction appends to its assignment name.
COLNORM_SUFFIX = "-colnorm"

#: The studies' manifold variants: name -> (manifold, retraction); DGram comes with either retraction.
STUDY_MANIFOLDS: dict[str, tuple[str, str]] = {
    "stiefel": ("stiefel", "paper"),
    "dgram-paper": ("dgram", "paper"),
    "dgram" + COLNORM_SUFFIX: ("dgram", "colnorm"),
    "oblique": ("oblique", "paper"),
}


def assignment_pair(name: str) -> tuple[str, str] | None:
    """``(attention manifold, MLP manifold)`` of a named assignment (``None`` for ``adamw``);
    ``ValueError`` listing the choices for any other name."""
    try:
        return NAMED_ASSIGNMENTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown assignment {name!r}; choose one of {', '.join(NAMED_ASSIGNMENTS)}") from None


def uses_dgram(assignment: str, custom: Mapping[str, Mapping[str, str]] | None = None) -> bool:
    """Whether ``assignment`` (a named one, or a ``grid.custom`` pattern mapping) puts a matrix on DGram."""
    if custom and assignment in custom:
        return "dgram" in custom[assignment].values()
    pair = NAMED_ASSIGNMENTS.get(assignment)
    return pair is not None and "dgram" in pair


def variant_name(assignment: str, retraction: str = "paper", custom: Mapping | None = None) -> str:
    """The run variant of ``assignment`` trained with DGram ``retraction``: the assignment
    name, suffixed ``-colnorm`` for the column-norm retraction of a DGram-using assignment."""
    if retraction not in RETRACTIONS:
        raise ValueError(f"unknown DGram retraction {retraction!r}; choose one of {', '.join(RETRACTIONS)}")
    if retraction == "paper" or not uses_dgram(assignment, custom):
        return assignment
    return f"{assignment}-{retraction}"


def is_colnorm(variant: str) -> bool:
    """Whether ``variant`` is a column-norm retraction ablation variant."""
    return variant.endswith(COLNORM_SUFFIX)


def parse_variant(variant: str) -> tuple[str, str]:
    """Inverse of :func:`variant_name`: ``(assignment, retraction)``; ``ValueError`` for
    a name with no assignment before the suffix."""
    if not isinstance(variant, str) or variant in ("", COLNORM_SUFFIX):
        raise ValueError(f"not a variant name: {variant!r} (an assignment name, optionally suffixed "
                         f"{COLNORM_SUFFIX!r})")
    if is_colnorm(variant):
        return variant[: -len(COLNORM_SUFFIX)], "colnorm"
    return variant, "paper"
