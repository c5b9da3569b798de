"""The ledger: every number the paper states, its rebuilt value and a verdict.

Verdicts: ``reproduced``, ``not reproduced``, ``not comparable at this scale``,
``contradicted by an audit``. Each row says which config (and scale) and which
seeds it came from, and one line of why. Generated, never hand-edited.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..io import atomic_write_text
from .tables import fmt

__all__ = ["build_ledger", "write_ledger", "is_paper_scale", "VERDICTS"]

VERDICTS = ("reproduced", "not reproduced", "not comparable at this scale", "contradicted by an audit")
NC = "not comparable at this scale"


def is_paper_scale(cfg: dict) -> bool:
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    return (m.get("size") == "gpt2" and d.get("corpus") == "openwebtext" and t["max_iters"] >= 50000
            and len(cfg["grid"]["seeds"]) >= 1)


def _scale(cfg: dict) -> str:
    m, t = cfg["model"], cfg["train"]
    if is_paper_scale(cfg):
        return f"paper ({cfg['name']})"
    shape = m["size"] or f"L{m['n_layer']} d{m['n_embd']}"
    return f"reduced ({cfg['name']}: {shape}, {cfg['data']['corpus']}, {t['max_iters']} steps)"


def _within(x, lo, hi) -> bool:
    return x is not None and lo <= x <= hi


def _close(x, target, rel) -> bool:
    return x is not None and abs(x - target) <= rel * abs(target)


class _Ledger:
    def __init__(self, cfg):
        self.rows = []
        self.cfg = cfg
        self.scale = _scale(cfg)

    def add(self, key, claim, paper, rebuilt, verdict, why, source, seeds="--"):
        assert verdict in VERDICTS, verdict
        self.rows.append({"id": key, "claim": claim, "paper": paper, "rebuilt": rebuilt, "verdict": verdict,
                          "why": why, "source": source, "scale": self.scale, "seeds": seeds})


def _alpha_entries(L: _Ledger, st: dict, cfg: dict) -> None:
    ad = st["alpha_derived.json"]["manifolds"].get("stiefel")
    sa = cfg["studies"]["alpha"]
    seeds = str(sa["seeds"])
    src = f"studies.alpha ({len(sa['sizes'])} sizes {min(sa['sizes'])}..{max(sa['sizes'])}, {sa['iterations']} it)"
    if ad is None:
        L.add("alpha.fit", "alpha_opt(n) ~ 0.003 n^0.67 (Stiefel)", "0.003 n^0.67", "--", NC,
              "the config's alpha study does not run Stiefel", src, seeds)
        return
    full = min(sa["sizes"]) <= 32 and max(sa["sizes"]) >= 768
    fit = ad.get("fit") or {}
    exp, pre, r2 = fit.get("exponent"), fit.get("prefactor"), fit.get("r2")
    if exp is None:
        L.add("alpha.fit", "power-law fit of alpha_opt over n >= 32", "0.003 n^0.67, r^2 0.74", "--", NC,
              "too few sizes for a fit", src, seeds)
    else:
        ok = _close(exp, 0.67, 0.25) and pre is not None and 0.5 * 0.003 <= pre <= 2 * 0.003
        verdict = "reproduced" if ok else ("not reproduced" if full else NC)
        L.add("alpha.fit", "alpha_opt(n) ~ 0.003 n^0.67 over n >= 32", "0.003 n^0.67",
              f"{pre:.3g} n^{exp:.2f}", verdict,
              "exponent within 25% and prefactor within 2x" if ok else
              ("fit differs; on an exactly orthogonal square W, Lambda_0 already solves the problem, so "
               "the 'violation' left is mostly initialization error of msign" if full else
               "the size range is narrower than the paper's 16..1024"), src, seeds)
        L.add("alpha.r2", "r^2 of that fit", "0.74", fmt(r2), "reproduced" if _close(r2, 0.74, 0.2) else
              ("not reproduced" if full else NC), f"{fit.get('points')} sizes in the fit", src, seeds)
    out = ad.get("outlier") or {}
    if out.get("n") == 16:
        L.add("alpha.outlier", "n = 16 sits above the trend (observed alpha_opt)", "0.17",
              fmt(out.get("observed_alpha_opt")),
              "reproduced" if _within(out.get("observed_alpha_opt"), 0.085, 0.34) else "not reproduced",
              f"prediction of our fit at 16: {fmt(out.get('predicted_alpha_opt'))}", src, seeds)
    else:
        L.add("alpha.outlier", "n = 16 sits above the trend", "0.17", "--", NC, "n = 16 not in the config", src, seeds)
    dvb = ad.get("default_vs_best") or {}
    for n, (p_def, p_best) in {"64": (3.3e-3, 2.5e-3), "768": (1.9e-3, 6.6e-4)}.items():
        r = dvb.get(n)
        if not r or r.get("violation_at_default") is None:
            L.add(f"alpha.n{n}", f"n = {n}: violation at alpha 0.01 vs grid best", f"{p_def:.1e} vs {p_best:.1e}",
                  "--", NC, f"n = {n} not in the config's sizes", src, seeds)
            continue
        got = f"{r['violation_at_default']:.2e} vs {r['best_violation']:.2e}"
        ok = _within(r["violation_at_default"], p_def / 3, p_def * 3) and _within(r["best_violation"], p_best / 3,
                                                                                 p_best * 3)
        L.add(f"alpha.n{n}", f"n = {n}: violation at alpha 0.01 vs grid best", f"{p_def:.1e} vs {p_best:.1e}", got,
              "reproduced" if ok else "not reproduced",
              "both within 3x of the paper's" if ok else "orders of magnitude apart: see the exact-init control",
              src, seeds)
    ur = ad.get("universal_ratio") or {}
    if ur.get("within_2x") is not None:
        L.add("alpha.universal", "alpha = 0.1 within 2x of the per-size optimum over n in [32, 1024]", "within 2x",
              f"max ratio {fmt(ur.get('max_violation_ratio'))}",
              "reproduced" if ur["within_2x"] else ("not reproduced" if full else NC),
              "ratio of alpha = 0.1's final violation to the best over the grid", src, seeds)


def _absorption_entries(L: _Ledger, st: dict, cfg: dict) -> None:
    ab = st["absorption_derived.json"]["manifolds"].get("stiefel")
    sa = cfg["studies"]["absorption"]
    seeds = str(sa["seeds"])
    src = f"studies.absorption (sizes {min(sa['sizes'])}..{max(sa['sizes'])}, T={sa['report_T']})"
    if ab is None:
        return
    ps = [v for k, v in (ab["per_size"].items() if isinstance(ab["per_size"], dict) else
                         [(r["n"], r) for r in ab["per_size"]]) if int(k) >= 32]
    if not ps:
        return
    eA = [p["e_A"] for p in ps]
    eW = [p["e_W"] for p in ps]
    comp = [p["compression"] for p in ps]
    ret = [p["retraction_factor"] for p in ps]
    L.add("absorb.eA", "e_A(20) across sizes (Stiefel)", "8-16%", f"{100 * min(eA):.1f}-{100 * max(eA):.1f}%",
          "reproduced" if min(eA) >= 0.04 and max(eA) <= 0.32 else "not reproduced", "seed means, n >= 32", src, seeds)
    L.add("absorb.eW", "e_W(20) across sizes (Stiefel)", "under 1% (about 0.7%)",
          f"{100 * min(eW):.2f}-{100 * max(eW):.2f}%", "reproduced" if max(eW) < 0.02 else "not reproduced",
          "seed means, n >= 32", src, seeds)
    L.add("absorb.compression", "compression e_A/e_W at T = 20", "12-16x", f"{min(comp):.1f}-{max(comp):.1f}x",
          "contradicted by an audit", "the number reproduces, but about 10x of it is 1/eta (a direction compared "
          f"with a weight); the retraction's own factor is only {min(ret):.2f}-{max(ret):.2f}x", src, seeds)
    fl = [(p.get("flatness") or {}).get("e_W_ratio") for p in ps]
    fl = [f for f in fl if f is not None]
    if fl:
        L.add("absorb.flat", "e_W(5) / e_W(100) (retracted weight nearly flat in T)", "within ~1.3x",
              f"{min(fl):.2f}-{max(fl):.2f}", "reproduced" if max(fl) <= 1.6 and min(fl) >= 1 / 1.6 else "not reproduced",
              f"ratio between T = {(ps[0].get('flatness') or {}).get('T')}", src, seeds)


def _audit_entries(L: _Ledger, st: dict) -> None:
    au = st["audits.json"]
    sm, g, lb = au["softmax"], au["growth"], au["logit_bound"]
    L.add("theory.jacobian_bound", "||J||_F^2 <= ||s||^2 (1 - ||s||^2) <= 1/4", "proved",
          f"worst slack {fmt(sm['bound'].get('worst_slack'))}",
          "reproduced" if sm["bound"].get("holds") and sm["quarter"].get("holds") else "contradicted by an audit",
          "random and adversarial logit vectors", "studies.audits")
    L.add("theory.corollary", "||J||_F <= sqrt(2(n-1)) e^(-Delta z/2)", "proved",
          f"worst slack {fmt(sm['corollary'].get('worst_slack'))}",
          "reproduced" if sm["corollary"].get("holds") else "contradicted by an audit",
          "two tied top logits keep ||J||_F near 1/2 for any Delta z; true with the top margin z(1) - z(2)"
          if not sm["corollary"].get("holds") else "no violation found", "studies.audits")
    L.add("theory.logit_bound", "|Z_ij| <= ||X||^2/sqrt(d_k) for GPT-2 small", "96",
          f"{lb['bound']:g} (d={lb['d']}, d_k={lb['d_k']})",
          "reproduced" if lb.get("matches_paper") else NC,
          "attained by a constructed Stiefel c_attn" if lb.get("attained") else "bound computed", "studies.audits")
    L.add("spectral.dgram_attn_end", "DGram attention sigma_max at 50k steps", "> 1e5",
          f"bound {g['bound_at_end']:.4g} (sigma_0 {g['sigma0']:g} + sum eta {g['eta_sum']:.4g})",
          "contradicted by an audit" if not g["sigma_max_can_reach_threshold"] else "reproduced",
          "with ||A||_2 <= 1 and a retraction that keeps the singular values of W - eta A, sigma_max grows by at "
          "most eta a step; only sigma^2 (Gram diagonal) could pass 1e5", "studies.audits (paper schedule)")


def _training_entries(L: _Ledger, results: pd.DataFrame, runs, cfg: dict) -> None:
    paper_scale = is_paper_scale(cfg)
    seeds = ",".join(str(s) for s in cfg["grid"]["seeds"])
    res = results.set_index("variant")
    src = "training runs (Table 4)"
    for v, p in (("hetero", 3.3544), ("stiefel", 3.3679), ("none", 3.3855)):
        if v not in res.index:
            continue
        got = res.loc[v, "final_val_mean"]
        L.add(f"loss.{v}", f"final val loss, {v}", f"{p}", f"{got:.4f}",
              ("reproduced" if abs(got - p) < 0.03 else "not reproduced") if paper_scale else NC,
              "val loss depends on model, data and steps" if not paper_scale else "within 0.03 nats" if
              abs(got - p) < 0.03 else "differs by more than 0.03 nats", src, seeds)
    if {"hetero", "stiefel", "none"} <= set(res.index):
        order = res.loc[["hetero", "stiefel", "none"], "final_val_mean"]
        ok = order["hetero"] < order["stiefel"] < order["none"]
        L.add("loss.order", "Hetero < All Stiefel < Unconstrained (final val loss)", "3.3544 < 3.3679 < 3.3855",
              " < ".join(f"{k} {order[k]:.4f}" for k in order.sort_values().index),
              "reproduced" if ok else ("not reproduced" if paper_scale else NC),
              "ordering of the stable conditions" + ("" if paper_scale else "; the gap is 0.014 nats at paper scale"),
              src, seeds)
    for v, onset in (("dgram", 16000), ("hetero-inv", 20000)):
        if v not in res.index:
            continue
        status, onsets = res.loc[v, "status"], res.loc[v, "onset_steps"]
        unstable = status.startswith("Unstable")
        L.add(f"instability.{v}", f"{v} becomes unstable (onset step)", f"unstable, onset ~{onset}",
              f"{status}" + (f", onset {onsets}" if unstable else ""),
              ("reproduced" if unstable else "not reproduced") if paper_scale else
              ("reproduced" if unstable else NC),
              "divergence rule: val loss above best + threshold for patience evals, or non-finite" +
              ("" if paper_scale else f"; {cfg['train']['max_iters']} steps vs the paper's onset at {onset}"),
              src, seeds)
    for v, p in (("stiefel", 5.8), ("hetero", 8.3), ("dgram", 13.6)):
        if v in res.index and res.loc[v, "cost_vs_none"] is not None:
            L.add(f"cost.{v}", f"per-step cost of {v} relative to Unconstrained", f"{p}x (H100)",
                  f"{res.loc[v, 'cost_vs_none']:.1f}x ({runs[next(iter(runs))].summary['device']})", NC,
                  "wall-clock ratios depend on hardware, model size and the implementation (batched banks, "
                  "Gram-eigh DGram retraction here)", src, seeds)
    # sigma_max observations
    def attn_sigma(v):
        rs = [r for (vv, _), r in runs.items() if vv == v]
        if not rs:
            return None
        vals = []
        for r in rs:
            sp = r.spectral
            sel = sp[(sp.module == "attn") & sp.matrix.isin(("c_attn", "c_proj"))]
            vals.append(sel.groupby("step")["sigma_max"].max().iloc[-1])
        return float(np.mean(vals))

    for v, p, claim in (("stiefel", "1", "Stiefel attention sigma_max stays at 1"),
                        ("none", "~4", "Unconstrained attention sigma_max (end of training)")):
        got = attn_sigma(v)
        if got is None:
            continue
        verdict = "reproduced" if (v == "stiefel" and abs(got - 1) < 1e-2) else (
            NC if not paper_scale else ("reproduced" if 2 <= got <= 8 else "not reproduced"))
        L.add(f"spectral.{v}", claim, p, f"{got:.3g}", verdict, "max over attention matrices, last evaluation",
              "spectral logs", seeds)
    got = attn_sigma("dgram")
    if got is not None:
        first = [r for (vv, _), r in runs.items() if vv == "dgram"][0].spectral
        s0 = first[(first.module == "attn") & first.matrix.isin(("c_attn", "c_proj"))].groupby("step")[
            "sigma_max"].max().iloc[0]
        grew = got > 1.5 * s0
        L.add("spectral.dgram_growth", "DGram attention sigma_max grows from step 0", "grows (30-50 at 16k)",
              f"{s0:.3g} -> {got:.3g}", "reproduced" if grew else (NC if not paper_scale else "not reproduced"),
              "first vs last evaluation, max over attention matrices", "spectral logs", seeds)


def build_ledger(cfg: dict, results: pd.DataFrame, runs, studies: dict) -> pd.DataFrame:
    L = _Ledger(cfg)
    _alpha_entries(L, studies, cfg)
    _absorption_entries(L, studies, cfg)
    _audit_entries(L, studies)
    _training_entries(L, results, runs, cfg)
    return pd.DataFrame(L.rows)


def write_ledger(df: pd.DataFrame, out: Path) -> None:
    atomic_write_text(out / "ledger.csv", df.to_csv(index=False))
    counts = df.verdict.value_counts()
    lines = ["# Ledger: the paper's numbers, rebuilt", "",
             "Generated by `python -m mwm.report` from `results/`; never edited by hand.", "",
             "Verdicts: " + ", ".join(f"{k}: {counts.get(k, 0)}" for k in VERDICTS), "",
             "| id | claim | paper | rebuilt | verdict | why | source | scale | seeds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in df.iterrows():
        cells = [str(r[c]).replace("|", "\\|") for c in
                 ("id", "claim", "paper", "rebuilt", "verdict", "why", "source", "scale", "seeds")]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(out / "ledger.md", "\n".join(lines) + "\n")
