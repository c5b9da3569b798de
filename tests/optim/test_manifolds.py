import math
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mwm.optim.manifolds import (MANIFOLDS, POLARS, cap_column_norms, get_manifold, newton_schulz_steps,
                                 retract_dgram_svd)

SHAPES = [(48, 16), (32, 32), (16, 48), (3, 40, 12)]


def on_manifold_tol(name):
    return 5e-5 if name != "stiefel" else 5e-4  # Polar Express vs exact algebra


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name,retraction", [("stiefel", "paper"), ("dgram", "paper"), ("dgram", "colnorm"),
                                             ("oblique", "paper")])
def test_retraction_lands_on_manifold(shape, name, retraction):
    torch.manual_seed(0)
    mf = get_manifold(name, retraction)
    W = mf.retract(torch.randn(*shape) * 0.3 + 0.1)
    assert W.shape == torch.Size(shape)
    assert mf.constraint_residual(W).max() < on_manifold_tol(name)
    # retracting a point of the manifold again stays on it
    assert mf.constraint_residual(mf.retract(W)).max() < on_manifold_tol(name)


def test_stiefel_singular_values_are_one():
    W = get_manifold("stiefel").init(torch.randn(64, 24))
    s = torch.linalg.svdvals(W)
    assert torch.allclose(s, torch.ones_like(s), atol=1e-3)


def _dgram_point(m, n, norms, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(m, n, generator=g))
    return Q * torch.tensor(norms, dtype=torch.float32)


def test_paper_dgram_retraction_sorts_column_norms():
    W = _dgram_point(10, 4, [0.5, 3.0, 1.0, 2.0])
    out = get_manifold("dgram", "paper").retract(W)
    assert torch.allclose(out.norm(dim=0), torch.tensor([3.0, 2.0, 1.0, 0.5]), atol=1e-4)
    assert torch.allclose(out, retract_dgram_svd(W), atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(4, 60), n=st.integers(2, 30), seed=st.integers(0, 10_000),
       lo=st.floats(-1.0, 0.5), span=st.floats(0.0, 2.0))
def test_colnorm_retraction_fixes_points_of_dgram(m, n, seed, lo, span):
    m = max(m, n)
    norms = torch.logspace(lo, lo + span, n)[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    W = _dgram_point(m, n, norms.tolist(), seed)
    out = get_manifold("dgram", "colnorm").retract(W)
    assert (out - W).norm() / W.norm() < 1e-5
    # from a nearby point it lands on DGram, keeping the column norms close
    near = W + 1e-3 * norms.mean() * torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 1))
    back = get_manifold("dgram", "colnorm").retract(near)
    assert get_manifold("dgram").constraint_residual(back) < 1e-5
    assert torch.allclose(back.norm(dim=0), near.norm(dim=0), rtol=1e-4)


def test_dgram_paper_retraction_matches_svd_reference():
    torch.manual_seed(3)
    W = _dgram_point(96, 32, torch.logspace(-0.5, 1.0, 32).tolist()) + 0.01 * torch.randn(96, 32)
    ref = retract_dgram_svd(W)
    assert (get_manifold("dgram", "paper").retract(W) - ref).norm() / ref.norm() < 1e-5


def test_tangent_dimensions():
    m, n = 2304, 768
    assert get_manifold("stiefel").tangent_dim(m, n) == m * n - n * (n + 1) // 2
    assert get_manifold("dgram").tangent_dim(m, n) == m * n - n * (n - 1) // 2
    assert get_manifold("oblique").tangent_dim(m, n) == m * n - n
    # DGram has exactly n more degrees of freedom than Stiefel; wide transposes
    assert get_manifold("dgram").tangent_dim(n, m) - get_manifold("stiefel").tangent_dim(n, m) == n


def test_projectors():
    S = torch.arange(9.0).reshape(3, 3)
    S = S + S.T
    assert torch.equal(get_manifold("stiefel").project(S), S)
    assert torch.equal(get_manifold("dgram").project(S).diagonal(), torch.zeros(3))
    assert torch.equal(get_manifold("oblique").project(S), torch.diag(S.diagonal()))
    assert torch.equal(get_manifold("dgram").project(S) + get_manifold("oblique").project(S), S)


