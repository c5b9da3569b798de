"""Whether a prepared dataset's splits are long enough for a config's model (see :mod:`mwm.plan.checks`).

Torch-free and apart from the training code, so the data stage (``mwm.data prepare --config``)
can check its own output without depending on it."""

from __future__ import annotations

from mwm.config import ConfigError

__all__ = ["check_splits", "min_split_tokens"]


def min_split_tokens(block_size: int) -> int:
    """The fewest tokens a split may hold to draw one training window (block_size + 1
    tokens) at a random offset."""
    return block_size + 2


def check_splits(cfg: dict, meta: dict, meta_path: str, source: str | None = None) -> None:
    """Raise ConfigError when a split of the data (its ``meta.json`` at ``meta_path``) is too
    short for the config's ``model.block_size``."""
    where = source or f"config {cfg['name']!r}"
    block = cfg["model"]["block_size"]
    need = min_split_tokens(block)
    splits = meta.get("splits")
    for split, entry in sorted(splits.items() if isinstance(splits, dict) else []):
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if isinstance(tokens, int) and tokens < need:
            raise ConfigError(
                f"{where}: model.block_size = {block} needs at least {need} tokens in each "
                f"split, but the {split} split of {meta_path} has {tokens}: lower model.block_size, or give "
                f"the data more tokens (data.val_fraction, a larger corpus)")
