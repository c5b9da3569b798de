"""mwm.layout: GPT-2's parameter layout without torch, against the model it describes."""

import pytest

from mwm.assignments import module_kind
from mwm.layout import SIZES, check_dims, hidden_matrix_names, match_patterns, model_shape
from mwm.model import GPT, GPTConfig


@pytest.mark.parametrize("n_layer", [1, 3])
def test_hidden_matrix_names_are_the_models(n_layer):
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=n_layer, n_head=2, n_embd=8))
    hidden = [n for n, p in model.named_parameters() if module_kind(n, p) is not None]
    assert hidden_matrix_names(n_layer) == hidden


def test_shapes_and_patterns():
    assert model_shape({"size": "gpt2"}) == SIZES["gpt2"]
    assert model_shape({"size": None, "n_layer": 2, "n_head": 2, "n_embd": 8}) == dict(n_layer=2, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match="n_embd=15 is not divisible by n_head=2"):
        check_dims(2, 2, 15, 16, 8)
    names = hidden_matrix_names(2)
    plan = match_patterns(names, {"transformer.h.0.attn.*": "stiefel", "*.mlp.*": "dgram"})
    assert plan["transformer.h.0.attn.c_attn.weight"] == "stiefel" and plan["transformer.h.1.attn.c_proj.weight"] == "none"
    assert plan["transformer.h.1.mlp.c_fc.weight"] == "dgram"
    with pytest.raises(ValueError, match=r"\['\*.mlp.\*'\] match no hidden matrix"):  # shadowed by "*"
        match_patterns(names, {"*": "stiefel", "*.mlp.*": "dgram"})
