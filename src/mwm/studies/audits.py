"""Numerical audits of the paper's theory statements.

1. **Softmax Jacobian** (section 'Softmax saturation kills the gradient'), with
   ``J = diag(s) - s s^T`` formed explicitly in float64:

   - identity ``||J||_F^2 = ||s||_2^2 - 2||s||_3^3 + ||s||_2^4``;
   - bound ``||J||_F^2 <= ||s||_2^2 (1 - ||s||_2^2) <= 1/4``;
   - corollary ``||J||_F <= sqrt(2(n-1)) exp(-Delta z / 2)`` with ``Delta z`` the logit
     range, as stated; and the same with ``Delta z`` replaced by the top *margin*
     ``gamma = z_(1) - z_(2)`` (what the proof's argument supports: with two tied top
     logits ``||J||_F -> 1/2`` however large the range).

   on Gaussian logits of many scales, structured families (uniform, k-way top ties,
   one spike, ramps) and gradient-ascent searches for the smallest slack.
2. **Logit bound** ``|Z_ij| <= ||X||_{2,inf}^2 / sqrt(d_k)`` = 96 for GPT-2 small, with
   an explicit Stiefel ``c_attn`` and LayerNorm'd tokens that attain it, and the
   largest logit of random ones.
3. **Singular-value growth**: with ``||A||_2 <= 1`` and a retraction that keeps the
   singular values of ``W - eta A`` (DGram's, either variant: the column-norm one
   keeps the column norms, which never exceed ``sigma_max``),
   ``sigma_max(W_t) <= sigma_max(W_0) + sum_s eta_s``. Tabulated for the paper's
   schedule; :func:`check_spectral_log` checks a training run's logged spectra.
4. **Tangent dimensions** of the three manifolds at GPT-2 small's shapes, and totals
   per assignment.

Outputs under ``--out``: ``softmax_jacobian.csv``, ``logit_bound.csv``,
``growth_bound.csv`` (``step, eta, eta_sum, bound``: the bound after the update of
``step``, every step up to 10k steps, thinned evenly beyond), ``tangent_dims.csv``, ``spectral_check.csv`` (its
header alone without a spectral log) and ``audits.json`` (the files of :data:`mwm.workflow.stages.STAGES`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from mwm import paper
from mwm.optim.manifolds import get_manifold
from mwm.optim.msign import GRAM_RESTART, msign, polar_exact
from mwm.config.names import NAMED_ASSIGNMENTS, STUDY_MANIFOLDS, UNCONSTRAINED
from mwm.train.schedule import muon_lr_series
from mwm.studies.common import main_for, pair_seed, read_csv, resolve_device, run_meta, write_csv, write_json
from mwm.workflow.stages import STAGES

#: This study's output files (mwm.workflow.stages): the writers name them by key.
FILES = STAGES["audits"]

__all__ = [
    "softmax_quantities",
    "audit_softmax",
    "audit_logit_bound",
    "growth_bound_series",
    "audit_growth",
    "check_spectral_log",
    "audit_tangent_dims",
    "run_audits",
    "main",
]

SPECTRAL_COLUMNS = ("step", "name", "module", "manifold", "sigma_max")
#: Manifolds whose retraction keeps sigma_max(W - eta A) an upper bound (plain Muon
#: with decoupled weight decay too: (1 - lr wd) only shrinks).
GROWTH_BOUND_APPLIES = {"stiefel", "dgram", *(v for v, (mf, _) in STUDY_MANIFOLDS.items() if mf == "dgram"), "none",
                        "muon"}


# -- 1. softmax Jacobian ------------------------------------------------------------------

def _exclusive_sums(s: torch.Tensor) -> torch.Tensor:
    """``sum_{j != i} s_j`` for every ``i`` by prefix and suffix sums (no cancellation,
    so ``1 - s_i`` keeps its digits when ``s_i`` is close to 1)."""
    zero = torch.zeros_like(s[..., :1])
    left = torch.cat([zero, torch.cumsum(s, -1)[..., :-1]], -1)
    right = torch.cat([torch.cumsum(s.flip(-1), -1)[..., :-1].flip(-1), zero], -1)
    return left + right


def softmax_quantities(z: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per logit vector (rows of ``z``, float64).

    ``fro2`` is ``||J||_F^2`` summed entry by entry from ``J_ii = s_i (1 - s_i)`` and
    ``J_ij = -s_i s_j`` with ``1 - s_i`` taken as the sum of the other entries (all
    terms non-negative: accurate even when the softmax is saturated and ``||J||`` is
    1e-100); ``identity`` is the paper's closed form; ``bound`` is
    ``||s||^2 (1 - ||s||^2)`` with ``1 - ||s||^2 = sum_i s_i (1 - s_i)``; ``corollary``
    and ``corollary_margin`` the two exponential bounds.
    """
    z = z.to(torch.float64)
    n = z.shape[-1]
    s = torch.softmax(z, dim=-1)
    sq = s.square()
    other = _exclusive_sums(s)  # 1 - s_i
    other_sq = _exclusive_sums(sq)  # ||s||^2 - s_i^2
    fro2 = (sq * other.square()).sum(-1) + (sq * other_sq).sum(-1)
    s2 = sq.sum(-1)
    one_minus_s2 = (s * other).sum(-1)
    s3 = s.pow(3).sum(-1)
    top2 = torch.topk(z, 2, dim=-1).values
    dz = z.max(-1).values - z.min(-1).values
    margin = top2[:, 0] - top2[:, 1]
    c = math.sqrt(2.0 * (n - 1))
    return {
        "fro2": fro2, "identity": s2 - 2.0 * s3 + s2.square(), "bound": s2 * one_minus_s2,
        "corollary": c * torch.exp(-dz / 2.0), "corollary_margin": c * torch.exp(-margin / 2.0),
        "delta_z": dz, "margin": margin, "s2": s2,
    }


