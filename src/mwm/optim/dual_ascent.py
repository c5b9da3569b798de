"""Bernstein's dual ascent for the Manifold Muon inner problem, batched.

For a tall weight ``W`` (``m x n``) on a manifold with projector ``P`` and a
gradient (momentum) ``G`` it solves

    min_A tr(G^T A)   s.t.   ||A||_2 <= 1,   P(W^T A + A^T W) = 0

by ascent on the multiplier ``Lambda`` (``n x n``, symmetric)::

    Lambda_0 = -1/4 P(W^T G + G^T W)
    for t in 0..T-1:
        A_t     = msign(G + 2 W P(sym Lambda_t))
        H_t     = P(W^T A_t + A_t^T W)
        Lambda  = Lambda - alpha (1 - t/T) H_t

and the weight moves to ``retract(W - eta A)``.

Two evaluation orders give the same numbers (up to float32 rounding):

``direct``
    As the released code: msign on the ``m x n`` matrix at every iteration,
    except that ``A^T W`` is taken as the transpose of ``W^T A``.
``gram``
    Polar Express in the ``n x n`` Gram space: with ``K = W^T G``, ``C = G^T G``,
    ``D = W^T W`` and ``S = P(sym Lambda)``, the matrix ``M = G + 2 W S`` has
    ``M^T M = C + 2 (K^T S + S K) + 4 S D S`` and ``W^T M = K + 2 D S``. The first
    :data:`~mwm.optim.msign.GRAM_RESTART` steps run on that ``M^T M`` and give ``Q_1``;
    the iterate ``X = M Q_1`` is then formed once (the restart, see
    :data:`mwm.optim.msign.GRAM_RESTART`), the remaining steps
    run on ``X^T X`` and give ``Q_2``, and ``W^T A = (W^T M) Q_1 Q_2`` without
    ``A``. ``A = X Q_2`` itself is only formed at the end and at snapshots.

``method="auto"`` picks per shape (:func:`mwm.optim.msign.choose_order`). The Gram order forms ``M^T M``
from its expansion, which cancels catastrophically in float32 when ``M`` is tiny beside its terms: a
momentum almost entirely normal to the tangent space makes ``M_0`` such a matrix, and the iterate blows
up. A solve in the Gram order whose direction is not finite or not the size of an msign (sum of squared
singular values above twice their count) is done again in the direct order; a solve that was fine is
left bit for bit as it was.

``precision="bfloat16"`` runs msign as the released code (bfloat16 Polar
Express, emulated, see :mod:`mwm.optim.msign`) and everything else in float32, as
there; it uses the ``direct`` order (the Gram order has no released counterpart).
"""

from __future__ import annotations

import functools
from typing import Iterable

import torch

from mwm.optim.inner import (InnerResult, Tolerance, check_inputs, check_iterations, or_default, result,
                             start_multiplier, tall_pair)
from mwm.optim.manifolds import Manifold, get_manifold, rms
from mwm.optim.msign import (DEFAULT_STEPS, GRAM_RESTART, check_precision, choose_order, frobenius_scale, msign,
                    polar_express_gram)

__all__ = ["DualAscentResult", "MixedProjector", "as_manifold", "dual_ascent", "manifold_muon_update"]

METHODS = ("auto", "direct", "gram")


#: The result type every inner solver shares (:class:`mwm.optim.inner.InnerResult`).
DualAscentResult = InnerResult


class MixedProjector:
    """The projectors of a batch whose matrices lie on different manifolds (Stiefel:
    identity, DGram: off-diagonal part), applied in one pass with a per-matrix mask:
    one batched solve for a bank of equal shapes whatever each matrix's manifold."""

    def __init__(self, names: Iterable[str]):
        names = list(names)
        bad = sorted(set(names) - {"stiefel", "dgram"})
        if bad:
            raise ValueError(f"a mixed bank takes stiefel and dgram matrices only, got {bad}")
        self.names = names
        self._keep_cpu = torch.tensor([0.0 if n == "dgram" else 1.0 for n in names])
        self._keep: dict[tuple, torch.Tensor] = {}  # per (device, dtype): copied there once

    def keep(self, like: torch.Tensor) -> torch.Tensor:
        """The per-matrix diagonal factor (DGram 0, Stiefel 1) on ``like``'s device and dtype."""
        key = (like.device, like.dtype)
        if key not in self._keep:
            self._keep[key] = self._keep_cpu.to(device=like.device, dtype=like.dtype)
        return self._keep[key]

    def project_(self, S: torch.Tensor) -> torch.Tensor:
        if S.ndim != 3 or S.shape[0] != len(self.names):
            raise ValueError(f"mixed projector for {len(self.names)} matrices got shape {tuple(S.shape)}")
        S.diagonal(dim1=-2, dim2=-1).mul_(self.keep(S)[:, None])
        return S

    def project(self, S: torch.Tensor) -> torch.Tensor:
        return self.project_(S.clone())


