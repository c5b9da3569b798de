"""What a config alone can tell about its runs, checked before any job (issue 24, item 3).

:func:`check_config` builds the config's model on PyTorch's ``meta`` device (shapes and
parameter names, no memory, no data): ``n_embd`` must divide by ``n_head``, and every
``grid.custom`` pattern must match one of its hidden matrices. ``rules/common.smk`` calls it
when Snakemake loads the workflow, ``mwm.train`` before it reads any data.

:func:`check_splits` compares the data stage's ``meta.json`` (token counts of each split)
with ``model.block_size``: the data job checks it after tokenizing (``mwm.data prepare
--config``), and ``rules/common.smk`` at load when the data folder already exists (another
config with the same data section made it), so no training starts on a split too short.
"""

from __future__ import annotations

from .config import ConfigError

__all__ = ["check_config", "check_splits", "min_split_tokens"]


def _source(cfg: dict, source: str | None) -> str:
    return source or f"config {cfg['name']!r}"


def check_config(cfg: dict, source: str | None = None) -> None:
    """Raise ConfigError (naming ``source``, the key and the value) for a model shape that
    cannot be built or a grid.custom pattern that matches no hidden matrix of it."""
    import torch

    from .assignments import resolve_assignment
    from .model import GPT
    from .runs import assignment_spec
    from .train import build_model_config

    where = _source(cfg, source)
    vocab = cfg["model"]["vocab_size"] or 2  # the names do not depend on the vocabulary
    try:
        mcfg = build_model_config(cfg, vocab)
    except ValueError as exc:
        raise ConfigError(f"{where}: model: {exc}") from exc
    with torch.device("meta"):
        named = list(GPT(mcfg).named_parameters())
    for name in cfg["grid"]["assignments"]:
        spec = assignment_spec(cfg["grid"], name)
        if isinstance(spec, str):
            continue
        try:
            resolve_assignment(named, spec)
        except ValueError as exc:
            raise ConfigError(f"{where}: grid.custom.{name}: {exc}") from exc


def min_split_tokens(block_size: int) -> int:
    """The fewest tokens a split may hold to draw one training window (block_size + 1
    tokens) at a random offset."""
    return block_size + 2


def check_splits(cfg: dict, meta: dict, meta_path: str, source: str | None = None) -> None:
    """Raise ConfigError when a split of the data (its ``meta.json`` at ``meta_path``) is too
    short for the config's ``model.block_size``."""
    block = cfg["model"]["block_size"]
    need = min_split_tokens(block)
    for split, entry in sorted(meta.get("splits", {}).items()):
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if isinstance(tokens, int) and tokens < need:
            raise ConfigError(
                f"{_source(cfg, source)}: model.block_size = {block} needs at least {need} tokens in each "
                f"split, but the {split} split of {meta_path} has {tokens}: lower model.block_size, or give "
                f"the data more tokens (data.val_fraction, a larger corpus)")
