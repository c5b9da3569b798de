"""The Gram-space manifolds: Stiefel, DGram and Oblique.

A manifold is fixed by a self-adjoint projector ``P`` on symmetric ``n x n``
matrices and a target ``C`` (Keigwin et al.'s Gram-space framework): a tall
``W`` (``m >= n``) lies on it when ``P(W^T W - C) = 0``.

==========  =========  ==========================  ======================
manifold    ``P``      constraint                  tangent dimension
==========  =========  ==========================  ======================
stiefel     identity   ``W^T W = I``               ``mn - n(n+1)/2``
dgram       off-diag   ``off(W^T W) = 0``          ``mn - n(n-1)/2``
oblique     diagonal   ``diag(W^T W) = 1``         ``mn - n``
==========  =========  ==========================  ======================

Wide weights are handled by transposing, as the paper's code does: every
function here accepts any ``(..., m, n)`` and works on the tall orientation.

DGram has two retractions, chosen by name:

``paper``
    What the released code does: ``(U V^T) * S`` with ``S`` the singular values
    in *descending* order. Column ``j`` gets the ``j``-th largest singular value,
    whichever column it came from, so even a point already on DGram is permuted
    in its column norms (norms [0.5, 3, 1, 2] come back as [3, 2, 1, 0.5]).
``colnorm``
    ``polar(W D^-1) D`` with ``D`` the input's column norms: columns are made
    orthonormal and given back their own norms. It fixes every point of DGram.

Both are computed from the eigendecomposition of the ``n x n`` Gram matrix
instead of a full SVD of the ``m x n`` matrix, in float64 whatever the weight's dtype: the Gram
squares the weight's condition number, and a float32 Gram's eigh loses ``eps kappa^2`` (up to 1.8e-5
on the mini model's weights, 10x a float32 SVD's error; ``benchmarks/bench_accuracy.py``), where a
float64 one is exact to the float32 result's rounding. A weight whose Gram spans too many orders of
magnitude even for that (nearly singular) is retracted by SVD in float64 instead.

The inverse square root of that Gram comes from one of two solves (``polar``, ``train.dgram_polar``):
``eigh``, one eigendecomposition per matrix (the default, and the form every published run used), or
``newton-schulz``: the eigenvalues alone by ``eigvalsh`` (still one call per matrix, but no vectors),
then the coupled Newton-Schulz iteration in float64 for the whole bank at once (matmuls only), for
the number of steps its worst-conditioned matrix needs (worked out from the eigenvalues, so there is
no convergence test and no extra sync). A GPU's eigensolver is per matrix above n = 32, so the second
may be the faster there; on a CPU it costs several times the first (``benchmarks/bench_retraction.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mwm.optim.msign import msign, polar_exact
from mwm.optim.vocab import POLARS, RETRACTIONS

__all__ = [
    "MANIFOLDS",
    "DGRAM_RETRACTIONS",
    "POLARS",
    "Manifold",
    "get_manifold",
    "to_tall",
    "rms",
    "retract_dgram_svd",
    "retract_dgram_paper",
    "cap_column_norms",
]

MANIFOLDS = ("stiefel", "dgram", "oblique")
DGRAM_RETRACTIONS = RETRACTIONS


def to_tall(W: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Return ``W`` in its tall orientation (``m >= n``) and whether it was transposed."""
    if W.ndim < 2:
        raise ValueError(f"expected a matrix or a batch of matrices, got shape {tuple(W.shape)}")
    if W.shape[-2] < W.shape[-1]:
        return W.mT, True
    return W, False


def _tall_map(fn, W: torch.Tensor) -> torch.Tensor:
    T, transposed = to_tall(W)
    out = fn(T)
    return out.mT if transposed else out


def rms(M: torch.Tensor) -> torch.Tensor:
    """Root mean square over the last two dimensions."""
    return M.square().mean(dim=(-2, -1)).sqrt()


def _gram(W: torch.Tensor) -> torch.Tensor:
    return W.mT @ W


# A float64 eigh resolves eigenvalues to about 1e-16 of the largest; past this spread the smallest
# lose more than 1e-6 of their value and their eigenvectors turn to noise.
_EIGH_MAX_SPREAD = 1e10


def _resolved(values: torch.Tensor) -> torch.Tensor:
    """Per row of ``values`` (..., n): whether it spans at most ``_EIGH_MAX_SPREAD``."""
    return values.amin(-1) * _EIGH_MAX_SPREAD >= values.amax(-1)


