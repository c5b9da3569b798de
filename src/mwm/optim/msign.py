"""Matrix sign (polar factor) of a matrix.

``msign(G)`` is the Polar Express iteration (Amsel, Persson, Musco, Gower 2025):
each step applies the odd quintic ``p(x) = a x + b x^3 + c x^5`` to the singular
values, with eight published coefficient triples (the last one repeats) and a
safety factor of 1.01 on all but the last. The input is first divided by
``1.01 * ||G||_F`` so every singular value lies in (0, 1).

Two evaluation orders give the same numbers up to float32 rounding:

* :func:`msign` ``direct`` works on the matrix itself (``2 m n^2 + n^3`` flops a
  step for an ``m x n`` input with ``m >= n``).
* ``gram`` works on the ``n x n`` Gram matrix ``R = X^T X`` (:func:`polar_express_gram`
  returns the right factor ``Q`` with ``msign(X) = X Q``; a step costs ``4 n^3``
  whatever ``m`` is) and rebuilds the iterate from the matrix once, after
  :data:`GRAM_RESTART` steps, which keeps it stable in float32 (why: there).

:func:`polar_exact` is the SVD reference ``U V^T``.

Precision. ``precision="bfloat16"`` is the released numerics: Bernstein's
reference msign (which the released ``manifold_muon.py`` imports, and which is
also its Stiefel retraction) casts the input to bfloat16, transposes it to the
wide orientation, divides by ``1.01 ||x||_F`` (no epsilon), runs every step as
``s = x x^T; y = c s; y += b I; y = y s; y += a I; x = y x`` in bfloat16,
replaces NaN/Inf by 0 and returns ``.float()``. :func:`msign_bf16` mirrors those
casts op for op. By default it *emulates* bfloat16: every operand is a bfloat16
value held in float32, each matmul runs in float32 and its result is rounded to
bfloat16, each elementwise op is computed in float32 and rounded. That is what a
GPU bfloat16 GEMM does (bf16 operands, float32 accumulation, result rounded to
bf16), on any device; ``native=True`` runs real bfloat16 tensors (the test
compares the two; timings of both: docs/measured.md).
``precision="float32"`` is the float32 iteration above (a control).
"""

from __future__ import annotations

import torch

from mwm.optim.vocab import MSIGN_STEPS, PRECISIONS

