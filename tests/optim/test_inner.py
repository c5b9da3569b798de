"""mwm.optim.inner: what the inner solvers share (checks, start multiplier, tolerance, result)."""

import pytest
import torch

from mwm.optim.inner import Tolerance, check_inputs, check_iterations, result, start_multiplier, tall_pair
from mwm.optim.manifolds import get_manifold


def test_checks_name_what_is_wrong():
    with pytest.raises(ValueError, match="ADMM needs steps >= 1, got 0"):
        check_iterations("ADMM", 0, ())
    with pytest.raises(ValueError, match="snapshot iteration 6 is outside 1..5"):
        check_iterations("dual ascent", 5, (6,))
    assert check_iterations("x", 5, (3, 1, 3)) == [1, 3]
    with pytest.raises(ValueError, match="shapes differ"):
        check_inputs(torch.zeros(4, 2), torch.zeros(2, 4))
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        check_inputs(torch.zeros(4, 2), torch.full((4, 2), float("nan")))


def test_tall_pair_transposes_wide_matrices_and_widens_half_precision():
    W, G = torch.randn(2, 3, 5).bfloat16(), torch.randn(2, 3, 5)
    Wt, Gt, transposed = tall_pair(W, G)
    assert transposed and Wt.shape == (2, 5, 3) and Wt.dtype == Gt.dtype == torch.float32


def test_start_multiplier_cold_warm_and_scaled():
    torch.manual_seed(0)
    mf = get_manifold("dgram")
    Wt, Gt = torch.randn(3, 8, 4), torch.randn(3, 8, 4)
    cold = start_multiplier(mf, Wt, Gt)
    K = Wt.mT @ Gt
    expected = -0.25 * (K + K.mT)
    expected.diagonal(dim1=-2, dim2=-1).zero_()  # DGram's projector keeps the off-diagonal part
    assert torch.allclose(cold, expected) and torch.equal(cold, cold.mT)
    L0 = torch.randn(3, 4, 4)
    warm = start_multiplier(mf, Wt, Gt, L0)
    sym = 0.5 * (L0 + L0.mT)
    sym.diagonal(dim1=-2, dim2=-1).zero_()
    assert torch.allclose(warm, sym)
    assert torch.allclose(start_multiplier(mf, Wt, Gt, L0, scale=torch.tensor(2.0)), sym / 2)
    with pytest.raises(ValueError,
                       match=r"Lambda0 of shape \(3, 5, 5\) does not match the multiplier shape \(3, 4, 4\)"):
        start_multiplier(mf, Wt, Gt, torch.zeros(3, 5, 5))


def test_tolerance_keeps_each_matrix_at_its_stopping_iteration():
    stop = Tolerance(0.1, torch.Size([3]), steps=10, device="cpu")
    A1 = torch.full((3, 2, 2), 1.0)
    assert stop.update(1, torch.tensor([0.05, 0.5, 0.5]), lambda: A1) is False
    step = stop.freeze(torch.ones(3, 2, 2))
    assert step[0].abs().sum() == 0 and step[1:].eq(1).all()  # the stopped matrix's multiplier stays
    A2 = torch.full((3, 2, 2), 2.0)
    assert stop.update(2, torch.tensor([0.5, 0.05, 0.05]), lambda: A2) is True
    out = result(torch.full((3, 2, 2), 9.0), stop, None, 2, None, {}, transposed=False)
    assert out.A[0].eq(1).all() and out.A[1:].eq(2).all() and out.stopped.tolist() == [1, 2, 2]


def test_result_turns_directions_back_to_the_callers_orientation():
    A = torch.randn(2, 5, 3)
    out = result(A, None, None, 4, [torch.ones(2), torch.zeros(2)], {2: A}, transposed=True)
    assert out.A.shape == (2, 3, 5) and out.snapshots[2].shape == (2, 3, 5)
    assert out.violations.shape == (2, 2) and out.iterations == 4 and out.stopped is None


def test_a_solver_called_without_settings_uses_the_schemas_defaults():
    from mwm.config import defaults
    from mwm.optim.dual_ascent import dual_ascent
    from mwm.optim.inner import or_default
    from mwm.optim.solvers import admm

    train = defaults("train")
    assert (or_default(None, "dual_ascent_alpha") == train["dual_ascent_alpha"]
            and or_default(0.3, "dual_ascent_alpha") == 0.3)
    torch.manual_seed(0)
    W, G = torch.linalg.qr(torch.randn(24, 6))[0], torch.randn(24, 6)
    a = dual_ascent(W, G, "stiefel")
    b = dual_ascent(W, G, "stiefel", alpha=train["dual_ascent_alpha"], steps=train["dual_ascent_steps"])
    assert a.iterations == train["dual_ascent_steps"] and torch.equal(a.A, b.A)
    c = admm(W, G, "stiefel")
    d = admm(W, G, "stiefel", rho=train["admm_rho"], steps=train["dual_ascent_steps"])
    assert torch.equal(c.A, d.A)