def _inv_sqrt_psd(S: torch.Tensor, polar: str = "eigh") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending) and ``S^{-1/2}`` of a batch of symmetric PSD float64 matrices, and a
    mask of the matrices whose eigenvalue spread eigh resolves (``_EIGH_MAX_SPREAD``): the caller
    retracts the others, and only them, by SVD in float64 from the weight itself, as the released
    code does (by SVD). ``polar``: ``eigh`` or ``newton-schulz`` (the module docstring).

    Why not carry on with eigh there: the small eigenvalues carry the Gram's rounding (eps times the
    largest), and their power -1/2 blows those directions up: on a nearly singular weight the eigh
    retraction can raise sigma_max far past the input's, outside the growth bound the paper's argument
    rests on (docs/findings.md, Dated runs, config/sweep.yaml).
    A Gram with NaN or Inf entries (a diverged weight) raises ``FloatingPointError`` here, before
    LAPACK sees it (its eigh would fail to converge, or return NaN).
    """
    if not bool(torch.isfinite(S).all()):
        raise FloatingPointError("Gram matrix has NaN or Inf entries (the weight diverged); cannot retract")
    if polar == "eigh":
        evals, evecs = torch.linalg.eigh(S)
    else:
        evals = torch.linalg.eigvalsh(S)
    # the diagonal lies inside the eigenvalue range: its spread bounds theirs from below, whatever eigh made
    ok = _resolved(S.diagonal(dim1=-2, dim2=-1)) & _resolved(evals)
    floor = evals[..., -1:].clamp_min(torch.finfo(evals.dtype).tiny) * torch.finfo(evals.dtype).eps
    if polar == "eigh":
        inv_root = evals.clamp_min(floor).rsqrt()
        return evals, (evecs * inv_root.unsqueeze(-2)) @ evecs.mT, ok
    return evals, _inv_sqrt_newton_schulz(S, evals.clamp_min(floor)), ok


def newton_schulz_steps(mu: float, tol: float = 1e-15, cap: int = 60) -> int:
    """Steps of the coupled Newton-Schulz iteration that bring an eigenvalue ``mu`` in (0, 1] of
    ``S / lambda_max`` to ``1 - p <= tol``, ``p = z y`` its product (1 at convergence): the iteration
    acts on each eigenvalue alone, ``p <- p (3 - p)^2 / 4``, so the smallest one sets the count."""
    p, steps = min(max(mu, 1e-300), 1.0), 0
    while 1.0 - p > tol and steps < cap:
        p *= (3.0 - p) ** 2 / 4.0
        steps += 1
    return steps


def _inv_sqrt_newton_schulz(S: torch.Tensor, evals: torch.Tensor) -> torch.Tensor:
    """``S^{-1/2}`` of a batch of SPD matrices with ascending eigenvalues ``evals``, by the coupled
    iteration ``T = (3I - Z Y) / 2, Y <- Y T, Z <- T Z`` from ``Y = S / lambda_max, Z = I`` (stable,
    unlike the single-sequence Newton form; Z tends to ``(S / lambda_max)^{-1/2}``)."""
    lmax = evals[..., -1].clamp_min(torch.finfo(S.dtype).tiny)
    # the bank's worst matrix sets the count; an unresolved one (replaced by SVD) is counted at the limit
    mu = float((evals[..., 0] / lmax).clamp_min(1.0 / _EIGH_MAX_SPREAD).amin()) if S.numel() else 1.0
    Y = S / lmax[..., None, None]
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device).expand_as(S)
    Z = eye.clone()
    for _ in range(newton_schulz_steps(mu)):
        T = 1.5 * eye - 0.5 * (Z @ Y)
        Y, Z = Y @ T, T @ Z
    Z = 0.5 * (Z + Z.mT)  # symmetric in exact arithmetic; rounding is not
    return Z * lmax.rsqrt()[..., None, None]


def _by_svd_where_unresolved(out: torch.Tensor, X: torch.Tensor, ok: torch.Tensor, scale=None) -> torch.Tensor:
    """``out`` with each matrix eigh could not resolve (``~ok``) replaced by the SVD form of ``X``'s:
    ``U S V^T`` re-formed as ``polar(X) diag(S)`` (the paper form, ``scale`` None), or
    ``polar(X D^-1) D`` for the column norms ``scale`` = D (colnorm). One SVD per such matrix."""
    if bool(ok.all()):
        return out
    shape = out.shape
    out, X, bad = out.reshape(-1, *shape[-2:]).clone(), X.reshape(-1, *shape[-2:]), (~ok).reshape(-1)
    Xb = X[bad]
    if scale is None:
        U, S, Vh = torch.linalg.svd(Xb, full_matrices=False)
        out[bad] = (U @ Vh) * S.unsqueeze(-2)
    else:
        d = scale.reshape(-1, shape[-1])[bad].unsqueeze(-2)
        U, _, Vh = torch.linalg.svd(Xb / d, full_matrices=False)
        out[bad] = (U @ Vh) * d
    return out.reshape(shape)


# Both DGram forms take and return a tall float64 batch (``_retract_dgram`` casts).
def retract_dgram_paper(W: torch.Tensor, polar: str = "eigh") -> torch.Tensor:
    """The DGram retraction of a tall ``W`` in its own dtype, through the inverse square root of its
    Gram by ``polar`` (the SVD where that cannot resolve it); the manifold's ``retract`` runs it in
    float64."""
    evals, inv_root, ok = _inv_sqrt_psd(_gram(W), polar)
    sigma_desc = evals.clamp_min(0).sqrt().flip(-1)
    return _by_svd_where_unresolved((W @ inv_root) * sigma_desc.unsqueeze(-2), W, ok)


def _retract_dgram_colnorm(W: torch.Tensor, polar: str = "eigh") -> torch.Tensor:
    gram = _gram(W)
    d = gram.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(gram.dtype).tiny).sqrt()
    corr = gram / (d.unsqueeze(-1) * d.unsqueeze(-2))  # Gram of the column-normalized W
    _, inv_root, ok = _inv_sqrt_psd(corr, polar)
    # polar(W D^-1) D = W (D^-1 corr^-1/2 D): one m x n by n x n product
    return _by_svd_where_unresolved(W @ (inv_root / d.unsqueeze(-1) * d.unsqueeze(-2)), W, ok, scale=d)


def retract_dgram_svd(W: torch.Tensor) -> torch.Tensor:
    """The released code's DGram retraction, by full SVD (reference and benchmark)."""
    def f(T):
        U, S, Vh = torch.linalg.svd(T, full_matrices=False)
        return (U @ Vh) * S.unsqueeze(-2)

    return _tall_map(f, W)