def explicit_jacobian_fro2(z: torch.Tensor, max_elements: int = 1 << 24) -> torch.Tensor:
    """``||diag(s) - s s^T||_F^2`` from the formed matrix (float64), chunked."""
    s = torch.softmax(z.to(torch.float64), dim=-1)
    N, n = s.shape
    out = torch.empty(N, dtype=torch.float64)
    step = max(1, max_elements // (n * n))
    for i in range(0, N, step):
        si = s[i:i + step]
        J = torch.diag_embed(si) - si.unsqueeze(-1) * si.unsqueeze(-2)
        out[i:i + step] = J.square().sum(dim=(-2, -1))
    return out


def _families(n: int, count: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random and structured logit vectors of size ``n``."""
    sig = torch.logspace(-2, 2, count, dtype=torch.float64)
    fam = {"gaussian": torch.randn(count, n, generator=gen, dtype=torch.float64) * sig[:, None]}
    deltas = torch.tensor([0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 192.0], dtype=torch.float64)
    rows = []
    for k in sorted({1, 2, 3, min(8, n)} & set(range(1, n + 1))):
        for d in deltas:  # k-way top tie at d, the rest at 0
            z = torch.zeros(n, dtype=torch.float64)
            z[:k] = d
            rows.append(z)
    fam["top_ties"] = torch.stack(rows)
    rows = []
    for d in deltas:
        rows.append(torch.linspace(0.0, float(d), n, dtype=torch.float64))  # ramp
        for g in (0.0, 0.5, 2.0):  # spike at d, runner-up at d - g, rest 0
            z = torch.zeros(n, dtype=torch.float64)
            z[0] = d
            if n > 2:
                z[1] = max(float(d) - g, 0.0)
            rows.append(z)
    fam["ramps_spikes"] = torch.stack(rows)
    return fam


def _ascent(n: int, check: str, restarts: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """Logit vectors found by Adam ascent on the violation of ``check`` (float64)."""
    if restarts == 0 or steps == 0:
        return torch.empty(0, n, dtype=torch.float64)
    scales = torch.logspace(-1, 1.5, restarts, dtype=torch.float64)
    z = (torch.randn(restarts, n, generator=gen, dtype=torch.float64) * scales[:, None]).requires_grad_(True)
    opt = torch.optim.Adam([z], lr=0.05)
    c = math.log(math.sqrt(2.0 * (n - 1)))
    for _ in range(steps):
        s = torch.softmax(z, -1)
        s2 = s.square().sum(-1)
        s3 = s.pow(3).sum(-1)
        fro2 = s2 - 2 * s3 + s2.square()
        if check == "bound":
            obj = fro2 - s2 * (1 - s2)
        elif check == "quarter":
            obj = s2 * (1 - s2) - 0.25
        elif check == "corollary":
            obj = 0.5 * torch.log(fro2.clamp_min(1e-300)) - c + (z.max(-1).values - z.min(-1).values) / 2
        else:  # corollary_margin
            t2 = torch.topk(z, 2, -1).values
            obj = 0.5 * torch.log(fro2.clamp_min(1e-300)) - c + (t2[:, 0] - t2[:, 1]) / 2
        opt.zero_grad()
        (-obj.sum()).backward()
        opt.step()
        with torch.no_grad():
            z.clamp_(-300, 300)
    return z.detach()


_CHECKS = {
    # check: (value key, bound key, squared?)  slack = bound - value
    "bound": ("fro2", "bound"),
    "quarter": ("bound", None),
    "corollary": ("fro", "corollary"),
    "corollary_margin": ("fro", "corollary_margin"),
}


def _check_rows(q: dict, family: str, n: int, explicit_err: float, tol: float = 1e-12) -> list[dict]:
    """One row per check. Identity: error relative to ``||s||^2`` (the size of its terms).
    Inequalities: ``slack = bound - value`` (negative = violated beyond ``tol``) and the
    largest ``value / bound`` over vectors whose bound is above 1e-250."""
    fro = q["fro2"].clamp_min(0).sqrt()
    rows = []
    err = (q["fro2"] - q["identity"]).abs()
    rel = err / q["s2"]
    k = int(rel.argmax())
    rows.append({"family": family, "n": n, "check": "identity", "vectors": len(fro),
                 "worst_slack": None, "max_ratio": None, "violations": int((rel > 1e-12).sum()),
                 "max_abs_error": float(err.max()), "max_rel_error": float(rel.max()),
                 "explicit_matrix_error": explicit_err,
                 "at_delta_z": float(q["delta_z"][k]), "at_margin": float(q["margin"][k])})
    for check, (vkey, bkey) in _CHECKS.items():
        value = fro if vkey == "fro" else q[vkey]
        bound = torch.full_like(value, 0.25) if bkey is None else q[bkey]
        slack = bound - value
        ok = bound > 1e-250
        ratio = torch.where(ok, value / bound.clamp_min(1e-300), torch.zeros_like(value))
        k = int(slack.argmin())
        rows.append({"family": family, "n": n, "check": check, "vectors": len(value),
                     "worst_slack": float(slack[k]), "max_ratio": float(ratio.max()),
                     "violations": int((slack < -tol * torch.clamp(bound.abs(), min=1e-300)).sum()),
                     "max_abs_error": None, "max_rel_error": None, "explicit_matrix_error": None,
                     "at_delta_z": float(q["delta_z"][k]), "at_margin": float(q["margin"][k])})
    return rows


def audit_softmax(sec: dict, base_seed: int = 0) -> tuple[list[dict], dict]:
    """Rows per (family, n, check) and a summary with the worst slack of each check."""
    rows = []
    for n in sec["sizes"]:
        gen = torch.Generator().manual_seed(pair_seed("softmax", n, base_seed))
        fams = _families(n, sec["random_per_size"], gen)
        for check in _CHECKS:
            fams[f"ascent_{check}"] = _ascent(n, check, sec["adversarial_restarts"], sec["adversarial_steps"], gen)
        for family, z in fams.items():
            if len(z):
                q = softmax_quantities(z)
                sub = z[:32]  # the entrywise sum against the formed matrix, on a subset
                explicit = explicit_jacobian_fro2(sub)
                e_err = float(((explicit - q["fro2"][:32]).abs() / q["s2"][:32]).max())
                rows.extend(_check_rows(q, family, n, e_err))
    # the Jacobian formula itself against autograd, on a few vectors
    gen = torch.Generator().manual_seed(pair_seed("softmax-autograd", base_seed))
    jac_err = 0.0
    for n in sorted(set(sec["sizes"]))[:3]:
        for _ in range(3):
            z = torch.randn(n, generator=gen, dtype=torch.float64) * 3
            J = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), z)
            s = torch.softmax(z, -1)
            jac_err = max(jac_err, float((J - (torch.diag(s) - torch.outer(s, s))).abs().max()))
    summary = {"jacobian_formula_vs_autograd_max_error": jac_err}
    for check in ["identity", *_CHECKS]:
        sel = [r for r in rows if r["check"] == check]
        if check == "identity":
            worst = max(sel, key=lambda r: r["max_abs_error"])
            summary[check] = {"vectors": sum(r["vectors"] for r in sel), "max_abs_error": worst["max_abs_error"],
                              "max_error_relative_to_s2": max(r["max_rel_error"] for r in sel),
                              "entrywise_vs_formed_matrix_max_error": max(r["explicit_matrix_error"] for r in sel),
                              "holds": all(r["violations"] == 0 for r in sel)}
            continue
        worst = min(sel, key=lambda r: r["worst_slack"])
        summary[check] = {
            "vectors": sum(r["vectors"] for r in sel), "worst_slack": worst["worst_slack"],
            "worst_at": {"family": worst["family"], "n": worst["n"], "delta_z": worst["at_delta_z"],
                         "margin": worst["at_margin"]},
            "max_ratio": max(r["max_ratio"] for r in sel),
            "violations": sum(r["violations"] for r in sel),
            "holds": all(r["violations"] == 0 for r in sel),
        }
    # the counterexample to the corollary as stated, in closed form
    summary["corollary_counterexample"] = {
        "z": "two tied top logits at D, the rest at 0 (n = 3)",
        "note": "||J||_F -> 1/2 as D grows while sqrt(2(n-1)) exp(-D/2) -> 0: the corollary fails once D > "
                "about 2 ln(2 sqrt(2(n-1))) (2.77 for n = 3); the proof's step "
                "sum_{j != 1} exp(z_j) <= (n-1) exp(z_1 - Delta z) "
                "reverses the inequality z_j >= z_1 - Delta z. With the top margin gamma = z_(1) - z_(2) in "
                "place of Delta z the argument goes through.",
        "examples": [],
    }
    for D in (4.0, 10.0, 20.0):
        q = softmax_quantities(torch.tensor([[D, D, 0.0]], dtype=torch.float64))
        summary["corollary_counterexample"]["examples"].append(
            {"D": D, "fro": float(q["fro2"][0].sqrt()), "stated_bound": float(q["corollary"][0]),
             "margin_bound": float(q["corollary_margin"][0])})
    summary["tightness"] = {
        "uniform_left_slack": float((lambda q: (q["bound"] - q["fro2"])[0])(
            softmax_quantities(torch.zeros(1, 7, dtype=torch.float64)))),
        "two_way_tie_n2_quarter_slack": float((lambda q: (0.25 - q["bound"])[0])(
            softmax_quantities(torch.zeros(1, 2, dtype=torch.float64)))),
    }
    return rows, summary


# -- 2. logit bound --------------------------------------------------------------------------

def _layernorm(X: torch.Tensor) -> torch.Tensor:
    X = X - X.mean(-1, keepdim=True)
    return X / X.square().mean(-1, keepdim=True).sqrt()


def audit_logit_bound(sec: dict, base_seed: int = 0) -> tuple[list[dict], dict]:
    """The bound ``d / sqrt(d_k)`` against a constructed maximiser and random tokens.

    ``c_attn`` is the nn.Linear weight (``3d x d``, tall) on Stiefel (``W^T W = I``), so
    every head's query and key blocks have spectral norm <= 1.
    """
    d, dk, H, T = sec["d"], sec["d_k"], sec["heads"], sec["tokens"]
    if H * dk > d:
        raise ValueError(f"studies.audits.logit_bound: heads * d_k = {H * dk} exceeds d = {d}")
    bound = d / math.sqrt(dk)
    gen = torch.Generator().manual_seed(pair_seed("logit", d, dk, base_seed))
    rows = []

    def head_logits(Wt, X):
        q, k = X @ Wt[:d].T, X @ Wt[d:2 * d].T
        out = []
        for h in range(H):
            sl = slice(h * dk, (h + 1) * dk)
            out.append(q[:, sl] @ k[:, sl].T / math.sqrt(dk))
        return torch.stack(out)

    # random Stiefel c_attn, LayerNorm'd Gaussian tokens
    Wt = polar_exact(torch.randn(3 * d, d, generator=gen, dtype=torch.float64))
    X = _layernorm(torch.randn(T, d, generator=gen, dtype=torch.float64))
    Z = head_logits(Wt, X)
    dz = (Z.amax(-1) - Z.amin(-1)).max()
    rows.append({"case": "random Stiefel c_attn, LayerNorm'd Gaussian tokens", "max_abs_logit": float(Z.abs().max()),
                 "max_row_range": float(dz), "bound": bound, "ratio": float(Z.abs().max()) / bound})
    # constructed: a zero-mean orthonormal pair u, v; head 0's first query row u, first key row v,
    # the other rows an orthonormal basis of the rest. Tokens x = sqrt(d) u, y = sqrt(d) v give
    # Z_xy = d / sqrt(d_k), and -y gives -d / sqrt(d_k): the row range 2 d / sqrt(d_k).
    B = torch.randn(d, d, generator=gen, dtype=torch.float64)
    B[:, 0] = 1.0  # first direction: the all-ones vector, excluded from the token space
    Qf, _ = torch.linalg.qr(B)
    u, v = Qf[:, 1], Qf[:, 2]
    basis = torch.cat([Qf[:, :1], Qf[:, 3:]], dim=1).T  # the rest, rows
    Wc = torch.zeros(3 * d, d, dtype=torch.float64)
    Wc[0], Wc[d] = u, v  # query row 0 and key row 0 of head 0
    Wc[2 * d:2 * d + basis.shape[0]] = basis  # value block takes the remaining directions
    stiefel_resid = float((Wc.T @ Wc - torch.eye(d, dtype=torch.float64)).abs().max())
    Xc = torch.stack([math.sqrt(d) * u, math.sqrt(d) * v, -math.sqrt(d) * v])
    Zc = head_logits(Wc, Xc)[0]
    rows.append({"case": "constructed Stiefel c_attn, tokens sqrt(d) u, sqrt(d) v, -sqrt(d) v",
                 "max_abs_logit": float(Zc.abs().max()), "max_row_range": float((Zc.amax(-1) - Zc.amin(-1)).max()),
                 "bound": bound, "ratio": float(Zc.abs().max()) / bound})
    summary = {
        "d": d, "d_k": dk, "bound": bound, "paper_value": 96.0,
        "matches_paper": abs(bound - 96.0) < 1e-12 if (d, dk) == (768, 64) else None,
        "attained": abs(float(Zc.abs().max()) - bound) < 1e-9 * bound,
        "constructed_stiefel_residual": stiefel_resid,
        "constructed_layernorm_fixed": bool(torch.allclose(_layernorm(Xc), Xc, atol=1e-9)),
        "random_max_abs_logit": rows[0]["max_abs_logit"],
        "note": "tight for off-diagonal logits (distinct tokens); assumes LayerNorm gain 1 and bias 0 "
                "(||x||_2 = sqrt(d)); a learned gain g scales the bound by max|g|^2",
    }
    return rows, summary


# -- 3. singular-value growth -----------------------------------------------------------------

def growth_bound_series(train: dict, steps: int | None = None) -> np.ndarray:
    """``eta_s`` for ``s = 0 .. steps-1`` (default ``max_iters``) from the released schedule."""
    return np.array(muon_lr_series(train, steps), dtype=np.float64)


def _msign_max_sv(d: int, gen: torch.Generator) -> dict[str, float]:
    """Largest singular value Polar Express returns (``||A||_2``), per evaluation order,
    on Gaussian and near-low-rank (rank 4 plus 1e-3 noise) test matrices."""
    best = {"direct": 0.0, "gram": 0.0}
    for m in (d, 3 * d):
        X = torch.randn(m, d, generator=gen)
        low = torch.randn(m, 4, generator=gen) @ torch.randn(4, d, generator=gen) + 1e-3 * X
        for M in (X, low):
            for method in best:
                sv = float(torch.linalg.svdvals(msign(M, method=method).double()).max())
                best[method] = max(best[method], sv)
    return best


def audit_growth(sec: dict, logit_sec: dict, base_seed: int = 0) -> tuple[list[tuple], dict]:
    sched = sec["schedule"]
    eta = growth_bound_series(sched)
    cum = np.cumsum(eta)  # cum[t] = sum_{s <= t} eta_s: the bound after the update of step t
    s0, a = sec["sigma0"], sec["a_norm"]
    bound = s0 + a * cum
    stride = max(1, -(-len(eta) // 10000))  # at most ~10k rows; the last step always
    keep = sorted(set(range(0, len(eta), stride)) | ({len(eta) - 1} if len(eta) else set()))
    rows = [(t, float(eta[t]), float(cum[t]), float(bound[t])) for t in keep]
    total = float(cum[-1]) if len(cum) else 0.0
    end = s0 + a * total
    thr = sec["threshold"]
    gen = torch.Generator().manual_seed(pair_seed("growth", base_seed))
    pe = _msign_max_sv(min(logit_sec["d"], 256), gen)
    at = {}
    for t in sec["report_steps"]:
        if t <= 0:
            at[str(t)] = s0
        elif t <= len(cum):
            at[str(t)] = float(s0 + a * cum[t - 1])  # after t updates
        else:
            at[str(t)] = None
    logit = logit_sec["d"] / math.sqrt(logit_sec["d_k"])
    need = math.sqrt(thr)
    summary = {
        "schedule": sched, "sigma0": s0, "a_norm": a, "eta_sum": total, "bound_at_end": end,
        "bound_after_steps": at,
        "polar_express_max_singular_value": pe,
        "polar_express_note": "the released code's order is direct; the Gram-space order (mwm.msign method='gram', "
                              "chosen by 'auto' for matrices with m >= 2n and n >= 128) rebuilds its iterate after "
                              f"{GRAM_RESTART} steps; without that restart it lost the small singular directions of "
                              "an ill-conditioned input in float32 and returned ||A||_2 up to ~700",
        "bound_at_end_with_measured_a_norm": {k: s0 + max(a, v) * total for k, v in pe.items()},
        "threshold": thr,
        "sigma_max_can_reach_threshold": end >= thr,
        "steps_at_peak_lr_to_reach_threshold": math.ceil((thr - s0) / (a * sched["muon_lr"]))
        if sched["muon_lr"] > 0 else None,
        "quantities": {
            "sigma_max": {"bound_at_end": end, "reaches_threshold": end >= thr},
            "sigma_max_squared (largest Gram eigenvalue / Gram diagonal entry, ||W_Q W_K^T||_2 bound)": {
                "bound_at_end": end**2, "reaches_threshold": end**2 >= thr,
                "needed_fraction_of_max_growth_rate": (need - s0) / (a * total) if total > 0 else None},
            "logit_bound d/sqrt(d_k) * sigma_max^2": {"bound_at_end": logit * end**2,
                                                       "reaches_threshold": logit * end**2 >= thr},
            "condition number sigma_max / sigma_min": {"bound_at_end": None, "reaches_threshold": True,
                                                       "note": "unbounded: sigma_min can shrink towards 0"},
        },
        "note": ("Under the stated algorithm sigma_max grows at most additively, by eta_s per step, so at most "
                 "linearly in the cumulative learning rate, never exponentially for long. A logged sigma_max "
                 "above the bound means the run is not the stated algorithm (an ||A||_2 > 1, a retraction that "
                 "inflates singular values, a different schedule) or the logged quantity is another one, e.g. "
                 "sigma^2 (a Gram eigenvalue or diagonal entry)."),
    }
    return rows, summary


def check_spectral_log(path: str | Path, train: dict, a_norm: float = 1.0, rtol: float = 1e-3,
                       threshold: float | None = None) -> tuple[list[dict], dict]:
    """Check every logged ``sigma_max`` against the growth bound.

    ``path`` is a CSV with at least the columns ``step, name, module, manifold,
    sigma_max`` (one row per logged matrix and step); ``train`` the train section
    (``learning_rate, min_lr, warmup_iters, lr_decay_iters, decay_lr, muon_lr,
    max_iters``). Per matrix, the first logged row is the base ``(t0, sigma0)`` and

        bound(t) = sigma0 + a_norm * sum_{s = t0}^{t} eta_s

    (both ends included, so it holds whether a row is logged before or after the
    update of its step). A sub-matrix row (``parent:sub``, e.g. the ``W_Q`` rows of
    ``c_attn``) takes its parent's base when the parent is logged: a block's sigma_max
    never exceeds its parent's, while the block alone need not grow additively. Rows of
    ``oblique`` matrices are not checked (normalizing columns can raise sigma_max);
    unknown manifolds (``adamw``) neither. A row fails when
    ``sigma_max > bound (1 + rtol)``. Returns ``(rows, summary)``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spectral log {path} does not exist")
    raw = read_csv(path)
    if raw:
        missing = [c for c in SPECTRAL_COLUMNS if c not in raw[0]]
    else:
        with open(path) as fh:
            header = fh.readline().strip().split(",")
        missing = [c for c in SPECTRAL_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"spectral log {path} lacks column(s) {', '.join(missing)} "
                         f"(needs {', '.join(SPECTRAL_COLUMNS)})")
    for key in ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "muon_lr", "max_iters"):
        if key not in train:
            raise KeyError(f"train section lacks {key!r}, needed for the growth bound")
    recs = []
    for i, r in enumerate(raw):
        try:
            step, sig = int(float(r["step"])), float(r["sigma_max"])
        except ValueError as exc:
            raise ValueError(f"spectral log {path}, data row {i + 1}: bad step or sigma_max "
                             f"({r['step']!r}, {r['sigma_max']!r})") from exc
        if step < 0:
            raise ValueError(f"spectral log {path}, data row {i + 1}: negative step {step}")
        recs.append({"step": step, "name": r["name"], "module": r["module"], "manifold": r["manifold"],
                     "sigma_max": sig})
    last = max((r["step"] for r in recs), default=0)
    eta = growth_bound_series(train, last + 1)
    prefix = np.concatenate([[0.0], np.cumsum(eta)])  # prefix[t] = sum_{s < t} eta_s
    rows = []
    by_name: dict[str, list[dict]] = {}
    for r in recs:
        by_name.setdefault(r["name"], []).append(r)
    for rs in by_name.values():
        rs.sort(key=lambda r: r["step"])
    for name, rs in by_name.items():
        parent = name.split(":", 1)[0]
        base = by_name[parent][0] if (":" in name and parent in by_name) else rs[0]
        t0, s0 = base["step"], base["sigma_max"]
        for r in rs:
            applicable = r["manifold"] in GROWTH_BOUND_APPLIES
            eta_sum = float(prefix[r["step"] + 1] - prefix[t0]) if r["step"] >= t0 else 0.0
            bnd = s0 + a_norm * eta_sum
            rows.append({**r, "base_step": t0, "base_sigma": s0, "eta_sum": eta_sum, "bound": bnd,
                         "slack": bnd - r["sigma_max"], "ratio": r["sigma_max"] / bnd if bnd > 0 else None,
                         "applicable": applicable,
                         "ok": (r["sigma_max"] <= bnd * (1 + rtol) + 1e-12) if applicable else None})
    checked = [r for r in rows if r["applicable"]]
    fails = [r for r in checked if not r["ok"]]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['manifold']}/{r['module']}", []).append(r)
    summary = {
        "file": str(path), "rows": len(rows), "matrices": len(by_name), "checked": len(checked),
        "violations": len(fails), "holds": not fails, "a_norm": a_norm, "rtol": rtol,
        "first_violations": [{k: r[k] for k in ("step", "name", "manifold", "sigma_max", "bound")}
                             for r in sorted(fails, key=lambda r: r["step"])[:10]],
        "by_group": {
            g: {"max_sigma_max": max(r["sigma_max"] for r in rs),
                "max_ratio_to_bound": max((r["ratio"] for r in rs if r["ratio"] is not None), default=None),
                "applicable": rs[0]["applicable"]}
            for g, rs in groups.items()
        },
        "skipped_manifolds": sorted({r["manifold"] for r in rows if not r["applicable"]}),
    }
    if threshold is not None:
        over = [r for r in rows if r["sigma_max"] > threshold]
        summary["threshold"] = threshold
        summary["first_over_threshold"] = (
            {k: over[0][k] for k in ("step", "name", "sigma_max")} if over else None)
    return rows, summary


