"""Inner solvers of Manifold Muon: the paper's dual ascent and ADMM.

Both solve the same problem (see :mod:`mwm.optim.dual_ascent`) for a tall ``W`` with
projector ``P`` and momentum ``G``::

    max_A tr(G^T A)   s.t.   ||A||_2 <= 1,   P(W^T A + A^T W) = 0

whose solution is ``A = msign(G + 2 W Lambda)`` at the optimal multiplier.

``dual_ascent``
    The paper's: gradient ascent on ``Lambda`` with step ``alpha (1 - t/T)``; one
    msign per iteration.
``admm``
    Buchanan's splitting of the dual ``min_Lambda ||G + 2 W Lambda||_*`` as
    ``min ||X||_*  s.t.  X = G + 2 W Lambda`` with penalty ``rho``, in the scaled
    form whose dual variable is ``A / rho``::

        Z      = G + 2 W Lambda + A / rho
        A'     = clip_1(rho Z)                  (projection on the spectral-norm ball)
        Lambda = Lambda + LS((A - 2 A') / rho)   (least-squares step of Lambda)

    ``LS(E)`` solves ``min ||2 W dL - E||_F`` over symmetric ``dL`` fixed by ``P``
    with ``W^T W`` replaced by its diagonal ``D`` (exact on Stiefel and DGram):
    ``dL_ij = P(sym W^T E)_ij / (d_i + d_j)``. The X-update of ADMM is the prox of
    the nuclear norm, ``Z - clip_{1/rho}(Z)`` (Moreau), so only the clip is needed,
    and it is built from two msigns instead of an SVD:
    ``clip_1(Z) = (Z + msign(Z) - msign(Y) (msign(Z)^T Z - I)) / 2`` with
    ``Y = Z - msign(Z)`` (singular values ``min(s, 1) = (s + 1 - |s - 1|) / 2``).
    An ADMM iteration therefore costs two msign-equivalents. ``G`` is divided by
    its RMS singular value ``||G||_F / sqrt(n)`` first (the problem is invariant
    to scaling ``G``; ``rho`` is then scale-free); ``Lambda`` is kept in ``G``'s units.

Both take a warm-start multiplier ``Lambda0`` and a tolerance ``tol`` on
``||P(W^T A + A^T W)||_RMS`` (per matrix), and return a
:class:`~mwm.optim.dual_ascent.DualAscentResult` with the final multiplier.

The scale-normalized solve (``SolverSettings.normalize``, :func:`scaled_solve`): the problem is
unchanged by scaling ``W`` (a DGram weight's tangent space, and so the feasible set of ``A``, is that
of ``c W``) or ``G`` (``msign`` ignores a positive factor), but dual ascent is not. Its multiplier
starts in ``G``'s units (``-1/4 P(W^T G + G^T W)``) while its step ``alpha (1 - t/T) H`` is absolute,
and the multiplier acts through ``2 W Lambda``: so the step overshoots like ``c^2 alpha / g`` for a
weight of scale ``c`` and a momentum of RMS singular value ``g`` (``1e-5`` to ``1e-2`` in training).
Solved on ``W / s`` and ``G / g`` and mapped back (``A`` is the same, ``Lambda_W = g Lambda / s``),
the solve sees the unit scales at which ``alpha`` acts as intended, whatever the weight's and the
momentum's. ``s`` is each DGram matrix's largest column norm (tall orientation), its ``sigma_max``
on DGram (:func:`solve_scale`; 1 on other manifolds, whose column norms are fixed at 1), and ``g``
the momentum's ``||G||_F / sqrt(n)`` (:func:`momentum_scale`): one norm pass each, no SVD. At
``s = g = 1`` it is the plain solve, bit for bit.

:class:`SolverSettings` holds a solve's settings: built once from a config's ``train``
section (:meth:`SolverSettings.from_train`; the schema is the one home of the defaults,
:meth:`SolverSettings.defaults`) and passed whole to the optimizer and to :func:`solve`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch

from mwm.optim.dual_ascent import METHODS, DualAscentResult, as_manifold, dual_ascent
from mwm.optim.inner import Tolerance, check_inputs, check_iterations, or_default, result, start_multiplier, tall_pair
from mwm.optim.manifolds import rms, to_tall
from mwm.optim.msign import DEFAULT_STEPS, check_precision, msign
from mwm.optim.vocab import MSIGN_KEYS, PAPER_TRAIN, SOLVER_KEYS, SOLVERS

__all__ = ["SOLVERS", "SolverSettings", "admm", "clip_exact", "clip_spectral", "solve", "solve_scale", "momentum_scale",
           "scaled_solve", "msign_per_iteration"]


@dataclass(frozen=True)
class SolverSettings:
    """The settings of one inner solve, checked when made.

    ``solver``: ``dual_ascent`` or ``admm``; ``alpha``: dual ascent's step; ``steps``: the
    iteration cap (dual ascent's ``T`` in ``alpha (1 - t/T)``); ``tol``: per-matrix stop at
    ``||H||_RMS < tol`` (None: always ``steps``); ``rho``: ADMM's penalty; ``warm_start``: start
    from the previous step's multiplier (the optimizer keeps it); ``msign_steps`` and
    ``precision``: every msign's; ``method``: dual ascent's evaluation order; ``normalize``: solve on
    ``W / s`` and ``G / g`` (the scale-normalized solve of the module doc; False: the paper's).
    """

    solver: str
    alpha: float
    steps: int
    tol: float | None
    rho: float
    warm_start: bool
    msign_steps: int
    precision: str
    method: str = "auto"
    normalize: bool = False

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown inner solver {self.solver!r}; choose one of {', '.join(SOLVERS)}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.steps < 1:
            raise ValueError(f"the inner solver needs steps >= 1, got {self.steps}")
        if self.tol is not None and not self.tol > 0:
            raise ValueError(f"solver_tol must be > 0 or None, got {self.tol}")
        if not self.rho > 0:
            raise ValueError(f"rho must be > 0, got {self.rho}")
        if self.msign_steps < 1:
            raise ValueError(f"msign needs at least one step, got msign_steps={self.msign_steps}")
        check_precision(self.precision)
        if self.method not in METHODS:
            raise ValueError(f"unknown dual ascent method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be True or False, got {self.normalize!r}")

    @classmethod
    def from_train(cls, train: Mapping) -> "SolverSettings":
        """The settings a config's (validated) ``train`` section gives. ``train.solver_normalize`` names
        the modules whose solves are normalized, so :func:`mwm.optim.assignments.build_optimizers` sets
        ``normalize`` per parameter group; here it stays False."""
        keys = {**SOLVER_KEYS, **MSIGN_KEYS}
        return cls(**{field: next((train[k] for k in ks if train.get(k) is not None), None)
                      for field, ks in keys.items() if field != "normalize"})

    @classmethod
    def defaults(cls, **changes) -> "SolverSettings":
        """The paper's settings (:data:`~mwm.optim.vocab.PAPER_TRAIN`, the schema's defaults: a cold-started
        20-step dual ascent, alpha 0.1), with ``changes``."""
        return dataclasses.replace(cls.from_train(PAPER_TRAIN), **changes)

    def replace(self, **changes) -> "SolverSettings":
        return dataclasses.replace(self, **changes)

    #: the optimizer's param-group keys of each field (plain values, so a checkpoint's
    #: optimizer state loads weights-only; the keys checkpoints have always had)
    GROUP_KEYS = {"solver": "solver", "alpha": "alpha", "steps": "dual_steps", "tol": "solver_tol", "rho": "rho",
                  "warm_start": "warm_start", "msign_steps": "msign_steps", "precision": "msign_precision",
                  "method": "method", "normalize": "solver_normalize"}
    #: fields added after checkpoints were first written: the value a group without the key had
    LATER_FIELDS = {"normalize": False}

    def group(self) -> dict:
        """These settings as optimizer param-group entries."""
        return {key: getattr(self, field) for field, key in self.GROUP_KEYS.items()}

    @classmethod
    def of_group(cls, group: Mapping) -> "SolverSettings":
        """The settings held by an optimizer param group (checked again: a group may set its own; one
        loaded from a checkpoint older than a field has that field's old value, :data:`LATER_FIELDS`)."""
        return cls(**{field: group[key] if key in group or field not in cls.LATER_FIELDS
                      else cls.LATER_FIELDS[field] for field, key in cls.GROUP_KEYS.items()})


def msign_per_iteration(solver: str) -> int:
    """msign calls one iteration of ``solver`` makes (its cost in msign-equivalents)."""
    return _SOLVE[solver][1]


def clip_exact(Z: torch.Tensor) -> torch.Tensor:
    """The projection on the unit spectral-norm ball by an SVD, in ``Z``'s dtype: exact where
    :func:`clip_spectral`'s two msigns approximate (a converged reference's, not a training step's)."""
    U, S, Vh = torch.linalg.svd(Z, full_matrices=False)
    return (U * S.clamp(max=1.0).unsqueeze(-2)) @ Vh


def clip_spectral(Z: torch.Tensor, msign_steps: int = DEFAULT_STEPS, precision: str = "float32") -> torch.Tensor:
    """Projection of (a batch of) ``m x n`` matrices on the unit spectral-norm ball:
    singular values ``s -> min(s, 1)``, from two msigns (see the module doc) in ``precision``."""
    Q = msign(Z, steps=msign_steps, precision=precision)
    tall = Z.shape[-2] >= Z.shape[-1]
    Y = Z - Q
    if tall:
        R = Q.mT @ Z  # V diag(s) V^T
        R.diagonal(dim1=-2, dim2=-1).sub_(1.0)
        absdev = msign(Y, steps=msign_steps, precision=precision) @ R
    else:
        R = Z @ Q.mT  # U diag(s) U^T
        R.diagonal(dim1=-2, dim2=-1).sub_(1.0)
        absdev = R @ msign(Y, steps=msign_steps, precision=precision)
    return (Z + Q - absdev).mul_(0.5)


@torch.no_grad()
def admm(
    W: torch.Tensor,
    G: torch.Tensor,
    manifold="stiefel",
    rho: float | None = None,
    steps: int | None = None,
    tol: float | None = None,
    record_violations: bool = False,
    snapshots: Iterable[int] = (),
    msign_steps: int = DEFAULT_STEPS,
    Lambda0: torch.Tensor | None = None,
    precision: str = "float32",
    A0: torch.Tensor | None = None,
    exact_clip: bool = False,
) -> DualAscentResult:
    """ADMM on the inner problem (module doc); arguments as :func:`~mwm.optim.dual_ascent.dual_ascent`.
    ``A0``: the scaled dual variable to start from (the ``A`` of an earlier result of the same pair, with
    its ``Lambda`` as ``Lambda0``, continues that solve exactly); None: zeros. ``exact_clip``: project by
    an SVD (:func:`clip_exact`) instead of two msigns (``msign_steps`` and ``precision`` then unused)."""
    check_inputs(W, G)
    rho, steps = or_default(rho, "admm_rho"), or_default(steps, "dual_ascent_steps")
    snaps = check_iterations("ADMM", steps, snapshots)
    if not rho > 0:
        raise ValueError(f"ADMM needs rho > 0, got {rho}")
    mf = as_manifold(manifold)
    Wt, Gt, transposed = tall_pair(W, G)
    n = Wt.shape[-1]
    g_scale = (Gt.square().sum(dim=(-2, -1)) / n).sqrt().clamp_min(1e-30)[..., None, None]
    Gn = Gt / g_scale
    d = (Wt.square().sum(dim=-2)).clamp_min(1e-30)  # diag(W^T W)
    inv_denom = 1.0 / (d[..., :, None] + d[..., None, :])
    Lam = start_multiplier(mf, Wt, Gn, Lambda0, scale=g_scale)
    A = torch.zeros_like(Gn) if A0 is None else tall_pair(W, A0)[1].to(Gn.dtype)
    history, out_snaps = [], {}
    stop = Tolerance(tol, Wt.shape[:-2], steps, Wt.device) if tol is not None else None
    it = 0
    for t in range(steps):
        Z = torch.add(Gn, Wt @ Lam, alpha=2.0).mul_(rho).add_(A)
        A_new = clip_exact(Z) if exact_clip else clip_spectral(Z, msign_steps, precision)
        X = Wt.mT @ A_new
        H = mf.project_(X + X.mT)
        it = t + 1
        if record_violations or tol is not None:
            viol = rms(H)
            if record_violations:
                history.append(viol)
        if it in snaps:
            out_snaps[it] = A_new
        E = torch.add(A, A_new, alpha=-2.0).div_(rho)
        Y = Wt.mT @ E
        dL = mf.project_((Y + Y.mT).mul_(0.5)).mul_(inv_denom)
        if stop is not None:
            if stop.update(it, viol, lambda: A_new):
                A = A_new
                break
            dL = stop.freeze(dL)
        Lam = Lam + dL
        A = A_new
    return result(A, stop, Lam * g_scale, it, history if record_violations else None, out_snaps, transposed)


def _dual_ascent(W, G, manifold, s: SolverSettings, **kw) -> DualAscentResult:
    return dual_ascent(W, G, manifold, alpha=s.alpha, steps=s.steps, tol=s.tol, method=s.method,
                       msign_steps=s.msign_steps, precision=s.precision, **kw)


def _admm(W, G, manifold, s: SolverSettings, **kw) -> DualAscentResult:
    return admm(W, G, manifold, rho=s.rho, steps=s.steps, tol=s.tol, msign_steps=s.msign_steps,
                precision=s.precision, **kw)


#: solver name -> (its run with a :class:`SolverSettings`, msign calls per iteration)
_SOLVE = {"dual_ascent": (_dual_ascent, 1), "admm": (_admm, 2)}


def solve(W, G, manifold, settings: SolverSettings, *, Lambda0: torch.Tensor | None = None,
          record_violations: bool = False, snapshots: Iterable[int] = ()) -> DualAscentResult:
    """Run the inner solve ``settings`` describes on ``W``, ``G`` (``Lambda0``: a warm start;
    ``record_violations``, ``snapshots``: as :func:`~mwm.optim.dual_ascent.dual_ascent`); with
    ``settings.normalize``, on ``W / s`` and ``G / g`` (:func:`scaled_solve` at :func:`solve_scale` and
    :func:`momentum_scale`)."""
    if not isinstance(settings, SolverSettings):
        raise TypeError(f"solve takes a SolverSettings, got {type(settings).__name__}")
    kw = dict(Lambda0=Lambda0, record_violations=record_violations, snapshots=snapshots)
    if settings.normalize:
        return scaled_solve(W, G, manifold, settings, solve_scale(W, manifold), momentum_scale(G), **kw)
    run, _ = _SOLVE[settings.solver]
    return run(W, G, manifold, settings, **kw)


def solve_scale(W: torch.Tensor, manifold) -> torch.Tensor:
    """The scale ``s`` of the normalized solve, per matrix (shape ``W.shape[:-2]``): a DGram matrix's
    largest column norm in the tall orientation (its ``sigma_max``), 1 for any other manifold."""
    mf = as_manifold(manifold)
    Wt = to_tall(W.float() if W.dtype in (torch.float16, torch.bfloat16) else W)[0]
    s = Wt.norm(dim=-2).amax(dim=-1).clamp_min(torch.finfo(Wt.dtype).tiny)
    names = getattr(mf, "names", None)
    if names is None:
        return s if mf.name == "dgram" else torch.ones_like(s)
    dgram = torch.tensor([n == "dgram" for n in names], device=s.device)
    return torch.where(dgram, s, torch.ones_like(s))


def momentum_scale(G: torch.Tensor) -> torch.Tensor:
    """The momentum's scale ``g`` of the normalized solve, per matrix (shape ``G.shape[:-2]``): its RMS
    singular value ``||G||_F / sqrt(n)``, ``n`` the width in the tall orientation (a zero momentum: the
    dtype's smallest normal number, so ``G / g`` stays zero)."""
    Gt = to_tall(G.float() if G.dtype in (torch.float16, torch.bfloat16) else G)[0]
    n = Gt.shape[-1]
    return (Gt.square().sum(dim=(-2, -1)) / n).sqrt().clamp_min(torch.finfo(Gt.dtype).tiny)


def _per_matrix(x: torch.Tensor, W: torch.Tensor, what: str) -> torch.Tensor:
    x = x.to(device=W.device, dtype=torch.float32 if W.dtype in (torch.float16, torch.bfloat16) else W.dtype)
    if x.shape != W.shape[:-2] or not bool((x > 0).all()):
        raise ValueError(f"scaled_solve needs one positive {what} per matrix (shape {tuple(W.shape[:-2])}), "
                         f"got shape {tuple(x.shape)}")
    return x[..., None, None]


def scaled_solve(W, G, manifold, settings: SolverSettings, s: torch.Tensor, g: torch.Tensor | None = None, *,
                 Lambda0: torch.Tensor | None = None, record_violations: bool = False,
                 snapshots: Iterable[int] = ()) -> DualAscentResult:
    """The inner solve of ``settings`` on ``W / s`` and ``G / g`` (one positive scale per matrix each,
    shape ``W.shape[:-2]``; ``g`` None: ``G`` as it is), mapped back: ``A`` solves the same problem (the
    tangent space of ``W / s`` is ``W``'s, and msign ignores ``G``'s scale), the multiplier is
    ``g Lambda / s`` in ``W``'s and ``G``'s units (and a warm start ``Lambda0`` enters as
    ``s Lambda0 / g``). Violations and the tolerance are those of ``W / s``. At ``s = g = 1`` it is the
    plain solve, bit for bit."""
    s4 = _per_matrix(s, W, "scale")
    g4 = None if g is None else _per_matrix(g, W, "momentum scale")
    run, _ = _SOLVE[settings.solver]
    Gs = G if g4 is None else G / g4
    if Lambda0 is not None:
        Lambda0 = Lambda0 * s4 if g4 is None else Lambda0 * s4 / g4
    res = run(W / s4, Gs, manifold, settings, Lambda0=Lambda0, record_violations=record_violations,
              snapshots=snapshots)
    res.Lambda = res.Lambda / s4 if g4 is None else res.Lambda * g4 / s4
    return res
