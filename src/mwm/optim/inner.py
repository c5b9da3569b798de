"""What every inner solver of Manifold Muon shares (:mod:`mwm.optim.dual_ascent`, ADMM in
:mod:`mwm.optim.solvers`): the input checks, the tall orientation, the start multiplier (cold or
warm), per-matrix stopping at a tolerance, and the result type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

from mwm.optim.manifolds import to_tall
from mwm.optim.vocab import PAPER_TRAIN

__all__ = ["InnerResult", "or_default", "check_inputs", "check_iterations", "tall_pair", "start_multiplier",
           "Tolerance", "result"]


@dataclass
class InnerResult:
    """An inner solve's output, in the orientation of the input.

    ``A``: the final update direction. ``violations``: ``(steps, *batch)`` tensor
    of ``||H_t||_RMS`` when requested. ``snapshots``: ``{T: A_T}``, the direction
    after ``T`` iterations of the same run. ``iterations``: iterations done (the
    batch's; with ``tol`` a matrix may stop earlier, see ``stopped``).
    ``Lambda``: the final multiplier ``P(sym Lambda)`` in the tall orientation
    (``(*batch, n, n)``), the warm start of the next step. ``stopped``: with ``tol``,
    the iteration at which each matrix met it (``steps`` where it never did).
    """

    A: torch.Tensor
    violations: torch.Tensor | None = None
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    iterations: int = 0
    Lambda: torch.Tensor | None = None
    stopped: torch.Tensor | None = None


def or_default(value, key: str):
    """``value``, or the paper's setting of ``train.<key>`` (:data:`~mwm.optim.vocab.PAPER_TRAIN`, also the
    schema's default, so a solver called without it uses the same as a config without it)."""
    return PAPER_TRAIN[key] if value is None else value


def check_inputs(W: torch.Tensor, G: torch.Tensor) -> None:
    if W.shape != G.shape:
        raise ValueError(f"weight and gradient shapes differ: {tuple(W.shape)} vs {tuple(G.shape)}")
    if W.ndim < 2:
        raise ValueError(f"an inner solve needs matrices, got shape {tuple(W.shape)}")
    if not bool(torch.isfinite(G).all()):
        raise FloatingPointError("gradient has NaN or Inf entries; refusing to compute an update")


def check_iterations(what: str, steps: int, snapshots: Iterable[int]) -> list[int]:
    """``snapshots`` sorted, once each; ValueError unless ``steps >= 1`` and every one is in ``1..steps``."""
    if steps < 1:
        raise ValueError(f"{what} needs steps >= 1, got {steps}")
    snaps = sorted(set(int(t) for t in snapshots))
    for t in snaps:
        if not 1 <= t <= steps:
            raise ValueError(f"snapshot iteration {t} is outside 1..{steps}")
    return snaps


def tall_pair(W: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``W`` and ``G`` in the tall orientation, in float32 if ``W`` is half precision, and whether
    they were transposed."""
    Wt, transposed = to_tall(W.float() if W.dtype in (torch.float16, torch.bfloat16) else W)
    Gt, _ = to_tall(G.to(Wt.dtype))
    return Wt, Gt, transposed


def start_multiplier(mf, Wt: torch.Tensor, Gt: torch.Tensor, Lambda0: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None, WtG: torch.Tensor | None = None) -> torch.Tensor:
    """The first multiplier: cold ``-1/4 P(W^T G + G^T W)`` (``WtG``: ``W^T G`` if already formed),
    or the warm start ``P(sym Lambda0)`` (``Lambda0`` divided by ``scale`` first when given: a solver
    working on a scaled ``G``). Symmetric and fixed by ``P``, as every later one."""
    n = Wt.shape[-1]
    if Lambda0 is None:
        WtG = Wt.mT @ Gt if WtG is None else WtG
        return mf.project_(WtG + WtG.mT).mul_(-0.25)
    if Lambda0.shape != Wt.shape[:-2] + (n, n):
        raise ValueError(f"Lambda0 of shape {tuple(Lambda0.shape)} does not match the multiplier shape "
                         f"{tuple(Wt.shape[:-2] + (n, n))}")
    L0 = Lambda0.to(Wt.dtype)
    if scale is not None:
        L0 = L0 / scale
    return mf.project_((L0 + L0.mT).mul_(0.5))


class Tolerance:
    """Per-matrix stopping at ``||H||_RMS < tol``: a matrix keeps the direction of the
    iteration at which it stopped and, from then on, its multiplier."""

    def __init__(self, tol: float, batch: torch.Size, steps: int, device):
        self.tol = tol
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.stopped = torch.full(batch, steps, dtype=torch.long, device=device)
        self.A = None

    def update(self, it: int, violation: torch.Tensor, direction) -> bool:
        """Record the matrices that meet ``tol`` at iteration ``it`` (``direction()``: that
        iteration's direction); whether all have."""
        newly = (violation < self.tol) & ~self.done
        if not bool(newly.any()):
            return False
        A = direction()
        self.A = A.clone() if self.A is None else torch.where(newly[..., None, None], A, self.A)
        self.stopped = torch.where(newly, it, self.stopped)
        self.done = self.done | newly
        return bool(self.done.all())

    def freeze(self, step: torch.Tensor) -> torch.Tensor:
        """A multiplier ``step`` with the stopped matrices' entries zeroed (their multiplier stays)."""
        if bool(self.done.any()):
            step = step * (~self.done)[..., None, None].to(step.dtype)
        return step


def result(A, stop: Tolerance | None, Lam, iterations, history, snapshots, transposed) -> InnerResult:
    """An inner solver's result: stopped matrices keep the direction of their stopping
    iteration, and every direction goes back to the caller's orientation."""
    if stop is not None and stop.A is not None:
        A = torch.where(stop.done[..., None, None], stop.A, A)

    def orient(T):
        return T.mT if transposed else T

    return InnerResult(
        A=orient(A),
        violations=torch.stack(history) if history is not None else None,
        snapshots={k: orient(v) for k, v in snapshots.items()},
        iterations=iterations,
        Lambda=Lam,
        stopped=stop.stopped if stop is not None else None,
    )