SPECTRAL_CHECK_COLUMNS = ["step", "name", "module", "manifold", "sigma_max", "base_step", "base_sigma", "eta_sum",
                          "bound", "slack", "ratio", "applicable", "ok"]


# -- 4. tangent dimensions ---------------------------------------------------------------------

def audit_tangent_dims(sec: dict) -> tuple[list[dict], dict]:
    shapes, modules, L = sec["shapes"], sec["modules"], sec["layers"]
    if len(modules) != len(shapes):
        raise ValueError(f"studies.audits.tangent.modules has {len(modules)} entries for {len(shapes)} shapes")
    rows = []
    for (m, n), mod in zip(shapes, modules):
        for name in ("stiefel", "dgram", "oblique"):
            td = get_manifold(name).tangent_dim(m, n)
            rows.append({"shape": f"{m}x{n}", "m": m, "n": n, "module": mod, "manifold": name, "tangent_dim": td,
                         "ambient": m * n, "fraction": td / (m * n),
                         "minus_stiefel": td - get_manifold("stiefel").tangent_dim(m, n)})
    totals = {}
    for assign, (att, mlp) in ((a, p) for a, p in NAMED_ASSIGNMENTS.items() if a not in UNCONSTRAINED):
        tot = 0
        for (m, n), mod in zip(shapes, modules):
            tot += get_manifold(att if mod == "attn" else mlp).tangent_dim(m, n)
        totals[assign] = tot * L
    summary = {"layers": L, "totals_per_assignment": totals,
               "dgram_minus_stiefel_per_matrix": {f"{m}x{n}": min(m, n) for m, n in shapes},
               "ranking": sorted(totals, key=lambda k: -totals[k])}
    return rows, summary


