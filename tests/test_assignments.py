"""mwm.assignments: named assignments and ``grid.custom`` patterns mapped onto the model's
parameters (attention and MLP matrices to their manifolds, everything else to AdamW)."""

import pytest

from mwm.assignments import resolve_assignment
from mwm.model import GPT, GPTConfig


def tiny_gpt():
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8))


def test_named_assignments_map_attention_and_mlp():
    model = tiny_gpt()
    plan = resolve_assignment(dict(model.named_parameters()), "hetero")
    assert plan["transformer.h.0.attn.c_attn.weight"] == "stiefel"
    assert plan["transformer.h.1.mlp.c_proj.weight"] == "dgram"
    assert plan["transformer.wte.weight"] == "adamw"
    assert plan["transformer.h.0.ln_1.weight"] == "adamw"
    inv = resolve_assignment(dict(model.named_parameters()), "hetero-inv")
    assert inv["transformer.h.0.attn.c_proj.weight"] == "dgram"
    assert all(v == "adamw" for v in resolve_assignment(dict(model.named_parameters()), "adamw").values())


def test_pattern_mapping_per_layer():
    model = tiny_gpt()
    plan = resolve_assignment(
        dict(model.named_parameters()),
        {"transformer.h.0.attn.*": "stiefel", "*.mlp.c_fc.*": "oblique"},
    )
    assert plan["transformer.h.0.attn.c_attn.weight"] == "stiefel"
    assert plan["transformer.h.1.attn.c_attn.weight"] == "none"
    assert plan["transformer.h.1.mlp.c_fc.weight"] == "oblique"


def test_unknown_assignment_and_dead_pattern_are_errors():
    params = dict(tiny_gpt().named_parameters())
    with pytest.raises(ValueError, match="unknown assignment 'heter'.*hetero-inv"):
        resolve_assignment(params, "heter")
    with pytest.raises(ValueError, match=r"match no hidden matrix"):
        resolve_assignment(params, {"*.attn.q_proj.*": "stiefel"})
    with pytest.raises(ValueError, match="unknown manifold 'spd'"):
        resolve_assignment(params, {"*.attn.*": "spd"})