def as_manifold(manifold) -> Manifold | MixedProjector:
    """A :class:`Manifold`, its name, or a sequence of per-matrix names (one batched
    solve over Stiefel and DGram matrices, see :class:`MixedProjector`)."""
    if isinstance(manifold, (Manifold, MixedProjector)):
        return manifold
    if isinstance(manifold, str):
        return get_manifold(manifold)
    names = tuple(manifold)
    if len(set(names)) == 1:
        return get_manifold(names[0])
    return _mixed(names)


@functools.lru_cache(maxsize=256)
def _mixed(names: tuple[str, ...]) -> MixedProjector:
    """One projector per bank layout, so its mask is copied to the device once per run."""
    return MixedProjector(names)


def _alpha_factor(alpha, W: torch.Tensor):
    """``alpha`` as used in the loop: the float itself, or a float64 tensor of shape
    ``(*batch, 1, 1)`` for a per-matrix step size (``alpha`` of shape ``(*batch,)``
    or any shape broadcastable to it)."""
    if not isinstance(alpha, torch.Tensor):
        return float(alpha)
    a = alpha.detach().to(device=W.device, dtype=torch.float64)
    if not bool(torch.isfinite(a).all()):
        raise ValueError("alpha has NaN or Inf entries")
    if a.ndim == 0:
        return a
    batch = tuple(W.shape[:-2])
    try:
        ok = torch.broadcast_shapes(tuple(a.shape), batch) == batch
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"tensor alpha of shape {tuple(a.shape)} does not broadcast to the batch shape {batch}")
    return a[..., None, None]


def _once(make):
    """``make`` as a function that calls it at most once and keeps its value."""
    kept = []

    def get():
        if not kept:
            kept.append(make())
        return kept[0]

    return get


def _direct_order(Wt: torch.Tensor, Gt: torch.Tensor, msign_steps: int, precision: str):
    """The ``direct`` order: ``step(S)`` forms ``A = msign(G + 2 W S)`` on the ``m x n``
    matrix and returns ``W^T A`` and ``A`` (the latter as a function, like the Gram order's)."""
    def step(S):
        A = msign(torch.add(Gt, Wt @ S, alpha=2.0), steps=msign_steps, method="direct", precision=precision)
        return Wt.mT @ A, lambda: A

    return step


def _gram_order(Wt: torch.Tensor, Gt: torch.Tensor, WtG: torch.Tensor, msign_steps: int):
    """The ``gram`` order (module doc): ``step(S)`` runs Polar Express on ``M^T M`` with
    ``M = G + 2 W S`` and returns ``W^T A`` and a function that forms ``A`` (once) on demand."""
    GtG = Gt.mT @ Gt
    WtW = Wt.mT @ Wt

    def step(S):
        DS = WtW @ S
        E = WtG.mT @ S  # K^T S; its transpose is S K
        MtM = GtG + 2.0 * (E + E.mT) + 4.0 * (S @ DS)
        scale = frobenius_scale(MtM.diagonal(dim1=-2, dim2=-1).sum(-1))[..., None, None]
        Q1 = polar_express_gram(MtM * scale.square(), steps=msign_steps, stop=GRAM_RESTART) * scale
        WtX = torch.add(WtG, DS, alpha=2.0) @ Q1
        X = torch.add(Gt, Wt @ S, alpha=2.0) @ Q1  # the restart: the iterate rebuilt from M
        if msign_steps <= GRAM_RESTART:
            return WtX, lambda: X
        Q2 = polar_express_gram(X.mT @ X, steps=msign_steps, start=GRAM_RESTART)
        return WtX @ Q2, _once(lambda: X @ Q2)

    return step


