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
``gap_converged``
    the reference's certified duality gap (below).

The reference is a solve run to a stated tolerance, certified by duality (:func:`converged_solve`):
ADMM on ``W / s`` (:func:`mwm.optim.solvers.scaled_solve`'s scaling), cold, rho :data:`REFERENCE_RHO`,
in float64 with the exact (SVD) projection on the spectral-norm ball, continued in chunks of
:data:`REFERENCE_CHUNK` iterations until every matrix of its bank has a duality gap of at most
:data:`GAP_TOL` and a tangent violation of at most :data:`VIOLATION_TOL`, or :data:`REFERENCE_MAX_STEPS`.
The gap ``(||G + 2 W Lambda||_* - tr(G^T A)) / ||G||_*`` bounds, in alignment units, how far the
reference's alignment can be below the optimum: every feasible direction's alignment is at most the
dual value ``||G + 2 W Lambda||_* / ||G||_*`` for any multiplier fixed by ``P``. ``gap_converged``
records it per matrix, so a reference that stopped at the cap says so. The measurement never stops a
run: a pair it cannot solve (non-finite) gets NaN reference columns, which fail a solver check. No
training setting is the reference's: an arm is never checked against itself. Pairs are measured in
banks of one tall shape.
"""

from __future__ import annotations

import torch

from mwm.optim.assignments import layer_of
from mwm.optim.dual_ascent import as_manifold
from mwm.optim.manifolds import rms, to_tall
from mwm.optim.solvers import admm, solve_scale

__all__ = ["QUALITY_COLUMNS", "QUALITY_MANIFOLDS", "REFERENCE_RHO", "REFERENCE_CHUNK",
           "REFERENCE_MAX_STEPS", "GAP_TOL", "VIOLATION_TOL", "duality_gap", "converged_solve", "solve_quality",
           "quality_rows"]

QUALITY_COLUMNS = ["step", "name", "layer", "module", "matrix", "manifold", "scale", "alignment",
                   "alignment_converged", "violation", "violation_converged", "gap_converged"]
#: The manifolds whose solves are measured (those of the inner problem with a tangent-space constraint
#: the ADMM reference handles exactly; plain Muon's direction is msign(U), alignment 1 by construction).
QUALITY_MANIFOLDS = ("stiefel", "dgram")
#: The reference's ADMM penalty.
REFERENCE_RHO = 2.0
#: Iterations between two checks of the stopping rule.
REFERENCE_CHUNK = 10
#: The reference's iteration cap (grown DGram pairs of the mini model need 60-120).
REFERENCE_MAX_STEPS = 300
#: The stopping rule: every matrix's duality gap (alignment units) at most this ...
GAP_TOL = 2e-3
#: ... and its tangent violation at unit weight scale at most this.
VIOLATION_TOL = 1e-3


def duality_gap(Wt: torch.Tensor, Gt: torch.Tensor, A: torch.Tensor, Lam: torch.Tensor) -> torch.Tensor:
    """``(||G + 2 W Lambda||_* - tr(G^T A)) / ||G||_*`` per matrix (tall inputs, ``Lambda`` fixed by ``P``),
    in float64."""
    W, G, A, L = (t.double() for t in (Wt, Gt, A, Lam))
    nuc = torch.linalg.matrix_norm(G, "nuc").clamp_min(torch.finfo(torch.float64).tiny)
    return (torch.linalg.matrix_norm(G + 2.0 * W @ L, "nuc") - (G * A).sum(dim=(-2, -1))) / nuc


@torch.no_grad()
def converged_solve(Wt: torch.Tensor, Gt: torch.Tensor, manifold) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference direction of a bank of tall pairs at unit weight scale (``Wt = W / s``) and its
    duality gap, in float64: the module doc's stopping rule. Returns ``(A, gap)``; a matrix with a
    non-finite input or result has NaN in both."""
    mf = as_manifold(manifold)
    W, G = Wt.double(), Gt.double()
    bad = ~(torch.isfinite(W).all(dim=(-2, -1)) & torch.isfinite(G).all(dim=(-2, -1)))
    W, G = (torch.where(bad[..., None, None], torch.zeros_like(t), t) for t in (W, G))
    Lam = A = None
    done = 0
    while True:
        try:
            res = admm(W, G, mf, rho=REFERENCE_RHO, steps=REFERENCE_CHUNK, Lambda0=Lam, A0=A, exact_clip=True)
        except torch.linalg.LinAlgError:  # an SVD that did not converge: no reference for this bank
            nan = torch.full(W.shape[:-2], float("nan"), dtype=W.dtype)
            return torch.full_like(W, float("nan")), nan
        done += REFERENCE_CHUNK
        Lam, A = res.Lambda, res.A
        bad = bad | ~torch.isfinite(A).all(dim=(-2, -1)) | ~torch.isfinite(Lam).all(dim=(-2, -1))
        if bool(bad.any()):  # keep the finite ones going; the others end as NaN
            A, Lam = (torch.where(bad[..., None, None], torch.zeros_like(t), t) for t in (A, Lam))
        gap = duality_gap(W, G, A, Lam)
        X = W.mT @ A
        viol = rms(mf.project_(X + X.mT))
        met = bool(((gap.abs() <= GAP_TOL) & (viol <= VIOLATION_TOL) | bad).all())
        if met or done >= REFERENCE_MAX_STEPS:
            nan = torch.full_like(gap, float("nan"))
            return torch.where(bad[..., None, None], torch.full_like(A, float("nan")), A), torch.where(bad, nan, gap)


@torch.no_grad()
def solve_quality(W: torch.Tensor, U: torch.Tensor, A: torch.Tensor, manifold) -> dict[str, torch.Tensor]:
    """The columns of :data:`QUALITY_COLUMNS` from ``scale`` on, per matrix of a batch of pairs
    (tall or wide; ``manifold``: a name or one name per matrix, Stiefel and DGram)."""
    mf = as_manifold(manifold)
    s = solve_scale(W, mf)
    Wt, Ut = to_tall(W)[0], to_tall(U)[0]
    Wn = Wt / s[..., None, None]
    ref, gap = converged_solve(Wn, Ut, mf)
    ref = ref.to(Ut.dtype)
    nuc = torch.linalg.matrix_norm(Ut, "nuc").clamp_min(torch.finfo(Ut.dtype).tiny)
    out = {"scale": s}
    for key, D in (("", to_tall(A)[0]), ("_converged", ref)):
        X = Wn.mT @ D
        out["alignment" + key] = (Ut * D).sum(dim=(-2, -1)) / nuc
        out["violation" + key] = rms(mf.project_(X + X.mT))
    out["gap_converged"] = gap
    return out


def quality_rows(consumed: dict, directions: dict, step: int) -> list[dict]:
    """Rows of ``solver.csv`` for one step: ``consumed`` as :meth:`mwm.optim.muon.ManifoldMuon.step_with_inputs`
    returns it (``{name: (manifold, W, U)}``), ``directions`` the step direction of each. Pairs are
    measured in banks of one tall shape (Stiefel and DGram together), the rows in name order."""
    banks: dict[tuple, list[str]] = {}
    for name, (manifold, W, _) in consumed.items():
        if manifold in QUALITY_MANIFOLDS and name in directions:
            banks.setdefault(tuple(to_tall(W)[0].shape), []).append(name)
    rows = []
    for names in banks.values():
        W, U, A = (torch.stack([to_tall(t)[0].float() for t in ts])
                   for ts in zip(*[(consumed[n][1], consumed[n][2], directions[n]) for n in names]))
        q = {k: v.double().cpu().tolist() for k, v in solve_quality(W, U, A, [consumed[n][0] for n in names]).items()}
        for i, name in enumerate(names):
            rows.append({"step": step, "name": name, "layer": layer_of(name),
                         "module": "attn" if ".attn." in name else "mlp", "matrix": name.split(".")[-2],
                         "manifold": consumed[name][0], **{k: q[k][i] for k in QUALITY_COLUMNS[6:]}})
    return sorted(rows, key=lambda r: r["name"])
