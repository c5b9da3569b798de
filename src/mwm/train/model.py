"""GPT-2 as in nanoGPT: pre-LayerNorm blocks, fused ``attn.c_attn``, ``attn.c_proj``,
``mlp.c_fc`` (GELU) and ``mlp.c_proj``, tied LM head, optional biases.

Training attention uses PyTorch's scaled-dot-product kernel;
:meth:`GPT.attention_logits` recomputes the pre-softmax logits of every layer
explicitly for the attention diagnostics. With ``qk_scale`` set, attention scores
per-head unit queries and keys at that fixed scale (:class:`CausalSelfAttention`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mwm.config.layout import SIZES, check_dims

__all__ = ["GPTConfig", "GPT", "SIZES", "GPT2_SMALL_PARAMS"]

#: GPT-2 small's parameter count (vocab 50257, context 1024, with biases).
GPT2_SMALL_PARAMS = 124_439_808


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False
    #: None: the standard logits q.k / sqrt(d_head). c: c * cos(q, k) on per-head unit q and k
    #: (``train.attn_qk_scale``), bounded in [-c, c] whatever the weights' scale.
    qk_scale: float | None = None

    def __post_init__(self):
        check_dims(self.n_layer, self.n_head, self.n_embd, self.vocab_size, self.block_size)
        if self.qk_scale is not None and not (math.isfinite(self.qk_scale) and self.qk_scale > 0):
            raise ValueError(f"qk_scale must be a finite number > 0 or None, got {self.qk_scale!r}")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's always has one)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """Causal multi-head attention. With ``cfg.qk_scale = c`` its logits are ``c * (q/||q||).(k/||k||)``
    per head, no learned gain: bounded in [-c, c], so the logits cannot grow with the weights' singular
    values (softmax saturation), while the weights and the optimizer stay as they are. The choice of c
    and the entropy floor it implies: the schema's ``train.attn_qk_scale``."""

    #: Floor of ||q||, ||k|| in the normalization, so a zero vector gives zero logits, not NaN.
    QK_EPS = 1e-6

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.qk_scale = cfg.qk_scale
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def qkv(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        return [t.view(shape).transpose(1, 2) for t in (q, k, v)]  # (B, nh, T, hs)

    def unit_qk(self, q, k):
        """q and k normalized to unit L2 norm over the head dimension (the ``qk_scale`` path)."""
        return F.normalize(q, dim=-1, eps=self.QK_EPS), F.normalize(k, dim=-1, eps=self.QK_EPS)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        dropout_p = self.dropout if self.training else 0.0
        if self.qk_scale is None:  # the standard path, literally as before
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            q, k = self.unit_qk(q, k)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.qk_scale)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def logits(self, x):
        """Pre-softmax attention logits, (B, nh, T, T), unmasked: those the forward's softmax takes,
        ``q k^T / sqrt(d_k)``, or ``qk_scale * q_hat k_hat^T`` on unit q and k."""
        q, k, _ = self.qkv(x)
        if self.qk_scale is None:
            return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        q, k = self.unit_qk(q, k)
        return self.qk_scale * (q @ k.transpose(-2, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=LayerNorm(cfg.n_embd, cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """All parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def attention_logits(self, idx) -> list[torch.Tensor]:
        """Per layer, the pre-softmax logits (B, nh, T, T) on ``idx``, and nothing else."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        out = []
        for block in self.transformer.h:
            out.append(block.attn.logits(block.ln_1(x)))
            x = block(x)
        return out

    def export_config(self) -> dict:
        """The config as a dict (``GPTConfig(**d)`` rebuilds it); ``qk_scale`` only when set, so a
        standard model's export (summary.json's ``model``) is what it was before the field existed."""
        out = asdict(self.config)
        if out["qk_scale"] is None:
            del out["qk_scale"]
        return out