def cap_column_norms(W: torch.Tensor, cap: float) -> torch.Tensor:
    """Scale down every column (of the tall orientation) whose norm exceeds ``cap`` to norm ``cap``;
    the others are left as they are. On DGram (orthogonal columns) the singular values are the column
    norms, so this clips them at ``cap`` and keeps ``off(W^T W) = 0``: the spectral cap of the
    interventions (``train.attn_sigma_cap``, ``train.mlp_sigma_cap``, :mod:`mwm.plan.variants`)."""
    if not cap > 0:
        raise ValueError(f"the singular-value cap must be > 0, got {cap!r}")

    def f(T):
        norms = T.norm(dim=-2, keepdim=True)
        return T * torch.where(norms > cap, cap / norms, torch.ones_like(norms))

    return _tall_map(f, W)


# -- the per-manifold data ---------------------------------------------------------------
def _identity(S: torch.Tensor) -> torch.Tensor:
    return S


def _off_diagonal_(S: torch.Tensor) -> torch.Tensor:
    S.diagonal(dim1=-2, dim2=-1).zero_()
    return S


def _off_diagonal(S: torch.Tensor) -> torch.Tensor:
    return _off_diagonal_(S.clone())


def _diagonal(S: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(torch.diagonal(S, dim1=-2, dim2=-1))


def _eye(n: int, dtype, device) -> torch.Tensor:
    return torch.eye(n, dtype=dtype, device=device)


def _zeros(n: int, dtype, device) -> torch.Tensor:
    return torch.zeros(n, n, dtype=dtype, device=device)


def _retract_stiefel(T: torch.Tensor, precision: str, kind: str, polar: str) -> torch.Tensor:
    return msign(T, precision=precision)


def _retract_dgram(T: torch.Tensor, precision: str, kind: str, polar: str) -> torch.Tensor:
    X = T.to(torch.float64)  # why float64: the module docstring
    form = retract_dgram_paper if kind == "paper" else _retract_dgram_colnorm
    return form(X, polar).to(T.dtype)


def _retract_oblique(T: torch.Tensor, precision: str, kind: str, polar: str) -> torch.Tensor:
    return T / T.norm(dim=-2, keepdim=True).clamp_min(1e-12)


@dataclass(frozen=True)
class _Spec:
    """What sets one manifold apart: ``project`` is ``P`` and ``project_`` the same map
    allowed to overwrite its argument; ``target`` builds ``C``; ``retract`` maps a tall
    matrix onto the manifold (``precision``: the msign precision, ``kind``: the DGram
    retraction, ``polar``: its solve); ``init`` replaces the retraction at initialization (``None``: the
    retraction); ``cosine_residual``: the constraint residual is taken on the Gram
    normalized to cosines; ``tangent_dim(m, n)`` for a tall ``m x n`` weight."""

    project: Callable[[torch.Tensor], torch.Tensor]
    project_: Callable[[torch.Tensor], torch.Tensor]
    target: Callable[..., torch.Tensor]
    retract: Callable[[torch.Tensor, str, str, str], torch.Tensor]
    init: Callable[[torch.Tensor], torch.Tensor] | None
    cosine_residual: bool
    tangent_dim: Callable[[int, int], int]


_SPECS: dict[str, _Spec] = {
    # P = Id, W^T W = I. Init by the exact polar factor: Polar Express leaves the smallest
    # singular values of a random square matrix short of 1 (the released code's init is
    # off Stiefel by ~1e-3 RMS there); the exact factor starts every weight on it.
    "stiefel": _Spec(_identity, _identity, _eye, _retract_stiefel, polar_exact, False,
                     lambda m, n: m * n - n * (n + 1) // 2),
    # P = Off, off(W^T W) = 0; the residual on cosines does not scale with the column norms
    "dgram": _Spec(_off_diagonal, _off_diagonal_, _zeros, _retract_dgram, None, True,
                   lambda m, n: m * n - n * (n - 1) // 2),
    # P = Diag, diag(W^T W) = 1
    "oblique": _Spec(_diagonal, _diagonal, _eye, _retract_oblique, None, False,
                     lambda m, n: m * n - n),
}
assert tuple(_SPECS) == MANIFOLDS


@dataclass(frozen=True)
class Manifold:
    """One Gram-space manifold; ``retraction`` and ``polar`` (how its inverse square root is solved)
    only matter for DGram."""

    name: str
    retraction: str = "paper"
    polar: str = "eigh"

    def __post_init__(self):
        if self.name not in MANIFOLDS:
            raise ValueError(f"unknown manifold {self.name!r}; choose one of {', '.join(MANIFOLDS)}")
        if self.retraction not in DGRAM_RETRACTIONS:
            raise ValueError(
                f"unknown DGram retraction {self.retraction!r}; choose one of {', '.join(DGRAM_RETRACTIONS)}"
            )
        if self.polar not in POLARS:
            raise ValueError(f"unknown DGram polar solve {self.polar!r}; choose one of {', '.join(POLARS)}")

    @property
    def _spec(self) -> _Spec:
        return _SPECS[self.name]

    # -- the projector P and the target C ------------------------------------------
    def project(self, S: torch.Tensor) -> torch.Tensor:
        """Apply the self-adjoint projector ``P`` to (a batch of) ``n x n`` matrices."""
        return self._spec.project(S)

    def project_(self, S: torch.Tensor) -> torch.Tensor:
        """:meth:`project` that may overwrite ``S`` (Stiefel and DGram do, in place)."""
        return self._spec.project_(S)

    def target(self, n: int, dtype=torch.float32, device=None) -> torch.Tensor:
        return self._spec.target(n, dtype, device)

    # -- retraction and initialization -----------------------------------------------
    def retract(self, W: torch.Tensor, precision: str = "float32") -> torch.Tensor:
        """Map a matrix (tall or wide, batched) onto the manifold. ``precision`` is
        the msign precision of the Stiefel retraction (the released code's is
        msign, i.e. bfloat16; see :mod:`mwm.optim.msign`); the others are float32."""
        return _tall_map(lambda T: self._spec.retract(T, precision, self.retraction, self.polar), W)

    def init(self, W: torch.Tensor) -> torch.Tensor:
        """Put an initial weight on the manifold: the retraction, except for Stiefel,
        where the exact polar factor (SVD) is used (see ``_SPECS``)."""
        init = self._spec.init
        return self.retract(W) if init is None else init(W)

    # -- diagnostics ------------------------------------------------------------------
    def tangent_violation(self, W: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """``||P(W^T A + A^T W)||_RMS``: how far ``A`` is from the tangent space at ``W``."""
        Wt, _ = to_tall(W)
        At, _ = to_tall(A)
        X = Wt.mT @ At
        return rms(self.project(X + X.mT))

    def constraint_residual(self, W: torch.Tensor) -> torch.Tensor:
        """RMS of ``P(W^T W - C)``; for DGram the Gram is first normalized to cosines
        (``D^-1 W^T W D^-1``) so the residual does not scale with the column norms."""
        T, _ = to_tall(W)
        gram = T.mT @ T
        if self._spec.cosine_residual:
            d = gram.diagonal(dim1=-2, dim2=-1).clamp_min(1e-30).sqrt()
            gram = gram / (d.unsqueeze(-1) * d.unsqueeze(-2))
        n = gram.shape[-1]
        return rms(self.project(gram - self.target(n, gram.dtype, gram.device)))

    def tangent_dim(self, m: int, n: int) -> int:
        """Dimension of the tangent space for an ``m x n`` weight (tall orientation)."""
        return self._spec.tangent_dim(max(m, n), min(m, n))


def get_manifold(name: str, retraction: str = "paper", polar: str | None = None) -> Manifold:
    """Look a manifold up by name (``stiefel``, ``dgram``, ``oblique``); ``polar`` None is the default
    solve (a param group or config without the key)."""
    return Manifold(name, retraction, polar or Manifold.polar)