def test_tangent_violation_zero_for_tangent_vector():
    torch.manual_seed(4)
    mf = get_manifold("stiefel")
    W = mf.init(torch.randn(40, 10))
    B = torch.randn(10, 10)
    A = W @ (B - B.T)  # W times a skew matrix is tangent to Stiefel
    assert mf.tangent_violation(W, A) < 1e-5
    assert mf.tangent_violation(W, W) > 0.1  # the normal direction is not


def test_bad_manifold_name_is_clear():
    with pytest.raises(ValueError, match="unknown manifold 'sphere'.*stiefel, dgram, oblique"):
        get_manifold("sphere")
    with pytest.raises(ValueError, match="unknown DGram retraction"):
        get_manifold("dgram", "qr")
    assert set(MANIFOLDS) == {"stiefel", "dgram", "oblique"}


@pytest.mark.parametrize("shape", SHAPES)
def test_cap_column_norms_clips_dgram_singular_values_and_keeps_the_constraint(shape):
    # the intervention of grid.intervention: on DGram the singular values are the column norms
    torch.manual_seed(1)
    dg = get_manifold("dgram")
    W = dg.retract(torch.randn(*shape) * 0.5)
    T = W if W.shape[-2] >= W.shape[-1] else W.mT
    norms = T.norm(dim=-2)
    cap = float(norms.median())
    C = cap_column_norms(W, cap)
    Ct = C if C.shape[-2] >= C.shape[-1] else C.mT
    assert torch.linalg.matrix_norm(C, ord=2).max() <= cap * (1 + 1e-4)
    assert dg.constraint_residual(C).max() < on_manifold_tol("dgram")  # off(W^T W) = 0 kept
    below = norms <= cap
    assert torch.allclose(Ct.norm(dim=-2)[below], norms[below])  # columns under the cap untouched
    assert torch.allclose(Ct.norm(dim=-2)[~below], torch.full_like(norms[~below], cap), rtol=1e-5)
    assert torch.equal(cap_column_norms(W, float(norms.max()) * 2), W)  # a cap that never bites changes nothing


def test_cap_column_norms_refuses_a_cap_that_is_not_positive():
    for cap in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="cap"):
            cap_column_norms(torch.ones(4, 2), cap)


@pytest.mark.parametrize("polar", POLARS)
@pytest.mark.parametrize("retraction", ["paper", "colnorm"])
def test_dgram_retraction_keeps_the_singular_values_of_a_nearly_singular_weight(retraction, polar):
    # a float32 Gram's small eigenvalues are noise: taken to the power -1/2 in float32 or float64 they
    # once blew a nearly singular attention c_proj up from sigma_max 134 to 1050 in one retraction
    # (config/sweep.yaml, All DGram at eta 0.32); the retraction now redoes such weights in float64
    torch.manual_seed(3)
    n = 64
    U, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    sigma = torch.logspace(math.log10(134.0), -6, n, dtype=torch.float64)
    sigma[-2:] = 0.0  # rank deficient, as the weight before the blow-up
    W = ((U * sigma) @ V.mT).float()
    out = get_manifold("dgram", retraction, polar).retract(W)
    assert torch.isfinite(out).all()
    top = float(torch.linalg.matrix_norm(out.double(), ord=2))
    assert top <= 134.0 * (1 + 1e-3)  # the retraction never grows sigma_max (the growth bound's premise)
    if retraction == "paper":
        assert top == pytest.approx(float(torch.linalg.matrix_norm(retract_dgram_svd(W.double()), ord=2)), rel=1e-4)


@pytest.mark.parametrize("retraction", ["paper", "colnorm"])
def test_only_the_unresolved_matrices_of_a_bank_go_to_svd_and_by_one_decomposition(retraction, monkeypatch):
    """A bank with one nearly singular matrix: the others keep the eigh retraction (bit for bit as
    alone), the singular one alone is redone by one SVD (no second one for its singular values)."""
    g = torch.Generator().manual_seed(5)
    n = 32
    U, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    sigma = torch.logspace(1, -7, n, dtype=torch.float64)  # Gram spread 1e16: past what eigh resolves
    hard = ((U * sigma) @ U.mT).float()
    easy = torch.randn(2, n, n, generator=g) * 0.1
    bank = torch.stack([easy[0], hard, easy[1]])
    M = get_manifold("dgram", retraction)
    alone = M.retract(easy)
    calls = []
    real_svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda A, **kw: calls.append(tuple(A.shape)) or real_svd(A, **kw))
    monkeypatch.setattr(torch.linalg, "svdvals", lambda A: pytest.fail("a second decomposition"))
    out = M.retract(bank)
    assert calls == [(1, n, n)]
    assert torch.equal(out[0], alone[0]) and torch.equal(out[2], alone[1])
    monkeypatch.setattr(torch.linalg, "svd", real_svd)
    ref = retract_dgram_svd(hard.double()) if retraction == "paper" else None
    if ref is not None:
        assert torch.allclose(out[1].double(), ref, rtol=1e-5, atol=1e-6)
    gram = out[1].double().mT @ out[1].double()
    off = gram - torch.diag_embed(gram.diagonal())
    assert float(off.norm() / gram.norm()) < 1e-5  # on the manifold


