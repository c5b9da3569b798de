"""What training logs at each evaluation: spectra of the hidden matrices and
attention-saturation statistics (the link the paper could not measure).

Spectral rows (one per matrix): the four hidden matrices of every block and,
split out of the fused ``c_attn``, ``W_Q``, ``W_K``, ``W_V`` (each ``d x d``).
Attention rows (one per layer and head), on a fixed probe batch, over the causal
rows that have at least two keys:

- ``logit_range_max`` / ``logit_range_mean``: ``Delta z = max z - min z`` per row;
- ``entropy_mean``: mean attention entropy (nats);
- ``jac_fro_mean`` / ``jac_fro_min``: Frobenius norm of ``diag(s) - s s^T`` per row
  (:func:`softmax_jacobian_fro`, accurate for saturated rows too);
- ``frac_saturated``: share of rows whose largest probability exceeds 0.99;
- ``qk_spectral_norm``: ``||W_Q^h W_K^h^T||_2`` of the head.
"""

from __future__ import annotations

import torch

from mwm.optim.assignments import layer_of, module_kind

__all__ = ["SPECTRAL_COLUMNS", "ATTENTION_COLUMNS", "spectral_stats", "attention_stats", "softmax_jacobian_fro"]

SPECTRAL_COLUMNS = [
    "step", "name", "layer", "module", "matrix", "manifold", "sigma_max", "sigma_min",
    "gram_offdiag_norm", "colnorm_max", "colnorm_min", "fro_norm",
]
ATTENTION_COLUMNS = [
    "step", "layer", "head", "logit_range_max", "logit_range_mean", "entropy_mean",
    "jac_fro_mean", "jac_fro_min", "frac_saturated", "qk_spectral_norm",
]


def _one(W: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The statistics of one matrix, computed on a float64 copy on the CPU: on a GPU the
    float64 SVD would be slow and sync anyway, and the arrays go to an NPZ file."""
    T = W.detach().to(device="cpu", dtype=torch.float64)
    if T.shape[0] < T.shape[1]:
        T = T.T
    sv = torch.linalg.svdvals(T)
    gram = T.T @ T
    cn = gram.diagonal().sqrt()
    off = (gram - torch.diag(gram.diagonal())).norm()
    row = dict(sigma_max=sv[0].item(), sigma_min=sv[-1].item(), gram_offdiag_norm=off.item(),
               colnorm_max=cn.max().item(), colnorm_min=cn.min().item(), fro_norm=T.norm().item())
    return row, sv.float(), cn.float()


@torch.no_grad()
def spectral_stats(model: torch.nn.Module, assignment: dict[str, str], step: int):
    """Rows for ``spectral.csv`` and arrays ``{key: singular values / column norms}`` for the NPZ."""
    rows, arrays = [], {}
    for name, p in model.named_parameters():
        kind = module_kind(name, p)
        if kind is None:
            continue
        layer = layer_of(name)
        matrix = name.split(".")[-2]
        mats = [(matrix, p)]
        if matrix == "c_attn":
            d = p.shape[1]
            mats += [(k, p[i * d:(i + 1) * d]) for i, k in enumerate(("W_Q", "W_K", "W_V"))]
        for mname, W in mats:
            stats, sv, cn = _one(W)
            key = f"{name}" if mname == matrix else f"{name}:{mname}"
            rows.append(dict(step=step, name=key, layer=layer, module=kind, matrix=mname,
                             manifold=assignment.get(name, "adamw"), **stats))
            arrays[f"sv/{key}"] = sv.numpy()
            arrays[f"colnorm/{key}"] = cn.numpy()
    return rows, arrays


def softmax_jacobian_fro(s: torch.Tensor) -> torch.Tensor:
    """``||diag(s) - s s^T||_F`` along the last dimension, without cancellation.

    ``||J||_F^2 = sum_i s_i^2 (1 - s_i)^2 + sum_i s_i^2 sum_{j != i} s_j^2``; for the
    largest entry ``1 - s_i`` and ``sum_{j != i} s_j^2`` are summed from the other
    entries instead of subtracted, so a saturated row keeps its true (tiny) norm
    (the closed form ``||s||^2 - 2||s||_3^3 + ||s||^4`` bottoms out near 1e-8).
    """
    top = s.argmax(-1, keepdim=True)
    is_top = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, top, True)
    rest = s.masked_fill(is_top, 0.0)
    one_minus = torch.where(is_top, rest.sum(-1, keepdim=True), 1.0 - s)
    sq = s.square()
    others_sq = torch.where(is_top, rest.square().sum(-1, keepdim=True), sq.sum(-1, keepdim=True) - sq)
    return (sq * one_minus.square() + sq * others_sq).sum(-1).sqrt()


@torch.no_grad()
def attention_stats(model, probe: torch.Tensor, step: int) -> list[dict]:
    """Rows for ``attention.csv`` on the probe batch ``probe`` (B, T)."""
    was_training = model.training
    model.eval()
    try:
        all_logits = model.attention_logits(probe)
    finally:
        model.train(was_training)
    T = probe.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=probe.device).tril()
    rows_ok = causal.sum(-1) >= 2  # rows with at least two keys
    rows = []
    for layer, (z, block) in enumerate(zip(all_logits, model.transformer.h)):
        z = z.double()
        zmax = z.masked_fill(~causal, float("-inf")).amax(-1)
        zmin = z.masked_fill(~causal, float("inf")).amin(-1)
        drange = (zmax - zmin)[..., rows_ok]  # (B, nh, R)
        s = torch.softmax(z.masked_fill(~causal, float("-inf")), dim=-1)[..., rows_ok, :]
        ent = -(s * torch.log(s.clamp_min(1e-300))).sum(-1)
        jac = softmax_jacobian_fro(s)
        sat = (s.amax(-1) > 0.99).double()
        # per head, reduced over batch and rows on the logits' device, then read once
        per_head = torch.stack([drange.amax((0, 2)), drange.mean((0, 2)), ent.mean((0, 2)), jac.mean((0, 2)),
                                jac.amin((0, 2)), sat.mean((0, 2))]).cpu().tolist()
        W = block.attn.c_attn.weight.detach().to(device="cpu", dtype=torch.float64)
        d = W.shape[1]
        nh = block.attn.n_head
        hs = d // nh
        WQ, WK = W[:d].T, W[d:2 * d].T  # (d, d): q = x W_Q
        for h in range(nh):
            cols = slice(h * hs, (h + 1) * hs)
            _, RQ = torch.linalg.qr(WQ[:, cols])
            _, RK = torch.linalg.qr(WK[:, cols])
            qk = torch.linalg.matrix_norm(RQ @ RK.T, 2).item()  # ||W_Q^h W_K^h^T||_2
            rmax, rmean, emean, jmean, jmin, fsat = (col[h] for col in per_head)
            rows.append(dict(
                step=step, layer=layer, head=h, logit_range_max=rmax, logit_range_mean=rmean,
                entropy_mean=emean, jac_fro_mean=jmean, jac_fro_min=jmin, frac_saturated=fsat,
                qk_spectral_norm=qk,
            ))
    return rows
