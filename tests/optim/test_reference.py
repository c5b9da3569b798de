"""ManifoldMuon's banked updates against an independent float64 transcription of the
paper's equations (tests/reference.py: unbatched NumPy, msign by SVD).

The optimizer is the path training takes: banks of equal width (zero-padded heights,
wide matrices in their tall orientation), Stiefel and DGram matrices of one bank in
one mixed solve, the Gram evaluation order where the bank is at least 3 times as tall
as wide and the direct one elsewhere, msign by float32 Polar Express.

Tolerance. The two sides differ by float32 rounding carried through 20 dual-ascent
iterations and two steps, and by Polar Express's own error (10 steps against the
exact polar factor); on these tall, well-conditioned problems (no square matrices,
whose dual ascent amplifies rounding to 0.1 of the update, see docs/findings.md) that measured
at most 2e-6 relative (Frobenius, per matrix). Another CPU changes float32 rounding by
a few ulps per operation (other BLAS kernels, summation orders, FMA or not), which
these iterations carry on without amplifying much; TOL = 1e-4 leaves 50x for that.
A wrong model (a wrong manifold, DGram retraction or step size in the updates;
test_a_wrong_model_fails) moves some matrix by over 5e-3, 50x TOL, so the
comparison can fail.
"""

import numpy as np
import pytest
import torch

import reference as ref
from mwm.optim.muon import ManifoldMuon
from mwm.optim.solvers import SolverSettings

#: max relative Frobenius distance, per matrix, between optimizer and reference (see above)
TOL = 1e-4

# width-8 bank: 24 x 8, the wide 8 x 24 and 20 x 8 zero-padded to 24 x 8 (Gram order, m = 3n);
# width-12 bank: 20 x 12 and the wide 12 x 20 (direct order, m < 3n)
SHAPES = [(24, 8), (8, 24), (20, 8), (20, 12), (12, 20)]
#: per-matrix manifolds of the "mixed" case: each bank holds Stiefel and DGram matrices
#: (Stiefel and DGram groups share a bank at equal padded height: one mixed solve)
MIXED = ["stiefel", "dgram", "dgram", "stiefel", "dgram"]
ETA, MU, ALPHA, DUAL_STEPS, STEPS = 0.05, 0.95, 0.1, 20, 2


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(assignment: str, kind: str, seed: int = 0, ref_manifolds=None, ref_kind=None, ref_alpha=ALPHA):
    """Relative distances of each matrix between ManifoldMuon and the reference: of the
    initial weights, and after STEPS updates from them (with the reference given
    another model by ``ref_*``)."""
    g = torch.Generator().manual_seed(seed)
    raw = [torch.randn(s, generator=g) for s in SHAPES]
    params = [torch.nn.Parameter(r.clone()) for r in raw]
    manifolds = MIXED if assignment == "mixed" else [assignment] * len(params)
    groups: dict[str, list] = {}
    for p, name in zip(params, manifolds):
        groups.setdefault(name, []).append(p)
    opt = ManifoldMuon([dict(params=ps, manifold=name) for name, ps in groups.items()], lr=ETA, momentum=MU,
                       nesterov=True, dgram_retraction=kind,
                       solver=SolverSettings.defaults(alpha=ALPHA, steps=DUAL_STEPS, precision="float32"))

    # the optimizer moved its weights onto the manifolds at construction
    Ws = [p.detach().double().numpy() for p in params]
    init_err = [_rel(W, ref.initial_weight(r.double().numpy(), name, kind)) for W, r, name in zip(Ws, raw, manifolds)]
    # the updates start from those weights, so a wrong model below is wrong in the updates only
    ref_manifolds = ref_manifolds or manifolds
    ref_kind = ref_kind or kind
    momenta = [ref.NesterovMomentum(MU) for _ in params]
    for _ in range(STEPS):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()
        Ws = [ref.manifold_muon_step(W, mom(grad.double().numpy()), name, ref_kind, ETA, ref_alpha, DUAL_STEPS)
              for W, mom, grad, name in zip(Ws, momenta, grads, ref_manifolds)]
    step_err = [_rel(p.detach().double().numpy(), W) for p, W in zip(params, Ws)]
    return init_err, step_err


@pytest.mark.parametrize("kind", ref.RETRACTIONS)
@pytest.mark.parametrize("assignment", ref.MANIFOLDS + ("mixed",))
def test_optimizer_matches_the_reference(one_thread, assignment, kind):
    for seed in range(2):
        init_err, step_err = run(assignment, kind, seed)
        assert max(init_err) < TOL, (seed, init_err)
        assert max(step_err) < TOL, (seed, step_err)


@pytest.mark.parametrize("assignment,kind,wrong", [
    ("stiefel", "paper", dict(ref_manifolds=["dgram"] * len(SHAPES))),
    ("dgram", "paper", dict(ref_manifolds=["stiefel"] * len(SHAPES))),
    ("oblique", "paper", dict(ref_manifolds=["dgram"] * len(SHAPES))),
    ("mixed", "paper", dict(ref_manifolds=["dgram" if m == "stiefel" else "stiefel" for m in MIXED])),
    ("dgram", "paper", dict(ref_kind="colnorm")),
    ("dgram", "colnorm", dict(ref_kind="paper")),
    ("stiefel", "paper", dict(ref_alpha=2 * ALPHA)),
    ("dgram", "paper", dict(ref_alpha=2 * ALPHA)),
])
def test_a_wrong_model_fails(one_thread, assignment, kind, wrong):
    # the comparison above must be able to fail: the reference updates with a wrong
    # manifold, DGram retraction or step size end far outside TOL
    _, step_err = run(assignment, kind, **wrong)
    assert max(step_err) > 10 * TOL, step_err