__all__ = [
    "POLAR_EXPRESS_COEFFS",
    "SAFETY",
    "DEFAULT_STEPS",
    "GRAM_RESTART",
    "coefficients",
    "msign",
    "polar_exact",
    "polar_express_gram",
    "choose_order",
    "frobenius_scale",
    "PRECISIONS",
    "check_precision",
    "round_bf16",
    "msign_bf16",
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
#: Steps used by the Manifold Muon reference code (the last triple repeats); the schema's default too.
DEFAULT_STEPS = MSIGN_STEPS
#: The Gram order rebuilds its iterate from the matrix after this many steps (here, in
#: :func:`msign`, and in the dual ascent's Gram order, :mod:`mwm.optim.dual_ascent`).
#:
#: Why: run in one go in float32 the Gram order is unstable. A nearly low-rank input
#: has Gram eigenvalues at the rounding level, rounding makes some negative, and the
#: polynomials amplify those by up to ``prod a_k^2 ~ 5e8`` (``||msign||_2 = 700`` on a
#: rank-2 matrix plus noise). The large-``a`` early steps do that amplification;
#: recomputing ``R = X^T X`` from ``X_3 = X Q_3`` makes it positive semidefinite again,
#: and the remaining steps (``prod a_k^2 ~ 3e4``) no longer reach O(1). Against the
#: direct order on Gaussian, power-law and low-rank-plus-noise inputs (``bench_core.py``
#: prints it) the restarted order is as close as a Gram iteration run entirely in float64.
GRAM_RESTART = 3
#: Matrices narrower than this stay in the direct order (see :func:`choose_order`).
GRAM_MIN_N = 128
_EPS = 1e-7


def check_precision(precision: str) -> str:
    """``precision`` itself (``bfloat16``, the released code's, or ``float32``, the control), or a ValueError
    naming the allowed values."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown msign precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


def round_bf16(T: torch.Tensor) -> torch.Tensor:
    """``T`` rounded to the nearest bfloat16 (ties to even), kept in ``T``'s dtype."""
    return T.to(torch.bfloat16).to(T.dtype)


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
        raise ValueError(f"msign dtype={dtype} (a plain low-precision iteration) is GPU only; for the released "
                         "bfloat16 numerics on any device use precision='bfloat16'")
    return dtype


def _tiny(dtype: torch.dtype) -> float:
    # Entries below this are far under the dtype's resolution of O(1) values, yet
    # their products are subnormal numbers, which slow CPU matmuls down sharply once the
    # iteration has converged (off-diagonal Gram entries decay doubly exponentially).
    return torch.finfo(dtype).tiny ** (1.0 / 3.0)


def _flush_tiny(T: torch.Tensor, tiny: float) -> torch.Tensor:
    """``T`` with entries of magnitude at most ``tiny`` set to 0 (NaN and Inf kept).

    One fused call (``hardshrink``) instead of abs/compare/masked_fill: small
    matrices are bound by calls, not flops (docs/findings.md).
    """
    return torch.nn.functional.hardshrink(T, tiny)


def frobenius_scale(fro_sq: torch.Tensor) -> torch.Tensor:
    """The factor ``1 / (1.01 ||G||_F + eps)`` that Polar Express applies first."""
    return 1.0 / (SAFETY * fro_sq.clamp_min(0).sqrt() + _EPS)


def msign(
    G: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    dtype: torch.dtype | None = None,
    method: str = "auto",
    precision: str = "float32",
) -> torch.Tensor:
    """Polar Express approximation of the polar factor of ``G`` (``..., m, n``).

    ``precision="bfloat16"`` runs the released code's bfloat16 iteration
    (:func:`msign_bf16`: real bfloat16 on CUDA, emulated elsewhere; ``dtype`` and
    ``method`` do not apply) and returns float32.

    Batched over leading dimensions; tall and wide inputs. Runs in float32 unless
    ``dtype`` asks for bfloat16 (GPU only). ``method`` is ``direct`` (iterate on
    the matrix), ``gram`` (iterate on the ``n x n`` Gram with one restart, see the
    module docstring) or ``auto`` (:func:`choose_order`).
    """
    _check_matrix(G, "msign")
    if method not in ("auto", "direct", "gram"):
        raise ValueError(f"unknown msign method {method!r}; choose auto, direct or gram")
    if check_precision(precision) == "bfloat16":
        return msign_bf16(G, steps, native=G.device.type == "cuda")
    X = G.to(_work_dtype(G, dtype))
    transpose = X.shape[-2] < X.shape[-1]
    if transpose:
        X = X.mT  # work on the tall orientation: the Gram X^T X is the small one
    lead = X.shape[:-2]
    m, n = X.shape[-2:]
    X = X.reshape(-1, m, n)
    if method == "auto":
        method = choose_order(m, n)
    scale = frobenius_scale(X.square().sum(dim=(-2, -1), keepdim=True))
    if method == "gram":
        X = X * scale
        Q = polar_express_gram(X.mT @ X, steps, stop=GRAM_RESTART)
        if steps > GRAM_RESTART:
            X = X @ Q
            Q = polar_express_gram(X.mT @ X, steps, start=GRAM_RESTART)
        X = X @ Q
    else:
        X = (X * scale).mT  # wide: n x m
        tiny = _tiny(X.dtype)
        for a, b, c in coefficients(steps):
            S = torch.bmm(X, X.mT)
            S = _flush_tiny(S, tiny)
            P = torch.baddbmm(S, S, S, beta=b, alpha=c)  # b S + c S^2
            P.diagonal(dim1=-2, dim2=-1).add_(a)
            X = torch.bmm(P, X)  # (a I + b S + c S^2) X: no copy of the big X as baddbmm's input
        X = X.mT
    X = X.reshape(*lead, m, n)
    return X.mT if transpose else X


@torch.no_grad()
def msign_bf16(G: torch.Tensor, steps: int = DEFAULT_STEPS, native: bool = False,
               scalars: str = "float32") -> torch.Tensor:
    """Polar Express in bfloat16, cast for cast as the released code (module docstring).

    ``native=False`` (default): bfloat16 emulated in float32, each matmul and each
    elementwise result rounded to bfloat16 (a GPU bf16 GEMM: bf16 operands, float32
    accumulation, bf16 result). ``native=True``: real bfloat16 tensors (slow on
    CPU). Returns float32 (``..., m, n``); non-finite entries become 0 as there.

    ``scalars`` is how the emulation adds the Python scalars ``a`` and ``b`` to the
    diagonal: ``float32`` as PyTorch's CUDA kernels (a CPU scalar enters in the
    op's float32 math type), ``bfloat16`` as PyTorch's CPU ``add_`` on a bfloat16
    tensor, which narrows the scalar to bfloat16 first (``mul`` does not, on
    either). With ``scalars="bfloat16"`` the emulation equals ``native=True`` on
    CPU bit for bit (tested); the default is the GPU's semantics.
    """
    if scalars not in ("float32", "bfloat16"):
        raise ValueError(f"msign_bf16 scalars must be float32 or bfloat16, got {scalars!r}")
    _check_matrix(G, "msign_bf16")
    if steps < 1:
        raise ValueError(f"msign needs at least one step, got steps={steps}")
    if native:
        x, r = G.bfloat16(), (lambda T: T)
    else:
        x, r = round_bf16(G.float()), round_bf16
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = x.mT  # wide: the Gram x x^T is the small one
    norm = r(torch.linalg.vector_norm(x.float(), dim=(-2, -1), keepdim=True)).to(x.dtype)
    x = r(x / r(norm * SAFETY))
    for a, b, c in coefficients(steps):
        if scalars == "bfloat16" and not native:
            a, b = (float(torch.tensor(v, dtype=torch.bfloat16)) for v in (a, b))
        s = r(x @ x.mT)
        y = r(c * s)
        y.diagonal(dim1=-2, dim2=-1).copy_(r(y.diagonal(dim1=-2, dim2=-1) + b))
        y = r(y @ s)
        y.diagonal(dim1=-2, dim2=-1).copy_(r(y.diagonal(dim1=-2, dim2=-1) + a))
        x = r(y @ x)
    if transpose:
        x = x.mT
    return torch.nan_to_num(x).float()


def choose_order(m: int, n: int) -> str:
    """The evaluation order ``auto`` picks for a tall ``m x n`` matrix: ``gram`` once
    ``m >= 3 n``, or ``m >= 2 n`` and ``n >= GRAM_MIN_N``; else ``direct``.

    A restarted Gram step costs ``4 n^3`` against ``(2 m / n + 1) n^3`` for a direct
    one; below ``m = 2 n`` the restart's extra products eat the saving. Small
    matrices pay more per call, and the Gram order makes more calls, hence the
    ``n >= GRAM_MIN_N`` condition at ``m < 3 n`` (the measured speeds behind these
    thresholds: docs/measured.md).
    """
    return "gram" if m >= 3 * n or (m >= 2 * n and n >= GRAM_MIN_N) else "direct"


def polar_express_gram(
    R: torch.Tensor, steps: int = DEFAULT_STEPS, start: int = 0, stop: int | None = None
) -> torch.Tensor:
    """Right factor of Polar Express steps ``start .. stop - 1`` in the ``n x n`` Gram space.

    ``R`` (``..., n, n``) must be ``X^T X`` of the iterate the steps start from (for
    ``start = 0`` the scaled input, singular values in (0, 1), e.g. scaled by
    :func:`frobenius_scale`). Returns ``Q`` with ``X @ Q`` equal to those steps of
    Polar Express on ``X`` (exact arithmetic). ``steps`` picks the coefficient
    table as in :func:`coefficients`; ``stop`` defaults to ``steps``.

    Run all steps at once only on well-conditioned ``R`` in float32: the callers
    split at :data:`GRAM_RESTART` (why: there) and recompute ``R`` from ``X Q`` in between.

    Each step with ``y = a I + b R + c R^2`` (a polynomial in ``R``, so it commutes
    with ``R``) maps ``X -> X y``, hence ``Q -> Q y`` and ``R -> y R y = R y^2``.
    """
    _check_matrix(R, "polar_express_gram")
    lead = R.shape[:-2]
    n = R.shape[-1]
    R = R.reshape(-1, n, n)
    tiny = _tiny(R.dtype)
    stop = steps if stop is None else min(stop, steps)
    if not 0 <= start < stop:
        raise ValueError(f"polar_express_gram needs 0 <= start < stop <= steps, got start={start}, stop={stop}")
    table = coefficients(steps)[start:stop]
    Q = None
    for k, (a, b, c) in enumerate(table):
        y = torch.baddbmm(R, R, R, beta=b, alpha=c)  # b R + c R^2
        y.diagonal(dim1=-2, dim2=-1).add_(a)  # + a I
        y = _flush_tiny(y, tiny)
        Q = y if Q is None else torch.bmm(Q, y)
        if k + 1 < len(table):
            R = torch.bmm(torch.bmm(R, y), y)
            R = _flush_tiny(R, tiny)
    return Q.reshape(*lead, n, n)


def polar_exact(G: torch.Tensor) -> torch.Tensor:
    """Exact polar factor ``U V^T`` from the thin SVD (reference, float64 inside)."""
    _check_matrix(G, "polar_exact")
    U, _, Vh = torch.linalg.svd(G.to(torch.float64), full_matrices=False)
    return (U @ Vh).to(G.dtype if G.dtype.is_floating_point else torch.float32)
