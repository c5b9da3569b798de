import pytest
import torch
from hypothesis import given, settings, strategies as st

from mwm.optim.msign import coefficients, msign, polar_exact, polar_express_gram, frobenius_scale, POLAR_EXPRESS_COEFFS


def test_coefficients_safety_factor_on_all_but_last():
    table = coefficients(10)
    assert len(table) == 10
    a0, b0, c0 = POLAR_EXPRESS_COEFFS[0]
    assert table[0] == pytest.approx((a0 / 1.01, b0 / 1.01**3, c0 / 1.01**5))
    assert table[7] == POLAR_EXPRESS_COEFFS[-1]
    assert table[9] == POLAR_EXPRESS_COEFFS[-1]  # the last triple repeats


@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 96), n=st.integers(2, 96), seed=st.integers(0, 2**16))
def test_msign_close_to_exact_polar_and_bounded(m, n, seed):
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(m, n, generator=g)
    A = msign(G)
    P = polar_exact(G)
    assert A.shape == G.shape and A.dtype == torch.float32
    assert torch.linalg.matrix_norm(A, 2) <= 1 + 1e-3
    # Polar Express resolves singular values above ~1e-3 of ||G||_F; a Gaussian matrix
    # can have one far below that, so compare on the well-resolved part of the spectrum.
    U, S, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    keep = S > 3e-3 * S.norm()
    err = (U[:, keep].mT @ (A.double() - P.double()) @ Vh[keep].mT).norm() / keep.sum().sqrt()
    assert err < 1e-3


def test_msign_well_conditioned_error_small():
    torch.manual_seed(0)
    G = torch.randn(300, 100)
    rel = (msign(G) - polar_exact(G)).norm() / polar_exact(G).norm()
    assert rel < 1e-4


def test_msign_batched_equals_loop_and_wide_equals_transpose():
    torch.manual_seed(1)
    G = torch.randn(3, 2, 40, 24)
    batched = msign(G)
    for i in range(3):
        for j in range(2):
            assert torch.allclose(batched[i, j], msign(G[i, j]), atol=1e-5)
    assert torch.allclose(msign(G.mT), batched.mT, atol=1e-5)


def test_gram_space_iteration_matches_direct():
    torch.manual_seed(2)
    G = torch.randn(4, 200, 50)
    X = G * frobenius_scale(G.square().sum(dim=(-2, -1), keepdim=True))
    Q = polar_express_gram(X.mT @ X)
    assert torch.allclose(X @ Q, msign(G), atol=1e-4)


def test_msign_rejects_vectors_and_bf16_on_cpu():
    with pytest.raises(ValueError, match="matrix"):
        msign(torch.randn(5))
    with pytest.raises(ValueError, match="GPU"):
        msign(torch.randn(4, 4), dtype=torch.bfloat16)


@pytest.mark.parametrize("shape", [(300, 100), (600, 150)])
def test_restarted_gram_order_is_stable_where_the_one_shot_gram_iteration_is_not(shape):
    g = torch.Generator().manual_seed(4)
    m, n = shape
    G = torch.randn(m, 2, generator=g) @ torch.randn(2, n, generator=g) + 1e-3 * torch.randn(m, n, generator=g)
    X = G * frobenius_scale(G.square().sum())
    one_shot = X @ polar_express_gram(X.mT @ X)
    assert torch.linalg.matrix_norm(one_shot, 2) > 10  # the failure the restart exists for
    direct, gram = msign(G, method="direct"), msign(G, method="gram")
    assert torch.linalg.matrix_norm(gram, 2) <= 1 + 1e-3
    assert (gram - direct).norm() <= 2e-3 * direct.norm()


def test_gram_steps_can_be_split():
    torch.manual_seed(5)
    G = torch.randn(2, 90, 30)
    X = G * frobenius_scale(G.square().sum(dim=(-2, -1), keepdim=True))
    Q1 = polar_express_gram(X.mT @ X, stop=4)
    Y = X @ Q1
    Q2 = polar_express_gram(Y.mT @ Y, start=4)
    assert torch.allclose(Y @ Q2, X @ polar_express_gram(X.mT @ X), atol=1e-5)
    with pytest.raises(ValueError, match="start"):
        polar_express_gram(X.mT @ X, start=10)


def test_default_msign_is_bounded_on_nearly_low_rank_input():
    g = torch.Generator().manual_seed(3)
    G = torch.randn(300, 2, generator=g) @ torch.randn(2, 100, generator=g) + 1e-3 * torch.randn(300, 100, generator=g)
    assert torch.linalg.matrix_norm(msign(G), 2) <= 1 + 1e-3


# --- bfloat16 precision (the released numerics) -------------------------------------------

from mwm.optim.msign import check_precision, msign_bf16, round_bf16  # noqa: E402


def _bf16_rel(A, B):
    return float((A - B).norm() / B.norm())