@torch.no_grad()
def dual_ascent(
    W: torch.Tensor,
    G: torch.Tensor,
    manifold: Manifold | str = "stiefel",
    alpha: float | None = None,
    steps: int | None = None,
    tol: float | None = None,
    record_violations: bool = False,
    snapshots: Iterable[int] = (),
    method: str = "auto",
    msign_steps: int = DEFAULT_STEPS,
    precision: str = "float32",
    Lambda0: torch.Tensor | None = None,
) -> DualAscentResult:
    """Run dual ascent on ``W``, ``G`` of shape ``(..., m, n)`` (tall or wide).

    ``manifold``: a :class:`~mwm.optim.manifolds.Manifold`, its name, or one name per
    matrix of a batch (Stiefel and DGram mixed in one solve).

    ``alpha`` is a float, or a tensor of shape ``(*batch,)`` (broadcastable to the
    batch) giving each matrix its own step size; the decayed step
    ``alpha (1 - t/steps)`` is formed in float64 and rounded to the work dtype, so
    a tensor entry gives the same step as the equal float.

    ``tol``: a matrix stops at the first iteration with ``||H||_RMS < tol`` (the
    direction of that iteration is returned, as the released code does, and its
    multiplier is frozen); the loop ends once every matrix has stopped. Each
    matrix's result is thus independent of the batch it is solved in.

    ``method``: the evaluation order, ``direct``, ``gram`` or ``auto`` (per shape,
    :func:`mwm.optim.msign.choose_order`).

    ``Lambda0``: warm start, a multiplier ``(*batch, n, n)`` in the tall orientation
    (e.g. the previous step's :attr:`DualAscentResult.Lambda`); it is projected onto
    the current constraint, ``P(sym Lambda0)``, and replaces the cold start
    ``-1/4 P(W^T G + G^T W)``.
    """
    check_inputs(W, G)
    alpha, steps = or_default(alpha, "dual_ascent_alpha"), or_default(steps, "dual_ascent_steps")
    snaps = check_iterations("dual ascent", steps, snapshots)
    if method not in METHODS:
        raise ValueError(f"unknown dual ascent method {method!r}; choose one of {', '.join(METHODS)}")
    mf = as_manifold(manifold)
    alpha_f = _alpha_factor(alpha, W)

    Wt, Gt, transposed = tall_pair(W, G)
    WtG = Wt.mT @ Gt
    if check_precision(precision) == "bfloat16":
        if method == "gram":
            raise ValueError("msign precision bfloat16 runs the released direct order; method 'gram' is float32 only")
        method = "direct"
    if method == "auto":
        method = choose_order(*Wt.shape[-2:])

    # Lambda_0 = -1/4 P(W^T G + G^T W), or the warm start P(sym Lambda0). Lambda_0 and
    # every H are symmetric and fixed by P, hence so is every Lambda_t: the loop uses it
    # as S = P(sym Lambda_t) directly (the same numbers, bit for bit).
    Lam = start_multiplier(mf, Wt, Gt, Lambda0, WtG=WtG)

    # the evaluation order: one step(S) per iteration
    if method == "direct":
        step = _direct_order(Wt, Gt, msign_steps, precision)
    else:
        step = _gram_order(Wt, Gt, WtG, msign_steps)
    stop = Tolerance(tol, WtG.shape[:-2], steps, WtG.device) if tol is not None else None
    history = []
    out_snaps: dict[int, torch.Tensor] = {}
    for t in range(steps):
        it = t + 1
        # A_t = msign(G + 2 W Lambda_t), as W^T A_t and A_t on demand
        WtA, direction = step(Lam)
        # H_t = P(W^T A_t + A_t^T W), the tangent violation of A_t
        H = mf.project_(WtA + WtA.mT)
        if record_violations or tol is not None:
            viol = rms(H)
            if record_violations:
                history.append(viol)
        if it in snaps:
            out_snaps[it] = direction()
        if stop is not None:
            if stop.update(it, viol, direction):
                break
            H = stop.freeze(H)
        # Lambda_{t+1} = Lambda_t - alpha (1 - t/T) H_t
        step_size = alpha_f * (1.0 - t / steps)
        if isinstance(step_size, torch.Tensor):
            step_size = step_size.to(H.dtype)
        Lam = Lam - step_size * H
    res = result(direction(), stop, Lam, it, history if record_violations else None, out_snaps, transposed)
    if method == "gram" and not _msign_sized(res.A):
        return dual_ascent(W, G, manifold, alpha=alpha, steps=steps, tol=tol, record_violations=record_violations,
                           snapshots=snapshots, method="direct", msign_steps=msign_steps, precision=precision,
                           Lambda0=Lambda0)
    return res


def _msign_sized(A: torch.Tensor) -> bool:
    """Whether every matrix of ``A`` is finite with squared Frobenius norm at most twice its rank bound (an
    msign's singular values are at most about 1): one read of the whole bank."""
    k = min(A.shape[-2:])
    return bool((A.square().sum(dim=(-2, -1)) <= 2.0 * k).all())


@torch.no_grad()
def manifold_muon_update(
    W: torch.Tensor,
    G: torch.Tensor,
    manifold: Manifold | str,
    eta: float,
    alpha: float | None = None,
    steps: int | None = None,
    *,
    tol: float | None = None,
    method: str = "auto",
    msign_steps: int = DEFAULT_STEPS,
    dgram_retraction: str | None = None,
    precision: str = "float32",
) -> torch.Tensor:
    """One Manifold Muon step: dual ascent, then ``retract(W - eta A)``.

    ``W`` and ``G`` are ``(..., m, n)``; wide matrices are handled by transposing.
    Returns the new weight (same shape and orientation as ``W``).
    """
    mf = as_manifold(manifold)
    if dgram_retraction is not None:
        mf = get_manifold(mf.name, dgram_retraction)
    res = dual_ascent(W, G, mf, alpha=alpha, steps=steps, tol=tol, method=method, msign_steps=msign_steps,
                      precision=precision)
    return mf.retract(W.to(res.A.dtype) - eta * res.A, precision=precision)