# -- further stated numbers: GELU', Propositions 1-2, the AdamW share --------------------------------

def audit_gelu(lo: float = -10.0, hi: float = 10.0, step: float = 1e-4) -> dict:
    """max |GELU'(x)| on a dense float64 grid, for the erf form and the tanh form
    (autograd derivatives), with its argument; the paper states <= 1.08."""
    x = torch.arange(lo, hi + step, step, dtype=torch.float64, requires_grad=True)
    out = {}
    for form in ("none", "tanh"):
        (g,) = torch.autograd.grad(torch.nn.functional.gelu(x, approximate=form).sum(), x)
        g = g.detach()
        k = int(g.abs().argmax())
        out["erf" if form == "none" else "tanh"] = {"max_abs_derivative": float(g.abs()[k]),
                                                    "at_x": float(x.detach()[k])}
    worst = max(v["max_abs_derivative"] for v in out.values())
    return {**out, "grid": {"lo": lo, "hi": hi, "step": step}, "max": worst, "paper_bound": paper.GELU_BOUND,
            "holds": worst <= paper.GELU_BOUND}


def audit_propositions(sec: dict) -> dict:
    """Proposition 1's lower bound ``sqrt(2(L-1)) e^(-R^2/sqrt(d_k))`` against the
    softmax Jacobian of logit vectors its premise allows (range ``Delta z <= 2 R^2 /
    sqrt(d_k)``): one logit at ``Delta z``, the others at 0, which has the smallest
    ||J||_F for that range; and the universal maximum ``||J||_F <= 1/2``.
    Proposition 2: scaling one DGram column scales the logits; ||J||_F at scale 1e3."""
    d_k = sec["logit_bound"]["d_k"]
    rows, violated = [], 0
    for L in (2, 16, 256, 1024):
        for R in (0.1, 1.0, 2.0, 4.0, math.sqrt(sec["logit_bound"]["d"])):
            bound = math.sqrt(2 * (L - 1)) * math.exp(-R * R / math.sqrt(d_k))
            dz = 2 * R * R / math.sqrt(d_k)
            z = torch.zeros(L, dtype=torch.float64)
            z[0] = dz
            jac = float(softmax_quantities(z[None])["fro2"].clamp_min(0).sqrt()[0])
            bad = jac < bound
            violated += int(bad)
            rows.append({"L": L, "R": R, "d_k": d_k, "bound": bound, "jac_fro_at_max_range": jac,
                         "violated": bad})
    small = next(r for r in rows if r["L"] == 2 and r["R"] == 0.1)
    gen = torch.Generator().manual_seed(pair_seed("prop2", 0))
    z = torch.randn(64, 256, generator=gen, dtype=torch.float64)
    jac_scaled = softmax_quantities(1e3 * z)["fro2"].clamp_min(0).sqrt()
    dgram_min = float(jac_scaled.min())  # "there exists": the best row
    prop1_holds = violated == 0
    return {
        "prop1": {"cases": rows, "violated": violated, "cases_checked": len(rows), "holds": prop1_holds,
                  "example_small_R": small, "universal_max_jac_fro": 0.5,
                  "note": "inverting the corollary's upper bound gives no lower bound; the stated one exceeds the "
                          "universal maximum 1/2 for small R and exceeds the smallest ||J||_F the premise allows"},
        "prop2": {"logit_scale": 1e3, "min_jac_fro_over_rows": dgram_min, "reaches_1e-6": dgram_min < 1e-6,
                  "holds": dgram_min < 1e-6 and prop1_holds,
                  "note": "DGram reaching ||J||_F -> 0 holds (scale a column); the contrast with Stiefel rests on "
                          "Proposition 1's lower bound"},
    }