def _spread_bank(g: torch.Generator, m: int, n: int, kappas) -> torch.Tensor:
    """One float64 matrix per ``kappa``: orthonormal columns scaled 1..kappa (log-spaced), mixed by a
    random rotation and nudged off DGram, so its Gram is full and conditioned ``kappa^2``."""
    out = []
    for kappa in kappas:
        Q = torch.linalg.qr(torch.randn(m, n, dtype=torch.float64, generator=g)).Q
        R = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g)).Q
        out.append((Q * torch.logspace(0, math.log10(kappa), n, dtype=torch.float64)) @ R
                   + 1e-2 * torch.randn(m, n, dtype=torch.float64, generator=g))
    return torch.stack(out)


@pytest.mark.parametrize("retraction", ["paper", "colnorm"])
def test_newton_schulz_polar_is_the_eigh_retraction_to_float64_rounding(retraction):
    """The batched solve gives the eigh form's retraction: in float64 to its rounding (kappa up to 1e4, one
    bank mixing well and badly conditioned matrices, so the worst sets the steps for all), and in float32
    bit for bit or within its last place."""
    g = torch.Generator().manual_seed(11)
    X = _spread_bank(g, 96, 32, (1.0, 10.0, 100.0, 1e4))
    eigh = get_manifold("dgram", retraction, "eigh").retract(X)
    ns = get_manifold("dgram", retraction, "newton-schulz").retract(X)
    def rel(a, b):
        return (a - b).norm(dim=(-2, -1)) / b.norm(dim=(-2, -1))

    # eigh loses about eps kappa^2 (the Gram's condition): 1e-8 at kappa 1e4, far below float32's place
    assert float(rel(ns, eigh).amax()) < 1e-8 and float(rel(ns, eigh)[:3].amax()) < 1e-12
    if retraction == "paper":  # against the released SVD form: as accurate as eigh (both square kappa)
        ref = retract_dgram_svd(X)
        assert bool((rel(ns, ref) <= 2 * rel(eigh, ref) + 1e-13).all()), (rel(ns, ref), rel(eigh, ref))
    X32 = X.float()
    a = get_manifold("dgram", retraction, "eigh").retract(X32)
    b = get_manifold("dgram", retraction, "newton-schulz").retract(X32)
    assert b.dtype == torch.float32 and float(((a - b).norm() / a.norm())) < 1e-6
    gram = b.double().mT @ b.double()
    d = gram.diagonal(dim1=-2, dim2=-1).sqrt()
    cos = gram / (d.unsqueeze(-1) * d.unsqueeze(-2))
    assert float((cos - torch.diag_embed(cos.diagonal(dim1=-2, dim2=-1))).abs().amax()) < 1e-5  # on DGram


def test_newton_schulz_steps_follow_the_smallest_eigenvalue():
    steps = [newton_schulz_steps(mu) for mu in (1.0, 0.5, 1e-2, 1e-4, 1e-10)]
    assert steps[0] == 0 and steps == sorted(steps) and steps[-1] < 60
    # each eigenvalue's product p = z y after that many steps is 1 to the tolerance, and not one step before
    for mu, k in zip((0.5, 1e-2, 1e-4, 1e-10), steps[1:]):
        p = mu
        for i in range(k):
            before = p
            p *= (3.0 - p) ** 2 / 4.0
        assert 1.0 - p <= 1e-15 < 1.0 - before


def test_an_unknown_polar_solve_is_refused_by_name():
    with pytest.raises(ValueError, match="polar solve 'qr'; choose one of eigh, newton-schulz"):
        get_manifold("dgram", "paper", "qr")
