"""The package's vocabulary: assignment names, their manifold table, variant names.

Torch-free (standard library only), so the Snakefile and ``rules/common.smk`` can
use it without importing torch (``tests/config/test_names.py`` checks). Every other module
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

# The optimizer's own vocabulary lives with it (torch-free); the package reads it from here.
from mwm.experiments import EXPERIMENTS
from mwm.optim.vocab import (ADAMW, ATTN_KEYS, MLP_KEYS, MSIGN_KEYS, MSIGN_STEPS, NAMED_ASSIGNMENTS, NORMALIZE_SCOPES,
                             PAPER_TRAIN, POLARS, PRECISIONS, RETRACTIONS, SOLVER_KEYS, SOLVERS)

#: What ``workflow.report`` may name: the experiments (:data:`mwm.experiments.EXPERIMENTS`).
REPORTS = tuple(EXPERIMENTS)

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
    "POLARS",
    "REPORTS",
    "SOLVERS",
    "NORMALIZE_SCOPES",
    "PRECISIONS",
    "MSIGN_STEPS",
    "SOLVER_KEYS",
    "MSIGN_KEYS",
    "PAPER_TRAIN",
    "COLNORM_SUFFIX",
    "STUDY_MANIFOLDS",
    "assignment_pair",
    "uses_dgram",
    "variant_name",
    "parse_variant",
    "is_colnorm",
]

#: Their short names (the ``matrix`` column of ``spectral.csv``): attention's and the MLP's.
ATTN_MATRICES = tuple(k.rsplit(".", 1)[1] for k in ATTN_KEYS)
MLP_MATRICES = tuple(k.rsplit(".", 1)[1] for k in MLP_KEYS)

#: The five assignments the paper trains (Table 3).
PAPER_ASSIGNMENTS = ("none", "stiefel", "dgram", "hetero", "hetero-inv")
#: Named assignments that constrain no matrix to a manifold.
UNCONSTRAINED = ("none", ADAMW)

#: Live loggers a config may choose (``workflow.loggers``, :mod:`mwm.train.live`; each writes the run's folder
#: of its own name), with the package each needs installed (checked before any job starts).
LOGGERS = {"tensorboard": "tensorboard", "dvclive": "dvclive"}
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
