"""Learning-rate schedule of the released code: linear warmup, cosine decay to a floor.

The Muon learning rate follows the AdamW one proportionally:
``muon_lr(t) = muon_lr * lr(t) / learning_rate``.
"""

from __future__ import annotations

import math

__all__ = ["adamw_lr", "learning_rates", "muon_lr", "muon_lr_series"]


def adamw_lr(it: int, learning_rate: float, min_lr: float, warmup_iters: int, lr_decay_iters: int,
             decay_lr: bool = True) -> float:
    """AdamW learning rate at iteration ``it`` (0-based), as nanoGPT computes it."""
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    span = max(lr_decay_iters - warmup_iters, 1)
    ratio = (it - warmup_iters) / span
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def learning_rates(it: int, train: dict) -> tuple[float, float]:
    """``(AdamW lr, Muon lr)`` at iteration ``it`` for a ``train`` config section: the one
    place the Muon rule ``muon_lr * lr(t) / learning_rate`` is written (training, the
    studies and the report all come here)."""
    lr = adamw_lr(it, train["learning_rate"], train["min_lr"], train["warmup_iters"],
                  train["lr_decay_iters"], train.get("decay_lr", True))
    return lr, train["muon_lr"] * lr / train["learning_rate"]


def muon_lr(it: int, train: dict) -> float:
    """Muon (and Manifold Muon step size eta) at iteration ``it`` for a ``train`` config section."""
    return learning_rates(it, train)[1]


def muon_lr_series(train: dict, steps: int | None = None) -> list[float]:
    """``muon_lr(t)`` for every optimizer step ``t = 0 .. steps - 1`` (default ``max_iters``)."""
    return [muon_lr(t, train) for t in range(train["max_iters"] if steps is None else steps)]
