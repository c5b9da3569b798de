"""Matrix sign (polar factor) of a matrix.

``msign(G)`` is the Polar Express iteration (Amsel, Persson, Musco, Gower 2025):
each step applies the odd quintic ``p(x) = a x + b x^3 + c x^5`` to the singular
values, with eight published coefficient triples (the last one repeats) and a
safety factor of 1.01 on all but the last. The input is first divided by
``1.01 * ||G||_F`` so every singular value lies in (0, 1).

Two equivalent evaluation orders are provided:

* :func:`msign` works on the matrix itself (``2 m n^2 + n^3`` flops a step for an
  ``m x n`` input with ``m >= n``).
* :func:`polar_express_gram` works on the ``n x n`` Gram matrix ``R = X^T X`` and
  returns the right factor ``Q`` with ``msign(X) = X Q``; a step costs ``4 n^3``
  whatever ``m`` is, which is what makes the dual ascent cheap for tall matrices.

:func:`polar_exact` is the SVD reference ``U V^T``.
"""

from __future__ import annotations

import torch

__all__ = [
    "POLAR_EXPRESS_COEFFS",
    "SAFETY",
    "DEFAULT_STEPS",
    "coefficients",
    "msign",
    "polar_exact",
    "polar_express_gram",
    "frobenius_scale",
]

#: The published degree-5 Polar Express coefficient triples (a, b, c).
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
SAFETY = 1.01
#: Steps used by the Manifold Muon reference code (the last triple repeats).
DEFAULT_STEPS = 10
_EPS = 1e-7


def coefficients(steps: int = DEFAULT_STEPS) -> list[tuple[float, float, float]]:
    """The (a, b, c) triple of each step, safety factor applied to all but the last."""
    if steps < 1:
        raise ValueError(f"msign needs at least one step, got steps={steps}")
    safe = [(a / SAFETY, b / SAFETY**3, c / SAFETY**5) for a, b, c in POLAR_EXPRESS_COEFFS[:-1]]
    table = safe + [POLAR_EXPRESS_COEFFS[-1]]
    return [table[min(k, len(table) - 1)] for k in range(steps)]


def _check_matrix(G: torch.Tensor, what: str) -> None:
    if not isinstance(G, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(G).__name__}")
    if G.ndim < 2:
        raise ValueError(f"{what} expects a matrix or a batch of matrices, got shape {tuple(G.shape)}")


def _work_dtype(G: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32 if G.dtype in (torch.float16, torch.bfloat16) else G.dtype
    if dtype in (torch.bfloat16, torch.float16) and G.device.type == "cpu":
        raise ValueError(f"msign in {dtype} is only allowed on GPU; CPU runs in float32")
    return dtype


def _tiny(dtype: torch.dtype) -> float:
    # Entries below this are far under the dtype's resolution of O(1) values, yet
    # their products are subnormal numbers that slow CPU matmuls by 100x once the
    # iteration has converged (off-diagonal Gram entries decay doubly exponentially).
    return torch.finfo(dtype).tiny ** (1.0 / 3.0)


def _flush_tiny(T: torch.Tensor, tiny: float) -> None:
    T.masked_fill_(T.abs() < tiny, 0.0)


def frobenius_scale(fro_sq: torch.Tensor) -> torch.Tensor:
    """The factor ``1 / (1.01 ||G||_F + eps)`` that Polar Express applies first."""
    return 1.0 / (SAFETY * fro_sq.clamp_min(0).sqrt() + _EPS)


def msign(
    G: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    dtype: torch.dtype | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """Polar Express approximation of the polar factor of ``G`` (``..., m, n``).

    Batched over leading dimensions; tall and wide inputs. Runs in float32 unless
    ``dtype`` asks for bfloat16 (GPU only). ``method`` is ``direct`` (iterate on
    the matrix; what ``auto`` means) or ``gram`` (iterate on the ``n x n`` Gram,
    see :func:`polar_express_gram`). The Gram order is exact in exact arithmetic
    but unstable in float32 on ill-conditioned inputs: rounding leaves Gram
    eigenvalues slightly negative and the polynomials blow them up (a rank-2
    matrix plus 1e-3 noise gave ``||msign||_2 = 700``). Momentum matrices are often
    nearly low-rank, so nothing uses it by default.
    """
    _check_matrix(G, "msign")
    if method not in ("auto", "direct", "gram"):
        raise ValueError(f"unknown msign method {method!r}; choose auto, direct or gram")
    X = G.to(_work_dtype(G, dtype))
    transpose = X.shape[-2] < X.shape[-1]
    if transpose:
        X = X.mT  # work on the tall orientation: the Gram X^T X is the small one
    lead = X.shape[:-2]
    m, n = X.shape[-2:]
    X = X.reshape(-1, m, n)
    if method == "auto":
        method = "direct"
    scale = frobenius_scale(X.square().sum(dim=(-2, -1), keepdim=True))
    if method == "gram":
        X = X @ (polar_express_gram(X.mT @ X * scale.square(), steps) * scale)
    else:
        X = (X * scale).mT  # wide: n x m
        tiny = _tiny(X.dtype)
        for a, b, c in coefficients(steps):
            S = torch.bmm(X, X.mT)
            _flush_tiny(S, tiny)
            B = torch.baddbmm(S, S, S, beta=b, alpha=c)  # b S + c S^2
            X = torch.baddbmm(X, B, X, beta=a)  # a X + (b S + c S^2) X
        X = X.mT
    X = X.reshape(*lead, m, n)
    return X.mT if transpose else X


def polar_express_gram(R: torch.Tensor, steps: int = DEFAULT_STEPS) -> torch.Tensor:
    """Right factor of Polar Express computed in the ``n x n`` Gram space.

    Only for well-conditioned ``R`` in float32 (see :func:`msign`): a rounding
    error that makes an eigenvalue negative is amplified by ``prod a_k^2 ~ 5e8``.

    ``R`` (``..., n, n``) must be ``X^T X`` of an already scaled ``X`` (singular
    values in (0, 1), e.g. scaled by :func:`frobenius_scale`). Returns ``Q`` with
    ``X @ Q`` equal to the Polar Express result on ``X`` (exact arithmetic).

    Each step with ``y = a I + b R + c R^2`` (a polynomial in ``R``, so it commutes
    with ``R``) maps ``X -> X y``, hence ``Q -> Q y`` and ``R -> y R y = R y^2``.
    """
    _check_matrix(R, "polar_express_gram")
    lead = R.shape[:-2]
    n = R.shape[-1]
    R = R.reshape(-1, n, n)
    eye = torch.eye(n, dtype=R.dtype, device=R.device).expand_as(R)
    tiny = _tiny(R.dtype)
    table = coefficients(steps)
    Q = None
    for k, (a, b, c) in enumerate(table):
        y = torch.baddbmm(R, R, R, beta=b, alpha=c).add_(eye, alpha=a)  # a I + b R + c R^2
        _flush_tiny(y, tiny)
        Q = y if Q is None else torch.bmm(Q, y)
        if k + 1 < len(table):
            R = torch.bmm(torch.bmm(R, y), y)
            _flush_tiny(R, tiny)
    return Q.reshape(*lead, n, n)


def polar_exact(G: torch.Tensor) -> torch.Tensor:
    """Exact polar factor ``U V^T`` from the thin SVD (reference, float64 inside)."""
    _check_matrix(G, "polar_exact")
    U, _, Vh = torch.linalg.svd(G.to(torch.float64), full_matrices=False)
    return (U @ Vh).to(G.dtype if G.dtype.is_floating_point else torch.float32)
