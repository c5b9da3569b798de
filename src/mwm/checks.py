"""What a config alone can tell about its runs, checked before any job (issue 24, item 3).

:func:`check_config` applies the model's shape rules and maps every ``grid.custom``
pattern onto the model's hidden-matrix names (:mod:`mwm.layout`: torch-free, no data):
``n_embd`` must divide by ``n_head``, and every pattern must match a hidden matrix.
``rules/common.smk`` calls it when Snakemake loads the workflow, ``mwm.train`` before it
reads any data.

:func:`check_splits` (in :mod:`mwm.data.splits`, so the data stage needs no training code)
compares the data stage's ``meta.json`` (token counts of each split) with
``model.block_size``: the data job checks it after tokenizing (``mwm.data prepare
--config``), and ``rules/common.smk`` at load when the data folder already exists (another
config with the same data section made it), so no training starts on a split too short.
"""

from __future__ import annotations

from .config import ConfigError
from .data.splits import check_splits, min_split_tokens

__all__ = ["check_config", "check_splits", "min_split_tokens"]


def _source(cfg: dict, source: str | None) -> str:
    return source or f"config {cfg['name']!r}"


def check_config(cfg: dict, source: str | None = None) -> None:
    """Raise ConfigError (naming ``source``, the key and the value) for a model shape that
    cannot be built or a grid.custom pattern that matches no hidden matrix of it."""
    from .layout import check_dims, hidden_matrix_names, match_patterns, model_shape
    from .runs import assignment_spec

    where = _source(cfg, source)
    m = cfg["model"]
    shape = model_shape(m)
    try:  # the vocabulary may come from the data later; the names do not depend on it
        check_dims(**shape, vocab_size=m["vocab_size"] or 2, block_size=m["block_size"])
    except ValueError as exc:
        raise ConfigError(f"{where}: model: {exc}") from exc
    hidden = hidden_matrix_names(shape["n_layer"])
    for name in cfg["grid"]["assignments"]:
        spec = assignment_spec(cfg["grid"], name)
        if isinstance(spec, str):
            continue
        try:
            match_patterns(hidden, spec)
        except ValueError as exc:
            raise ConfigError(f"{where}: grid.custom.{name}: {exc}") from exc
