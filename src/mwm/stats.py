"""Exact small-sample statistics for the pre-registered experiments' rules (:mod:`mwm.paper`): the
binomial tails, the Clopper-Pearson interval of a share, its dual exact test, and Holm's step-down
over a family of tests. Standard library only."""

from __future__ import annotations

import math
from typing import Mapping

__all__ = ["clopper_pearson", "binomial_p", "holm", "holm_adjusted"]


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) under Binomial(n, p), summed exactly term by term."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, math.fsum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1)))


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) under Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, math.fsum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def _check_kn(k: int, n: int) -> None:
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"binomial count k={k} of n={n}: needs n >= 1 and 0 <= k <= n")


def _bisect(f, target: float) -> float:
    """The p in [0, 1] where the increasing ``f`` crosses ``target``."""
    a, b = 0.0, 1.0
    for _ in range(200):
        m = (a + b) / 2
        if f(m) < target:
            a = m
        else:
            b = m
        if b - a < 1e-15:
            break
    return (a + b) / 2


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact two-sided Clopper-Pearson interval of a binomial share ``k / n``: ``lo`` solves
    P(X >= k | lo) = (1 - level) / 2 (0 when k = 0), ``hi`` solves P(X <= k | hi) = (1 - level) / 2 (1 when
    k = n). Exact, so its coverage is at least ``level`` at every n, small ones included."""
    _check_kn(k, n)
    if not 0 < level < 1:
        raise ValueError(f"level {level} outside (0, 1)")
    tail = (1 - level) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: _binom_sf(k, n, p), tail)
    hi = 1.0 if k == n else _bisect(lambda p: -_binom_cdf(k, n, p), -tail)
    return lo, hi


def binomial_p(k: int, n: int, p0: float = 0.5) -> float:
    """The exact two-sided p-value of ``k`` of ``n`` under Binomial(n, p0): twice the smaller tail, at most 1.
    Dual to :func:`clopper_pearson`: p < alpha iff the (1 - alpha) interval excludes ``p0``."""
    _check_kn(k, n)
    if not 0 <= p0 <= 1:
        raise ValueError(f"p0 {p0} outside [0, 1]")
    return min(1.0, 2 * min(_binom_sf(k, n, p0), _binom_cdf(k, n, p0)))


def holm(pvalues: Mapping[str, float], alpha: float = 0.05) -> dict[str, bool]:
    """Holm's step-down: which hypotheses are rejected at family-wise error ``alpha``. The i-th smallest of m
    p-values is rejected iff it and every smaller one is <= alpha / (m - i + 1)."""
    for key, p in pvalues.items():
        if not 0 <= p <= 1:
            raise ValueError(f"p-value of {key!r} is {p}, outside [0, 1]")
    order = sorted(pvalues, key=lambda key: pvalues[key])
    out = {key: False for key in pvalues}
    for i, key in enumerate(order):
        if pvalues[key] > alpha / (len(order) - i):
            break
        out[key] = True
    return out


def holm_adjusted(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values: :func:`holm` rejects a hypothesis at alpha iff its adjusted value is <= alpha."""
    order = sorted(pvalues, key=lambda key: pvalues[key])
    out, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[key]))
        out[key] = running
    return out
