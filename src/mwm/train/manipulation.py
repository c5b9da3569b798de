"""Manipulation checks: did a run's intervention do what it claims?

An intervention arm of a mechanism experiment counts only where its run shows that the manipulation
took hold; elsewhere that cell is "not tested", never evidence against it. Both checks read the
run's own logs, at every evaluation from :data:`FROM_STEP` on (a run that stopped earlier: every
evaluation after step 0 it has; none at all: unknown, ``passed`` None):

``solver`` (``solver.csv``, :mod:`mwm.optim.quality`)
    the inner solve follows the momentum: over the run's Stiefel and DGram matrices of the checked
    modules (``train.solver_normalize``'s scope, else every module), the median alignment is at least
    :data:`ALIGNMENT_SHARE` of the converged solve's median on the same pairs, and the median tangent
    violation (at unit weight scale) at most :data:`VIOLATION_MAX`. The same is recorded per module kind
    (``per_kind``: attention and MLP apart, whose alignments differ, so a pooled median never hides a
    failing kind), with the largest duality gap of the converged reference on the checked rows.
``saturation`` (``attention.csv``, :mod:`mwm.train.diagnostics`)
    softmax is not saturated: every layer's attention entropy (mean over its heads) is at least
    :data:`ENTROPY_MIN` nats.

Every run records both in ``summary.json`` (``manipulation``); the mechanism report reads the one its
arm's intervention claims. Torch-free: plain rows in, plain values out.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence

from mwm.config.names import NORMALIZE_SCOPES

__all__ = ["FROM_STEP", "ALIGNMENT_SHARE", "VIOLATION_MAX", "ENTROPY_MIN", "solver_check", "saturation_check",
           "run_checks", "checked_modules"]

#: Evaluations from this step on are checked (the first ones measure a solve at the initial weights).
FROM_STEP = 50
#: The solve follows the momentum iff its median alignment is at least this share of the converged solve's.
ALIGNMENT_SHARE = 0.9
#: ... and its median tangent violation (at unit weight scale) is at most this.
VIOLATION_MAX = 0.02
#: Softmax is not saturated iff every layer's mean attention entropy is at least this (nats): the saturated
#: plain DGram-attention runs of config/mechanism.yaml sat at 0.01-0.04.
ENTROPY_MIN = 0.1


def checked_modules(train: Mapping) -> tuple[str, ...]:
    """The modules the solver check reads for a run of this ``train`` section."""
    scope = train.get("solver_normalize")
    return NORMALIZE_SCOPES[scope] if scope else ("attn", "mlp")


def _steps(rows: Sequence[Mapping]) -> list[int]:
    steps = sorted({int(float(r["step"])) for r in rows})
    late = [s for s in steps if s >= FROM_STEP]
    return late or [s for s in steps if s > 0]


def _number(x) -> float:
    v = float(x)
    return v if math.isfinite(v) else math.nan


def solver_check(rows: Iterable[Mapping], modules: Sequence[str] = ("attn", "mlp")) -> dict:
    """The solver check on ``solver.csv`` rows (dicts with step, module, alignment, alignment_converged,
    violation): ``passed`` (None without a checked evaluation), the evaluations checked, and the worst
    of them (lowest alignment share, highest violation), pooled over ``modules`` and ``per_kind``
    (each module kind of ``modules`` alone). A non-finite value fails its evaluation."""
    rows = [r for r in rows if r["module"] in modules]
    out = _solver_summary(rows, modules)
    out["per_kind"] = {m: _solver_summary([r for r in rows if r["module"] == m], (m,)) for m in modules}
    checked = set(_steps(rows))
    gaps = [abs(_number(r["gap_converged"])) for r in rows
            if "gap_converged" in r and int(float(r["step"])) in checked]
    worst = max(gaps, key=_nan_high) if gaps else None  # a NaN gap (no reference) is the worst: unknown
    out["reference_gap_max"] = worst if worst is not None and math.isfinite(worst) else None
    return out


def _solver_summary(rows: list, modules: Sequence[str]) -> dict:
    per_step = []
    for step in _steps(rows):
        at = [r for r in rows if int(float(r["step"])) == step]
        align = statistics.median(_number(r["alignment"]) for r in at)
        conv = statistics.median(_number(r["alignment_converged"]) for r in at)
        viol = statistics.median(_number(r["violation"]) for r in at)
        share = align / conv if conv > 0 else math.nan
        ok = share >= ALIGNMENT_SHARE and viol <= VIOLATION_MAX  # NaN compares False: fails
        per_step.append({"step": step, "alignment_share": share, "violation": viol, "passed": bool(ok)})
    return _summary("solver", per_step, {"modules": list(modules),
                                          "alignment_share_min": min((p["alignment_share"] for p in per_step),
                                                                     default=None, key=_nan_low),
                                          "violation_max": max((p["violation"] for p in per_step), default=None,
                                                               key=_nan_high)})


def saturation_check(rows: Iterable[Mapping]) -> dict:
    """The saturation check on ``attention.csv`` rows (dicts with step, layer, entropy_mean): ``passed``
    (None without a checked evaluation), the evaluations checked and the lowest layer entropy among them."""
    rows = list(rows)
    per_step = []
    for step in _steps(rows):
        layers: dict[int, list[float]] = {}
        for r in rows:
            if int(float(r["step"])) == step:
                layers.setdefault(int(float(r["layer"])), []).append(_number(r["entropy_mean"]))
        low = min(statistics.fmean(v) for v in layers.values())
        per_step.append({"step": step, "entropy_min": low, "passed": bool(low >= ENTROPY_MIN)})
    return _summary("saturation", per_step, {"entropy_min": min((p["entropy_min"] for p in per_step),
                                                                default=None, key=_nan_low)})


def run_checks(train: Mapping, solver_rows: Iterable[Mapping], attention_rows: Iterable[Mapping]) -> dict:
    """Both checks of a run, as ``summary.json`` records them (no solver rows: a run without constrained
    matrices, whose solver check is unknown)."""
    return {"solver": solver_check(solver_rows, checked_modules(train)), "saturation": saturation_check(attention_rows)}


def _summary(kind: str, per_step: list[dict], extra: dict) -> dict:
    failed = [p["step"] for p in per_step if not p["passed"]]
    extra = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in extra.items()}
    return {"kind": kind, "passed": None if not per_step else not failed, "from_step": FROM_STEP,
            "evaluations": len(per_step), "failed_steps": failed, **extra}


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x
