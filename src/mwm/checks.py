"""What a config alone can tell about its runs, checked before any job (issue 24, item 3).

:func:`check_config` builds the config's model on PyTorch's ``meta`` device (shapes and
parameter names, no memory, no data): ``n_embd`` must divide by ``n_head``, and every
``grid.custom`` pattern must match one of its hidden matrices. ``rules/common.smk`` calls it
when Snakemake loads the workflow, ``mwm.train`` before it reads any data.

:func:`check_splits` (in :mod:`mwm.data.splits`, so the data stage needs no training code) compares the data stage's ``meta.json`` (token counts of each split)
with ``model.block_size``: the data job checks it after tokenizing (``mwm.data prepare
--config``), and ``rules/common.smk`` at load when the data folder already exists (another
config with the same data section made it), so no training starts on a split too short.
"""

from __future__ import annotations

from .config import ConfigError

__all__ = ["check_config", "check_splits", "min_split_tokens"]

from .data.splits import check_splits, min_split_tokens  # noqa: E402  (torch-free: the data stage's own)


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
