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
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits.reshape(-1, 32), idx.reshape(-1)).item())
    att = model.attention_logits(idx)
    assert len(att) == 2 and all(a.shape == (3, 2, 8, 8) for a in att)


def test_a_sequence_longer_than_the_block_is_refused():
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        tiny()(torch.zeros(1, 9, dtype=torch.long))
