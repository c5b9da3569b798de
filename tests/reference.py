"""An independent reference for Manifold Muon: the paper's equations, one matrix at a
time, in float64 NumPy, with the matrix sign taken exactly from the SVD.

Written from the equations, not from ``mwm``: nothing here imports the package. It is
deliberately plain (no batching, no evaluation orders, no in-place tricks), so that a
test comparing the optimizer against it compares two independent implementations.

For a tall weight ``W`` (``m >= n``; a wide one is transposed first and the result
transposed back) on a manifold with projector ``P``:

    Lambda_0 = -1/4 P(W^T G + G^T W)
    for t = 0 .. T-1:
        A_t         = msign(G + 2 W Lambda_t)
        H_t         = P(W^T A_t + A_t^T W)
        Lambda_t+1  = Lambda_t - alpha (1 - t/T) H_t
    W <- retract(W - eta A_{T-1})

with ``P`` the identity (Stiefel), the off-diagonal part (DGram) or the diagonal part
(Oblique).
"""

from __future__ import annotations

import numpy as np

MANIFOLDS = ("stiefel", "dgram", "oblique")
RETRACTIONS = ("paper", "colnorm")


def msign(M: np.ndarray) -> np.ndarray:
    """Exact polar factor ``U V^T`` of ``M = U diag(s) V^T`` (thin SVD)."""
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt


def project(manifold: str, S: np.ndarray) -> np.ndarray:
    """The projector ``P`` of ``manifold`` applied to a square ``S``."""
    if manifold == "stiefel":
        return S.copy()
    if manifold == "dgram":
        return S - np.diag(np.diag(S))
    if manifold == "oblique":
        return np.diag(np.diag(S))
    raise ValueError(manifold)


def dual_ascent(W: np.ndarray, G: np.ndarray, manifold: str, alpha: float, steps: int) -> np.ndarray:
    """The update direction ``A`` for a tall ``W`` and momentum ``G``."""
    Lam = -0.25 * project(manifold, W.T @ G + G.T @ W)
    A = None
    for t in range(steps):
        A = msign(G + 2.0 * W @ Lam)
        H = project(manifold, W.T @ A + A.T @ W)
        Lam = Lam - alpha * (1.0 - t / steps) * H
    return A


def retract(manifold: str, kind: str, W: np.ndarray) -> np.ndarray:
    """Map a tall ``W`` onto ``manifold``; ``kind`` picks the DGram retraction:
    ``paper`` is ``(U V^T) diag(s)`` with ``s`` in descending order (as the SVD returns
    them), ``colnorm`` is ``polar(W D^-1) D`` with ``D`` the column norms."""
    if manifold == "stiefel":
        return msign(W)
    if manifold == "oblique":
        return W / np.linalg.norm(W, axis=0, keepdims=True)
    if kind == "paper":
        U, s, Vt = np.linalg.svd(W, full_matrices=False)
        return (U @ Vt) @ np.diag(s)
    d = np.linalg.norm(W, axis=0)
    return msign(W / d) @ np.diag(d)


def init(manifold: str, kind: str, W: np.ndarray) -> np.ndarray:
    """An initial weight on the manifold: the exact polar factor for Stiefel, else the
    retraction."""
    return msign(W) if manifold == "stiefel" else retract(manifold, kind, W)


def _tall(fn, W: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    """``fn`` applied in the tall orientation, the result in ``W``'s."""
    if W.shape[0] >= W.shape[1]:
        return fn(W, *rest)
    return fn(W.T, *(R.T for R in rest)).T


def manifold_muon_step(W: np.ndarray, U: np.ndarray, manifold: str, kind: str, eta: float, alpha: float,
                       steps: int) -> np.ndarray:
    """One Manifold Muon update of ``W`` (tall or wide) for update direction ``U``."""
    def step(Wt, Ut):
        A = dual_ascent(Wt, Ut, manifold, alpha, steps)
        return retract(manifold, kind, Wt - eta * A)

    return _tall(step, W, U)


def initial_weight(W: np.ndarray, manifold: str, kind: str) -> np.ndarray:
    """:func:`init` of a tall or wide ``W``."""
    return _tall(lambda Wt: init(manifold, kind, Wt), W)


class NesterovMomentum:
    """``buf <- mu buf + g`` (from zero), update direction ``g + mu buf``."""

    def __init__(self, mu: float):
        self.mu = mu
        self.buf = None

    def __call__(self, g: np.ndarray) -> np.ndarray:
        self.buf = g.copy() if self.buf is None else self.mu * self.buf + g
        return g + self.mu * self.buf