def audit_adamw_share() -> dict:
    """Share of GPT-2 small's parameters (tied head, as released) that AdamW trains
    under the paper's split (embeddings, LayerNorm, head: AdamW; hidden matrices: Muon)."""
    from mwm.optim.assignments import resolve_assignment
    from mwm.train.model import GPT, GPTConfig
    from mwm.config.names import ADAMW

    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    named = [(n, p) for n, p in model.named_parameters()]
    plan = resolve_assignment(named, "stiefel")
    total = sum(p.numel() for _, p in named)
    adamw = sum(p.numel() for n, p in named if plan[n] == ADAMW)
    head = model.lm_head.weight.numel()
    return {"total": total, "adamw": adamw, "share": adamw / total,
            "untied_head_share": (adamw + head) / (total + head),
            "paper": "roughly 40%"}


def audit_msign_calls(n: int = 64, iterations: tuple[int, ...] = (20, 100)) -> dict:
    """msign calls of one optimizer step on an ``n x n`` matrix, counted while the code runs: plain Muon,
    and Manifold Muon on Stiefel and DGram with the schema's solver at each of ``iterations`` dual-ascent
    steps. Section 3's overhead estimate ("about 100 times ... down to about 20 times, based on msign
    call counts") is the Stiefel count over plain Muon's."""
    import sys

    from mwm.optim import msign as msign_module
    from mwm.optim.muon import ManifoldMuon
    from mwm.optim.solvers import SolverSettings

    real = msign_module.msign
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    holders = [m for name, m in sys.modules.items() if name.startswith("mwm") and getattr(m, "msign", None) is real]

    def one_step(manifold: str, steps: int) -> int:
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(n, n, generator=g) / n ** 0.5)
        opt = ManifoldMuon([{"params": [p], "manifold": manifold}], lr=0.02,
                           solver=SolverSettings.defaults(steps=steps, method="direct"))
        p.grad = torch.randn(n, n, generator=g)
        calls[0] = 0
        with _patched(holders, counted):
            opt.step()
        return calls[0]

    muon = one_step("none", iterations[0])
    out = {"n": n, "muon": muon, "by_iterations": {}}
    for T in iterations:
        st, dg = one_step("stiefel", T), one_step("dgram", T)
        out["by_iterations"][str(T)] = {"stiefel": st, "dgram": dg, "stiefel_over_muon": st / muon,
                                        "dgram_over_muon": dg / muon}
    return out


