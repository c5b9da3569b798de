import pytest
import torch
from hypothesis import given, settings, strategies as st

from mwm.msign import coefficients, msign, polar_exact, polar_express_gram, frobenius_scale, POLAR_EXPRESS_COEFFS


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
