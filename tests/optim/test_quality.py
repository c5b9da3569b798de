"""mwm.optim.quality: the inner solve's alignment and violation beside a converged solve of the same pair."""

import pytest
import torch

from mwm.optim.manifolds import get_manifold
from mwm.optim.muon import ManifoldMuon
from mwm.optim.quality import GAP_TOL, VIOLATION_TOL, converged_solve, duality_gap, quality_rows, solve_quality
from mwm.optim.solvers import SolverSettings, solve


def pair(m, n, manifold, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=torch.float64))
    if manifold == "dgram":
        Q = Q * torch.logspace(-1, 0, n, dtype=torch.float64) * scale
    U = torch.randn(m, 2, generator=g, dtype=torch.float64) @ torch.randn(2, n, generator=g, dtype=torch.float64)
    U = (U + 0.3 * torch.randn(m, n, generator=g, dtype=torch.float64)) * 1e-3
    return Q.float(), U.float()


def align(U, A):
    return float((U * A).sum() / torch.linalg.matrix_norm(U, "nuc"))


@pytest.mark.slow
@pytest.mark.parametrize("manifold,scale,shape", [("stiefel", 1.0, (192, 64)), ("dgram", 1.0, (256, 64)),
                                                   ("dgram", 10.0, (64, 64)), ("dgram", 100.0, (192, 64))])
def test_the_reference_meets_its_tolerance_and_the_optimum_within_it(manifold, scale, shape):
    W, U = pair(*shape, manifold, scale)
    long = solve(W.double(), U.double(), manifold, SolverSettings.defaults(solver="admm", rho=2.0, steps=500,
                                                                          normalize=True))
    q = solve_quality(W[None], U[None], long.A.float()[None], manifold)
    assert abs(float(q["gap_converged"][0])) <= GAP_TOL
    assert float(q["violation_converged"][0]) <= VIOLATION_TOL
    assert float(q["violation"][0]) < 1e-5  # the long solve is feasible
    assert float(q["alignment_converged"][0]) == pytest.approx(align(U.double(), long.A), abs=2 * GAP_TOL)


def test_the_gap_bounds_every_feasible_direction_and_closes_at_the_optimum():
    W, U = pair(192, 64, "dgram", 30.0)
    Wn = (W / W.norm(dim=0).max()).double()[None]
    G = U.double()[None]
    long = solve(Wn, G, "dgram", SolverSettings.defaults(solver="admm", rho=2.0, steps=500))
    short = solve(Wn, G, "dgram", SolverSettings.defaults(solver="admm", rho=2.0, steps=3))
    # any multiplier's dual value bounds the optimum: the short solve's multiplier leaves a positive gap
    # above the optimum's alignment, the long solve's multiplier none to speak of
    nuc = float(torch.linalg.matrix_norm(G, "nuc")[0])
    opt = float((G * long.A).sum()) / nuc
    dual_short = float(duality_gap(Wn, G, long.A, short.Lambda)[0]) + opt
    assert dual_short >= opt - 1e-9 and dual_short - opt > 1e-3
    assert abs(float(duality_gap(Wn, G, long.A, long.Lambda)[0])) < 1e-6
    A, gap = converged_solve(Wn.float(), G.float(), "dgram")
    assert abs(float(gap[0])) <= GAP_TOL and float((G.float() * A).sum()) / nuc == pytest.approx(opt, abs=2 * GAP_TOL)


def test_alignment_and_violation_are_scale_free_and_read_the_direction_given():
    W, U = pair(192, 64, "dgram", 1.0)
    A = solve(W, U, "dgram", SolverSettings.defaults()).A
    one = solve_quality(W[None], U[None], A[None], "dgram")
    big = solve_quality(50 * W[None], U[None], A[None], "dgram")
    for k in ("alignment", "alignment_converged", "violation", "violation_converged"):
        assert float(big[k][0]) == pytest.approx(float(one[k][0]), rel=1e-3, abs=1e-6), k
    assert float(big["scale"][0]) == pytest.approx(50 * float(one["scale"][0]), rel=1e-6)
    # msign(U) ignores the constraint: alignment 1, above what any feasible direction reaches
    free = solve_quality(W[None], U[None], torch.linalg.svd(U, full_matrices=False)[0].mm(
        torch.linalg.svd(U, full_matrices=False)[2])[None], "dgram")
    assert float(free["alignment"][0]) == pytest.approx(1.0, abs=1e-4)
    assert float(free["violation"][0]) > 10 * float(free["violation_converged"][0])


