"""mwm.train.model: GPT-2 in nanoGPT's layout."""

import pytest
import torch

from mwm.train.model import GPT, GPT2_SMALL_PARAMS, GPTConfig


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16, **kw}))


def test_gpt2_small_has_gpt2_parameter_count():
    model = GPT(GPTConfig(vocab_size=50257, block_size=1024, bias=True))
    assert model.num_params() == GPT2_SMALL_PARAMS


def test_a_token_changes_no_logit_before_it():
    """Causal: the logits at positions < k do not depend on the token at k."""
    model = tiny().eval()
    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    other = idx.clone()
    other[:, 5] = (other[:, 5] + 1) % 32
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(other)
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_loss_is_the_cross_entropy_of_the_logits_and_attention_logits_are_per_layer():
    model = tiny().eval()
    idx = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 8, 32)
    assert loss.item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits.reshape(-1, 32), idx.reshape(-1)).item())
    att = model.attention_logits(idx)
    assert len(att) == 2 and all(a.shape == (3, 2, 8, 8) for a in att)


def test_a_sequence_longer_than_the_block_is_refused():
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        tiny()(torch.zeros(1, 9, dtype=torch.long))


# --- train.attn_qk_scale: attention on unit queries and keys at a fixed scale ------------------------
def _old_attention_forward(attn, x):
    """The attention forward as it was before qk_scale existed (the reference for the None path)."""
    B, T, C = x.shape
    q, k, v = attn.qkv(x)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def _manual_attention(attn, x):
    """The attention output from ``attn.logits`` by an explicit masked softmax."""
    B, T, C = x.shape
    _, _, v = attn.qkv(x)
    z = attn.logits(x).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    y = torch.softmax(z, dim=-1) @ v
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def _scale_qk_rows(model, factor):
    with torch.no_grad():
        for block in model.transformer.h:
            d = block.attn.n_embd
            block.attn.c_attn.weight[:2 * d] *= factor


IDX = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(3))


def test_unset_qk_scale_leaves_the_forward_and_the_export_exactly_as_before():
    assert GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16) == \
        GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, qk_scale=None)
    model = tiny().eval()
    assert "qk_scale" not in model.export_config()  # summary.json's model section is unchanged
    with torch.no_grad():
        new, _ = model(IDX)
        x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(4))
        for block in model.transformer.h:
            assert torch.equal(block.attn(x), _old_attention_forward(block.attn, x))
        for block in model.transformer.h:  # the whole model on the old attention
            block.attn.forward = lambda x, a=block.attn: _old_attention_forward(a, x)
        old, _ = model(IDX)
    assert torch.equal(new, old)


@pytest.mark.parametrize("c", [None, 4.0])
def test_logits_are_the_ones_the_forward_softmax_takes(c):
    model = tiny(qk_scale=c).eval()
    x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for block in model.transformer.h:
            assert torch.allclose(block.attn(x), _manual_attention(block.attn, x), atol=1e-6, rtol=1e-5)


def test_qk_scale_bounds_the_logits_whatever_the_query_and_key_weights():
    c = 4.0
    model = tiny(qk_scale=c).eval()
    base = tiny().eval()
    att = model.attention_logits(IDX)
    assert all(z.abs().max() <= c * (1 + 1e-6) for z in att)
    with torch.no_grad():
        out, _ = model(IDX)
    base_att = base.attention_logits(IDX)
    _scale_qk_rows(model, 100.0)
    _scale_qk_rows(base, 100.0)
    # the saturation-removal property: the capped model's logits and outputs do not move ...
    for z, z100 in zip(att, model.attention_logits(IDX)):
        assert torch.allclose(z, z100, atol=1e-5)
        assert z100.abs().max() <= c * (1 + 1e-6)
    with torch.no_grad():
        assert torch.allclose(out, model(IDX)[0], atol=1e-5)
    # ... while the standard model's logits grow with the weights' scale squared
    assert torch.allclose(base.attention_logits(IDX)[0], 1e4 * base_att[0], rtol=1e-4, atol=1e-6)


def test_qk_scale_gradients_are_finite_even_for_zero_queries():
    for zero in (False, True):
        model = tiny(qk_scale=4.0)
        if zero:  # q = k = 0 (no bias): the eps floor keeps the normalization and its gradient finite
            _scale_qk_rows(model, 0.0)
        _, loss = model(IDX, IDX)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_qk_scale_round_trips_through_the_export_and_is_checked():
    model = tiny(qk_scale=4.0)
    exported = model.export_config()
    assert exported["qk_scale"] == 4.0 and GPTConfig(**exported) == model.config
    assert GPTConfig(**tiny().export_config()) == tiny().config
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="qk_scale"):
            tiny(qk_scale=bad)


def test_the_train_key_attn_qk_scale_builds_the_model_with_it():
    from mwm.config import validate
    from mwm.train.batches import build_model_config

    model = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 16}
    assert build_model_config(validate({"name": "t", "model": model}), 32).qk_scale is None
    got = build_model_config(validate({"name": "t", "model": model, "train": {"attn_qk_scale": 4}}), 32)
    assert got.qk_scale == 4 and GPT(got).transformer.h[1].attn.qk_scale == 4
