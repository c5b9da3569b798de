"""GPT-2's parameter layout without torch: named sizes, the shape rules, the hidden
matrices' names and how ``grid.custom`` patterns map onto them.

Torch-free (standard library only), so the Snakefile can check a config's model and
patterns when it loads (:mod:`mwm.plan.checks`; ``tests/config/test_names.py`` checks no torch is
imported). :mod:`mwm.train.model` builds the model from the same sizes and rules, and
:mod:`mwm.optim.assignments` maps patterns with :func:`mwm.optim.vocab.match_patterns`; ``tests/config/test_layout.py``
checks :func:`hidden_matrix_names` against the built model's parameters.
"""

from __future__ import annotations

from typing import Mapping

from mwm.optim.vocab import ATTN_KEYS, MLP_KEYS

__all__ = ["SIZES", "model_shape", "check_dims", "hidden_matrix_names", "hidden_matrix_shapes"]

#: Named sizes; ``gpt2`` is GPT-2 small.
SIZES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
}


def model_shape(model: Mapping) -> dict:
    """``{n_layer, n_head, n_embd}`` of a config's model section (its named size, else its keys)."""
    return dict(SIZES[model["size"]]) if model.get("size") else {k: model[k] for k in ("n_layer", "n_head", "n_embd")}


def check_dims(n_layer: int, n_head: int, n_embd: int, vocab_size: int, block_size: int) -> None:
    """ValueError for dimensions no GPT can have (the rule :class:`mwm.train.model.GPTConfig` applies)."""
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
    for key, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                       ("n_head", n_head), ("n_embd", n_embd)):
        if value < 1:
            raise ValueError(f"model {key} must be >= 1, got {value}")


def hidden_matrix_names(n_layer: int) -> list[str]:
    """The full parameter names of the hidden matrices (the 2-D weights Muon trains), in model order."""
    return [f"transformer.h.{i}.{key}.weight" for i in range(n_layer) for key in (*ATTN_KEYS, *MLP_KEYS)]


def hidden_matrix_shapes(n_embd: int) -> dict[str, tuple[int, int]]:
    """``{key: (fan_in, fan_out)}`` of one block's hidden matrices (keys as ``ATTN_KEYS``, ``MLP_KEYS``)
    at width ``n_embd``: the shapes :mod:`mwm.train.model` builds (its weights are ``fan_out x fan_in``)."""
    n = n_embd
    return dict(zip((*ATTN_KEYS, *MLP_KEYS), ((n, 3 * n), (n, n), (n, 4 * n), (4 * n, n))))