def test_rows_bank_by_shape_change_nothing_and_skip_plain_muon():
    torch.manual_seed(0)
    shapes = {"h.0.attn.c_attn.weight": (64, 192), "h.0.attn.c_proj.weight": (64, 64), "h.0.mlp.c_fc.weight": (256, 64),
              "h.0.mlp.c_proj.weight": (64, 256), "h.1.mlp.c_fc.weight": (256, 64)}
    kinds = {"h.0.attn.c_attn.weight": "stiefel", "h.0.attn.c_proj.weight": "dgram", "h.0.mlp.c_fc.weight": "dgram",
             "h.0.mlp.c_proj.weight": "stiefel", "h.1.mlp.c_fc.weight": "none"}
    consumed, directions = {}, {}
    for i, (name, (m, n)) in enumerate(shapes.items()):
        W, U = pair(max(m, n), min(m, n), "stiefel" if kinds[name] == "none" else kinds[name], 3.0, seed=i)
        W, U = (W, U) if m >= n else (W.T, U.T)
        consumed[name] = (kinds[name], W, U)
        directions[name] = solve(W, U, kinds[name] if kinds[name] != "none" else "stiefel",
                                 SolverSettings.defaults()).A
    rows = quality_rows(consumed, directions, step=7)
    assert [r["name"] for r in rows] == sorted(n for n in shapes if kinds[n] != "none")
    assert {(r["module"], r["matrix"], r["layer"], r["step"]) for r in rows} == {
        ("attn", "c_attn", 0, 7), ("attn", "c_proj", 0, 7), ("mlp", "c_fc", 0, 7), ("mlp", "c_proj", 0, 7)}
    for r in rows:  # each alone: the same direction measured, a reference within the tolerance of its bank's
        manifold, W, U = consumed[r["name"]]
        alone = solve_quality(W[None], U[None], directions[r["name"]][None], manifold)
        for k in ("scale", "alignment", "violation"):
            assert r[k] == pytest.approx(float(alone[k][0]), rel=1e-4, abs=1e-6), (r["name"], k)
        assert abs(r["gap_converged"]) <= GAP_TOL and r["violation_converged"] <= VIOLATION_TOL
        assert r["alignment_converged"] == pytest.approx(float(alone["alignment_converged"][0]), abs=2 * GAP_TOL)


def test_asking_for_the_directions_changes_no_step():
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 48), (32, 32)]

    def make():
        g = torch.Generator().manual_seed(1)
        ps = [torch.nn.Parameter(torch.randn(*s, generator=g) / 8) for s in shapes]
        groups = [{"params": ps[:2], "manifold": "dgram", "names": ["a", "b"]},
                  {"params": ps[2:], "manifold": "stiefel", "names": ["c"]}]
        return ps, ManifoldMuon(groups, lr=0.5)

    (pa, oa), (pb, ob) = make(), make()
    for step in range(3):
        g = torch.Generator().manual_seed(10 + step)
        grads = [torch.randn(*s, generator=g) for s in shapes]
        for ps in (pa, pb):
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
        oa.step()
        directions: dict = {}
        consumed = ob.step_with_inputs(directions)
        assert set(directions) == set(consumed) == {"a", "b", "c"}
        assert all(directions[k].shape == consumed[k][1].shape for k in directions)
        for p, q in zip(pa, pb):
            assert torch.equal(p, q)
    manifold = get_manifold("dgram")
    assert float(manifold.constraint_residual(pb[0].detach())) < 1e-4


def test_a_pair_the_reference_cannot_solve_gets_nan_and_its_bank_mates_their_reference():
    W, U = pair(64, 32, "dgram", 3.0)
    W2, U2 = pair(64, 32, "dgram", 3.0, seed=1)
    U2 = U2.clone()
    U2[0, 0] = float("nan")
    A, gap = converged_solve(torch.stack([W / W.norm(dim=0).max(), W2 / W2.norm(dim=0).max()]),
                             torch.stack([U, U2]), "dgram")
    assert bool(torch.isfinite(A[0]).all()) and abs(float(gap[0])) <= GAP_TOL
    assert bool(torch.isnan(A[1]).all()) and bool(torch.isnan(gap[1]))


def test_the_exact_projection_is_the_msign_one_where_that_is_accurate():
    from mwm.optim.solvers import clip_exact, clip_spectral
    Z = torch.randn(3, 48, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    C = clip_exact(Z)
    assert float(torch.linalg.matrix_norm(C, 2).max()) <= 1 + 1e-12
    assert torch.allclose(C, clip_spectral(Z, msign_steps=30), atol=1e-3)
