"""mwm.config.layout: GPT-2's parameter layout without torch, against the model it describes."""

import pytest

from mwm.optim.assignments import module_kind
from mwm.config.layout import SIZES, check_dims, hidden_matrix_names, hidden_matrix_shapes, model_shape
from mwm.optim.vocab import match_patterns
from mwm.config.names import ATTN_KEYS, ATTN_MATRICES, MLP_KEYS, MLP_MATRICES
from mwm.train.model import GPT, GPTConfig


@pytest.mark.parametrize("n_layer", [1, 3])
def test_hidden_matrix_names_are_the_models(n_layer):
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=n_layer, n_head=2, n_embd=8))
    hidden = [n for n, p in model.named_parameters() if module_kind(n, p) is not None]
    assert hidden_matrix_names(n_layer) == hidden


def test_hidden_matrix_shapes_are_the_models():
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8))
    params = dict(model.named_parameters())
    for key, (fan_in, fan_out) in hidden_matrix_shapes(8).items():
        assert tuple(params[f"transformer.h.0.{key}.weight"].shape) == (fan_out, fan_in), key
    assert hidden_matrix_shapes(768)["attn.c_attn"] == (768, 2304)  # GPT-2 small's, as the paper's table


def test_short_matrix_names_are_the_spectral_logs_matrix_column():
    assert ATTN_MATRICES == ("c_attn", "c_proj") and MLP_MATRICES == ("c_fc", "c_proj")
    assert [k.rsplit(".", 1)[1] for k in (*ATTN_KEYS, *MLP_KEYS)] == [*ATTN_MATRICES, *MLP_MATRICES]


def test_shapes_and_patterns():
    assert model_shape({"size": "gpt2"}) == SIZES["gpt2"]
    assert model_shape({"size": None, "n_layer": 2, "n_head": 2, "n_embd": 8}) == dict(n_layer=2, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match="n_embd=15 is not divisible by n_head=2"):
        check_dims(2, 2, 15, 16, 8)
    names = hidden_matrix_names(2)
    plan = match_patterns(names, {"transformer.h.0.attn.*": "stiefel", "*.mlp.*": "dgram"})
    assert (plan["transformer.h.0.attn.c_attn.weight"] == "stiefel"
            and plan["transformer.h.1.attn.c_proj.weight"] == "none")
    assert plan["transformer.h.1.mlp.c_fc.weight"] == "dgram"
    with pytest.raises(ValueError, match=r"\['\*.mlp.\*'\] match no hidden matrix"):  # shadowed by "*"
        match_patterns(names, {"*": "stiefel", "*.mlp.*": "dgram"})

