"""The released code's optimizer math, one matrix at a time (the benchmark baseline).

This restates the algorithm of the paper's ``manifold_muon.py`` / ``train.py``
(Nesterov momentum, per-matrix dual ascent with msign on the m x n matrix at
every iteration and an explicit ``A^T W`` product, DGram retraction by full SVD,
Stiefel retraction by msign) in this project's own code, so the benchmark can
time both in one run. It is not used by training.
"""

from __future__ import annotations

import torch

from mwm.optim.manifolds import get_manifold, retract_dgram_svd
from mwm.optim.msign import msign


def _project(M, name):
    return get_manifold(name).project(M)


def _retract(W, name):
    if name == "dgram":
        return retract_dgram_svd(W)
    if name == "stiefel":
        return msign(W, method="direct")
    return get_manifold(name).retract(W)


@torch.no_grad()
def released_manifold_muon(W, G, eta, alpha, steps, name):
    transpose = W.shape[-2] < W.shape[-1]
    if transpose:
        W, G = W.mT, G.mT
    Lam = -0.25 * _project(W.mT @ G + G.mT @ W, name)
    for t in range(steps):
        S = 0.5 * (Lam + Lam.mT)
        A = msign(G + 2 * W @ _project(S, name), method="direct")
        H = _project(W.mT @ A + A.mT @ W, name)
        Lam = Lam - alpha * (1 - t / steps) * H
    new = _retract(W - eta * A, name)
    return new.mT if transpose else new


@torch.no_grad()
def released_step(weights, grads, bufs, manifolds, lr, momentum=0.95, weight_decay=0.1, alpha=0.1, steps=20):
    """One optimizer step over lists of matrices; returns the new weights."""
    out = []
    for W, g, buf, name in zip(weights, grads, bufs, manifolds):
        buf.mul_(momentum).add_(g)
        u = g + momentum * buf
        if name == "none":
            out.append(W * (1 - lr * weight_decay) - lr * msign(u, method="direct"))
        else:
            out.append(released_manifold_muon(W, u, lr, alpha, steps, name))
    return out


class ReleasedMuon(torch.optim.Optimizer):
    """The released optimizer loop: one matrix at a time (benchmark baseline only)."""

    def __init__(self, groups, lr=0.02, momentum=0.95, weight_decay=0.1, alpha=0.1, steps=20):
        super().__init__(groups, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, alpha=alpha,
                                      steps=steps, manifold="none"))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = torch.zeros_like(p.grad)
                new = released_step([p.detach()], [p.grad], [state["buf"]], [group["manifold"]], group["lr"],
                                    group["momentum"], group["weight_decay"], group["alpha"], group["steps"])[0]
                p.copy_(new)