def test_emulated_bf16_gemm_matches_a_true_bf16_gemm():
    # GPU-style bf16 GEMM: bf16 operands, float32 accumulation, bf16 result. The
    # emulation rounds a float32 product of bf16-exact operands; a true bf16 matmul
    # may accumulate in another order, so allow one bf16 ulp on a few entries.
    g = torch.Generator().manual_seed(3)
    for k in (16, 64):
        A = torch.randn(4, 24, k, generator=g).bfloat16()
        B = torch.randn(4, k, 20, generator=g).bfloat16()
        true = (A @ B).float()
        emu = round_bf16(A.float() @ B.float())
        diff = (true - emu).abs()
        ulp = true.abs() * 2.0**-7
        assert bool((diff <= ulp + 1e-30).all())
        assert float((diff > 0).float().mean()) <= 0.01
        # and rounding is really to bf16: a float32 product differs from both
        assert not torch.equal(A.float() @ B.float(), emu)


@pytest.mark.parametrize("shape", [(16, 16), (64, 64), (192, 64), (32, 96)])
def test_emulated_bf16_msign_is_close_to_true_bf16(shape):
    g = torch.Generator().manual_seed(11)
    G = torch.randn(4, *shape, generator=g)
    native = msign_bf16(G, native=True)
    cpu_like = msign_bf16(G, scalars="bfloat16")  # PyTorch CPU narrows the scalars of add_
    exact = polar_exact(G)
    bf16_error = _bf16_rel(native, exact)
    assert 3e-3 < bf16_error < 6e-2  # bfloat16 resolution, far from float32's
    # The emulation and true bf16 differ only by rare rounding flips (matmul
    # accumulation order) that the iteration carries on: below bf16's own error, and
    # the same distance from the exact polar factor.
    assert _bf16_rel(cpu_like, native) < bf16_error
    assert _bf16_rel(cpu_like, exact) == pytest.approx(bf16_error, rel=0.2)
    # GPU semantics (unnarrowed scalars) is another bf16 iterate of the same accuracy
    assert 3e-3 < _bf16_rel(msign_bf16(G), exact) < 6e-2
    assert cpu_like.dtype == torch.float32 and cpu_like.shape == G.shape


def test_bf16_precision_through_msign_and_float32_control():
    g = torch.Generator().manual_seed(5)
    G = torch.randn(2, 96, 32, generator=g)
    exact = polar_exact(G)
    assert torch.equal(msign(G, precision="bfloat16"), msign_bf16(G))
    assert _bf16_rel(msign(G, precision="bfloat16"), exact) > 100 * _bf16_rel(msign(G, precision="float32"), exact)
    # wide input: the same as the transpose of the tall one
    assert torch.equal(msign(G.mT, precision="bfloat16"), msign(G, precision="bfloat16").mT)
    with pytest.raises(ValueError, match="precision"):
        msign(G, precision="float16")
    with pytest.raises(ValueError, match="precision"):
        check_precision("bf16")


def test_bf16_msign_of_zero_is_zero_as_released():
    # the released code divides by ||x||_F without an epsilon and then nan_to_num's the result
    assert torch.equal(msign_bf16(torch.zeros(3, 8, 4)), torch.zeros(3, 8, 4))


def test_bf16_precision_threads_through_dual_ascent_retraction_and_optimizer():
    from mwm.optim.dual_ascent import dual_ascent, manifold_muon_update
    from mwm.optim.manifolds import get_manifold, rms
    from mwm.optim.muon import ManifoldMuon
    from mwm.optim.solvers import SolverSettings

    g = torch.Generator().manual_seed(7)
    W = polar_exact(torch.randn(3, 96, 32, generator=g))
    G = torch.randn(3, 96, 32, generator=g)
    mf = get_manifold("stiefel")
    res = {p: dual_ascent(W, G, mf, alpha=0.1, steps=10, precision=p) for p in ("float32", "bfloat16")}
    # the bf16 direction differs from the float32 one at bf16 resolution, not more
    rel = float((res["bfloat16"].A - res["float32"].A).norm() / res["float32"].A.norm())
    assert 1e-3 < rel < 0.1
    with pytest.raises(ValueError, match="gram"):
        dual_ascent(W, G, mf, method="gram", precision="bfloat16")
    eye = torch.eye(32)
    for p, lo, hi in (("float32", 0, 1e-5), ("bfloat16", 1e-4, 5e-2)):
        W1 = manifold_muon_update(W, G, "stiefel", eta=0.1, steps=5, precision=p)
        resid = float(rms(W1.mT @ W1 - eye).max())
        assert lo <= resid < hi, (p, resid)
    w = torch.nn.Parameter(W[0].clone())
    with pytest.raises(ValueError, match="precision"):
        SolverSettings.defaults(precision="half")
    opt = ManifoldMuon([{"params": [w], "manifold": "stiefel"}], solver=SolverSettings.defaults(precision="bfloat16"))
    w.grad = G[0].clone()
    opt.step()
    assert bool(torch.isfinite(w).all()) and not torch.equal(w.detach(), W[0])
