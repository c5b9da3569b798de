"""How well Manifold Muon's inner solve did, measured while training (``solver.csv``).

At the first training step after each evaluation, for every Stiefel and DGram matrix, on the
pair ``(W, U)`` that step consumed (weight, Nesterov momentum) and the direction ``A`` it took
(``W -> retract(W - eta A)``):

``alignment``
    ``tr(U^T A) / ||U||_*``: how much of the momentum the update follows. 1 is ``A = msign(U)``,
    plain Muon's; the constraint lowers the best reachable value wherever ``U`` has a part
    normal to the manifold, so an alignment is read against ``alignment_converged``, never alone.
``alignment_converged``
    the same for a converged solve of the same pair (:data:`REFERENCE`).
``violation`` / ``violation_converged``
    ``||P(W^T A + A^T W)||_RMS / s``, the tangent violation of each direction at unit scale
    (``s``: the solve scale, a DGram matrix's largest column norm, 1 on Stiefel;
    :func:`mwm.optim.solvers.solve_scale`), so values compare across weight scales.
``scale``
    ``s``; on DGram it is the matrix's ``sigma_max``.

The reference is ADMM on ``W / s`` (:func:`mwm.optim.solvers.scaled_solve`), cold, rho 2,
:data:`REFERENCE_STEPS` iterations in float32 msign: scale-free, and within 0.01 of the
alignment of a 300-iteration solve on Stiefel and DGram pairs of the mini model's shapes at
scales 1-100 (``tests/optim/test_quality.py``), at the cost of one paper solve (20 msign-equivalents).
It is one extra solve per matrix at evaluations only, on banks of equal width zero-padded to
their tallest matrix as the optimizer banks them (a zero row changes no column here).
"""

from __future__ import annotations

import torch

from mwm.optim.assignments import layer_of
from mwm.optim.dual_ascent import as_manifold
from mwm.optim.manifolds import rms, to_tall
from mwm.optim.solvers import SolverSettings, scaled_solve, solve_scale

__all__ = ["QUALITY_COLUMNS", "QUALITY_MANIFOLDS", "REFERENCE_STEPS", "REFERENCE", "reference_settings",
           "solve_quality", "quality_rows"]

QUALITY_COLUMNS = ["step", "name", "layer", "module", "matrix", "manifold", "scale", "alignment",
                   "alignment_converged", "violation", "violation_converged"]
#: The manifolds whose solves are measured (those of the inner problem with a tangent-space constraint
#: the ADMM reference handles exactly; plain Muon's direction is msign(U), alignment 1 by construction).
QUALITY_MANIFOLDS = ("stiefel", "dgram")
#: Iterations of the converged reference.
REFERENCE_STEPS = 10
#: The reference solve's settings (cold, rho 2, float32 msign, scale-normalized).
REFERENCE = dict(solver="admm", rho=2.0, steps=REFERENCE_STEPS, tol=None, warm_start=False, precision="float32",
                 normalize=True)


def reference_settings() -> SolverSettings:
    """:data:`REFERENCE` as :class:`~mwm.optim.solvers.SolverSettings` (the schema's other defaults)."""
    return SolverSettings.defaults(**REFERENCE)


@torch.no_grad()
def solve_quality(W: torch.Tensor, U: torch.Tensor, A: torch.Tensor, manifold) -> dict[str, torch.Tensor]:
    """The columns of :data:`QUALITY_COLUMNS` from ``scale`` on, per matrix of a batch of pairs
    (tall or wide; ``manifold``: a name or one name per matrix, Stiefel and DGram)."""
    mf = as_manifold(manifold)
    s = solve_scale(W, mf)
    ref = scaled_solve(W, U, mf, reference_settings(), s).A
    Wt, Ut = to_tall(W)[0], to_tall(U)[0]
    nuc = torch.linalg.matrix_norm(Ut, "nuc").clamp_min(torch.finfo(Ut.dtype).tiny)
    out = {"scale": s}
    for key, D in (("", A), ("_converged", ref)):
        Dt = to_tall(D)[0]
        X = (Wt / s[..., None, None]).mT @ Dt
        out["alignment" + key] = (Ut * Dt).sum(dim=(-2, -1)) / nuc
        out["violation" + key] = rms(mf.project_(X + X.mT))
    return out


def quality_rows(consumed: dict, directions: dict, step: int) -> list[dict]:
    """Rows of ``solver.csv`` for one step: ``consumed`` as :meth:`mwm.optim.muon.ManifoldMuon.step_with_inputs`
    returns it (``{name: (manifold, W, U)}``), ``directions`` the step direction of each. Pairs are
    measured in banks of equal tall width (Stiefel and DGram together, zero-padded to the tallest), the
    rows in name order."""
    banks: dict[int, list[str]] = {}
    for name, (manifold, W, _) in consumed.items():
        if manifold in QUALITY_MANIFOLDS and name in directions:
            banks.setdefault(to_tall(W)[0].shape[-1], []).append(name)
    rows = []
    for names in banks.values():
        tall = [[to_tall(t)[0].float() for t in (consumed[n][1], consumed[n][2], directions[n])] for n in names]
        height = max(t[0].shape[-2] for t in tall)
        W, U, A = (torch.stack([torch.nn.functional.pad(t[k], (0, 0, 0, height - t[k].shape[-2])) for t in tall])
                   for k in range(3))
        q = {k: v.double().cpu().tolist() for k, v in solve_quality(W, U, A, [consumed[n][0] for n in names]).items()}
        for i, name in enumerate(names):
            rows.append({"step": step, "name": name, "layer": layer_of(name),
                         "module": "attn" if ".attn." in name else "mlp", "matrix": name.split(".")[-2],
                         "manifold": consumed[name][0], **{k: q[k][i] for k in QUALITY_COLUMNS[6:]}})
    return sorted(rows, key=lambda r: r["name"])