class _patched:
    """Replace the ``msign`` each of ``modules`` imported by ``fn`` inside the block."""

    def __init__(self, modules, fn):
        self.modules, self.fn, self.saved = modules, fn, []

    def __enter__(self):
        self.saved = [(m, m.msign) for m in self.modules]
        for m in self.modules:
            m.msign = self.fn

    def __exit__(self, *exc):
        for m, f in self.saved:
            m.msign = f
        return False


# -- the study ----------------------------------------------------------------------------------

def run_audits(cfg: dict, out: str | Path, config_path: str | None = None, spectral: str | None = None,
               log=print) -> dict:
    studies = cfg["studies"]
    sec = studies["audits"]
    device = resolve_device(studies["device"])  # the audits run on CPU in float64; recorded for provenance
    out = Path(out)
    base = studies["seed"]
    spectral_path = spectral if spectral is not None else sec["growth"]["spectral_csv"]
    if spectral_path and not Path(spectral_path).is_file():
        raise FileNotFoundError(f"spectral log {spectral_path} does not exist")
    t0 = time.perf_counter()
    derived = {}

    t1 = time.perf_counter()
    sm_rows, derived["softmax"] = audit_softmax(sec["softmax"], base)
    log(f"audits: softmax Jacobian {time.perf_counter() - t1:.1f} s")
    write_csv(out / FILES.file("softmax"),
              ["family", "n", "check", "vectors", "worst_slack", "max_ratio", "violations", "max_abs_error",
               "max_rel_error", "explicit_matrix_error", "at_delta_z", "at_margin"], sm_rows)

    lg_rows, derived["logit_bound"] = audit_logit_bound(sec["logit_bound"], base)
    write_csv(out / FILES.file("logit_bound"), ["case", "max_abs_logit", "max_row_range", "bound", "ratio"], lg_rows)

    t1 = time.perf_counter()
    gr_rows, derived["growth"] = audit_growth(sec["growth"], sec["logit_bound"], base)
    log(f"audits: growth bound {time.perf_counter() - t1:.1f} s")
    write_csv(out / FILES.file("growth_bound"), ["step", "eta", "eta_sum", "bound"], gr_rows)

    td_rows, derived["tangent"] = audit_tangent_dims(sec["tangent"])
    write_csv(out / FILES.file("tangent_dims"),
              ["shape", "m", "n", "module", "manifold", "tangent_dim", "ambient", "fraction", "minus_stiefel"],
              td_rows)

    derived["gelu"] = audit_gelu()
    derived["propositions"] = audit_propositions(sec)
    derived["adamw_share"] = audit_adamw_share()
    derived["msign_calls"] = audit_msign_calls()

    if cfg.get("train"):
        own = cfg["train"]
        eta_own = growth_bound_series(own)
        derived["growth"]["config_train"] = {
            "max_iters": own["max_iters"], "eta_sum": float(eta_own.sum()),
            "bound_at_end": sec["growth"]["sigma0"] + sec["growth"]["a_norm"] * float(eta_own.sum())}
    if spectral_path:
        train = cfg.get("train") or sec["growth"]["schedule"]
        train_src = "train section" if cfg.get("train") else "studies.audits.growth.schedule"
        sp_rows, sp_sum = check_spectral_log(spectral_path, train, sec["growth"]["a_norm"], sec["growth"]["rtol"],
                                             sec["growth"]["threshold"])
        sp_sum["schedule_from"] = train_src
        derived["spectral_check"] = sp_sum
        write_csv(out / FILES.file("spectral_check"), SPECTRAL_CHECK_COLUMNS, sp_rows)
    else:
        derived["spectral_check"] = {"holds": None, "reason": "no spectral log given (--spectral or "
                                                              "studies.audits.growth.spectral_csv)"}
        # a declared output (mwm.workflow.stages): its header alone, the reason is in audits.json
        write_csv(out / FILES.file("spectral_check"), SPECTRAL_CHECK_COLUMNS, [])
    derived["meta"] = run_meta(sec, device, time.perf_counter() - t0, config_path)
    derived["meta"]["dtype"] = "float64 (softmax, logits, bounds); float32 (Polar Express norm)"
    write_json(out / FILES.file("derived"), derived)
    return derived


def main(argv=None) -> int:
    return main_for(
        "python -m mwm.studies.audits",
        "Theory audits: softmax-Jacobian identity / bound / corollary, the GPT-2 logit bound, the singular-value "
        "growth bound for the Muon schedule (and a check of logged spectra with --spectral), tangent dimensions.",
        run_audits,
        extra=lambda p: p.add_argument("--spectral", default=None,
                                       help="spectral.csv of a training run (columns step, name, module, manifold, "
                                            "sigma_max) to check against the growth bound"),
        extra_kwargs=lambda a: {"spectral": a.spectral},
        argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
