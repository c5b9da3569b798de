"""The Muon / Manifold Muon optimizer for hidden weight matrices.

Per parameter group (each carries a ``manifold`` key):

* Nesterov momentum as in the released code: ``buf = mu buf + g``,
  ``u = g + mu buf``;
* ``manifold="none"``: plain Muon, ``W <- (1 - lr wd) W - lr msign(u)``;
* ``manifold`` in stiefel / dgram / oblique: Manifold Muon,
  ``W <- retract(W - lr A)`` with ``A`` from the dual ascent; no weight decay.

Matrices of equal shape, manifold and hyperparameters are stacked into one
bank and updated by one batched call. Gradients are checked before anything is
written: a NaN or Inf gradient raises with the parameter's name and leaves
weights and momentum untouched.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .dual_ascent import dual_ascent
from .manifolds import DGRAM_RETRACTIONS, MANIFOLDS, get_manifold
from .msign import DEFAULT_STEPS, msign

__all__ = ["ManifoldMuon", "MUON_MANIFOLDS"]

#: What a Muon parameter group may ask for: plain Muon or one of the manifolds.
MUON_MANIFOLDS = ("none",) + MANIFOLDS


class ManifoldMuon(torch.optim.Optimizer):
    """Muon with optional manifold constraints, batched over banks of equal shapes.

    Parameter groups may set ``manifold`` (default ``"none"``) and ``names``
    (parameter names, used in error messages). With ``init_on_manifold`` the
    constrained weights are moved onto their manifold at construction.
    """

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        alpha: float = 0.1,
        dual_steps: int = 20,
        dgram_retraction: str = "paper",
        msign_steps: int = DEFAULT_STEPS,
        method: str = "auto",
        manifold: str = "none",
        init_on_manifold: bool = True,
    ):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if dual_steps < 1:
            raise ValueError(f"dual_steps must be >= 1, got {dual_steps}")
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, alpha=alpha,
            dual_steps=dual_steps, dgram_retraction=dgram_retraction, msign_steps=msign_steps,
            method=method, manifold=manifold, names=None,
        )
        super().__init__(params, defaults)
        #: set to a dict to record, at the next step, each matrix's weight and update
        #: direction (the Nesterov momentum) under its name: {name: (W, U)}
        self.capture: dict | None = None
        self._rank, self._world = 0, 1
        for gi, group in enumerate(self.param_groups):
            if group["manifold"] not in MUON_MANIFOLDS:
                raise ValueError(
                    f"param group {gi}: unknown manifold {group['manifold']!r}; "
                    f"choose one of {', '.join(MUON_MANIFOLDS)}"
                )
            if group["dgram_retraction"] not in DGRAM_RETRACTIONS:
                raise ValueError(
                    f"param group {gi}: unknown dgram_retraction {group['dgram_retraction']!r}; "
                    f"choose one of {', '.join(DGRAM_RETRACTIONS)}"
                )
            names = group["names"]
            if names is not None and len(names) != len(group["params"]):
                raise ValueError(f"param group {gi}: {len(names)} names for {len(group['params'])} params")
            for i, p in enumerate(group["params"]):
                if p.ndim != 2:
                    raise ValueError(
                        f"{self._name(group, i)}: Muon handles 2-D weight matrices only, got shape {tuple(p.shape)}"
                    )
        if init_on_manifold:
            self.init_on_manifold()

    @staticmethod
    def _name(group, i: int) -> str:
        names = group.get("names")
        return names[i] if names else f"param {i} of group ({group['manifold']})"

    @torch.no_grad()
    def init_on_manifold(self) -> None:
        """Move every constrained weight onto its manifold (batched per shape)."""
        for group in self.param_groups:
            if group["manifold"] == "none":
                continue
            mf = get_manifold(group["manifold"], group["dgram_retraction"])
            for params in _by_shape(group["params"]).values():
                W = torch.stack([_work(p) for p in params])
                for p, w in zip(params, mf.init(W)):
                    p.copy_(w.to(p.dtype))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Refuse bad gradients before any weight or buffer is touched.
        for group in self.param_groups:
            for i, p in enumerate(group["params"]):
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    raise FloatingPointError(
                        f"{self._name(group, i)}: gradient has NaN or Inf entries; no parameter was updated"
                    )
        bank = 0
        pending = []
        for group in self.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            for params in _by_shape(live).values():
                owner = bank % self._world
                self._update_bank(group, params, compute=owner == self._rank)
                pending.append((owner, params))
                bank += 1
        if self._world > 1:
            import torch.distributed as dist

            for owner, params in pending:
                W = torch.stack([p.detach() for p in params])
                dist.broadcast(W, src=owner)
                for p, w in zip(params, W):
                    p.copy_(w)
        return loss

    def shard(self, rank: int, world: int) -> None:
        """Split the banks across ``world`` processes: each computes the updates of its
        share (bank ``k`` belongs to rank ``k % world``) and broadcasts the new weights.
        Gradients must already agree across ranks (DDP); momentum is kept everywhere."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self._rank, self._world = rank, world

    def _update_bank(self, group, params: list[torch.Tensor], compute: bool = True) -> None:
        mu = group["momentum"]
        grads = torch.stack([_work(p.grad) for p in params])
        bufs = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            bufs.append(state["momentum_buffer"])
        buf = torch.stack(bufs).mul_(mu).add_(grads)
        for b, new in zip(bufs, buf):
            b.copy_(new)
        if not compute:
            return  # another rank computes this bank's update and broadcasts it
        update_dir = grads.add(buf, alpha=mu) if group["nesterov"] else buf
        lr = group["lr"]
        W = torch.stack([_work(p) for p in params])
        if self.capture is not None:
            index = {id(q): i for i, q in enumerate(group["params"])}
            for p, w, u in zip(params, W, update_dir):
                self.capture[self._name(group, index[id(p)])] = (group["manifold"], w.clone(), u.clone())
        if group["manifold"] == "none":
            if group["weight_decay"]:
                W.mul_(1.0 - lr * group["weight_decay"])
            W.add_(msign(update_dir, steps=group["msign_steps"]), alpha=-lr)
        else:
            mf = get_manifold(group["manifold"], group["dgram_retraction"])
            res = dual_ascent(
                W, update_dir, mf, alpha=group["alpha"], steps=group["dual_steps"],
                method=group["method"], msign_steps=group["msign_steps"],
            )
            W = mf.retract(W - lr * res.A)
        if not bool(torch.isfinite(W).all()):
            index = {id(q): i for i, q in enumerate(group["params"])}
            names = ", ".join(self._name(group, index[id(p)]) for p in params)
            raise FloatingPointError(f"update of [{names}] is not finite; these weights were left unchanged")
        for p, w in zip(params, W):
            p.copy_(w.to(p.dtype))


def _work(t: torch.Tensor) -> torch.Tensor:
    """The optimizer's working precision: float32 for half-precision tensors, else as is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _by_shape(params) -> dict[tuple, list[torch.Tensor]]:
    banks: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        banks[(tuple(p.shape), p.dtype, p.device)].append(p)
    return banks
