import torch

from mwm.train.diagnostics import softmax_jacobian_fro


def test_jacobian_norm_matches_explicit_matrix_including_saturated_rows():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 12, generator=g, dtype=torch.float64) * torch.logspace(-1, 2, 50, dtype=torch.float64)[:, None]
    s = torch.softmax(z, -1)
    # the explicit matrix, with J_ii = s_i (sum_{j != i} s_j) so its diagonal does not cancel
    others = torch.stack([torch.cat([s[:, :i], s[:, i + 1:]], -1).sum(-1) for i in range(s.shape[-1])], -1)
    J = torch.diag_embed(s * others) - (s[..., :, None] * s[..., None, :]) * (1 - torch.eye(s.shape[-1], dtype=s.dtype))
    explicit = J.flatten(-2).norm(dim=-1)
    got = softmax_jacobian_fro(s)
    assert torch.allclose(got, explicit, rtol=1e-9, atol=1e-300)
    # a saturated row (Delta z = 60): the closed form would give ~1e-8, the true norm is ~e^-60
    s_sat = torch.softmax(torch.tensor([[60.0, 0.0, 0.0]], dtype=torch.float64), -1)
    assert softmax_jacobian_fro(s_sat).item() < 1e-20
    # uniform attention over n keys: ||J||_F^2 = (n - 1) / n^2
    uniform = softmax_jacobian_fro(torch.full((1, 4), 0.25, dtype=torch.float64)).item()
    assert abs(uniform**2 - 3 / 16) < 1e-15


def test_attention_stats_measure_the_qk_scaled_model_and_do_not_move_with_the_weights_scale():
    import pytest

    from mwm.train.diagnostics import attention_stats
    from mwm.train.model import GPT, GPTConfig

    c = 4.0
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, qk_scale=c))
    probe = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1))
    before = attention_stats(model, probe, 0)
    assert all(r["logit_range_max"] <= 2 * c * (1 + 1e-6) for r in before)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:32] *= 100.0  # W_Q and W_K
    after = attention_stats(model, probe, 1)
    for a, b in zip(before, after):
        assert b["entropy_mean"] == pytest.approx(a["entropy_mean"], abs=1e-5)
        assert b["logit_range_max"] == pytest.approx(a["logit_range_max"], abs=1e-4)
        assert b["qk_spectral_norm"] == pytest.approx(1e4 * a["qk_spectral_norm"], rel=1e-6)  # the weights did grow
