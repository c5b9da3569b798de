"""The ledger: every number the paper states, its rebuilt value and a verdict.

The paper's numbers, sections and verdict rules live in :mod:`mwm.paper` (fixed
before the data); this module only computes the rebuilt values and hands them to
:func:`mwm.paper.judge`. Every claim of :data:`mwm.paper.CLAIMS` gets a row: one
this config cannot rebuild says so and names the config that would. Studies rows
are judged on the faithful protocol (the first of ``studies.precisions``, bfloat16
msign as released); the ``control`` column shows the same number under the control
precision. Generated, never hand-edited.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from mwm import paper
from mwm.io import atomic_write_text
from mwm.config.names import ATTN_MATRICES, MLP_MATRICES
from mwm.report.scale import capabilities, is_paper_scale
from mwm.report.tables import fmt

__all__ = ["build_ledger", "build_sweep_ledger", "build_mechanism_ledger", "build_mechanism2_ledger",
           "build_values_ledger", "write_ledger", "is_paper_scale", "capabilities", "VERDICTS"]

VERDICTS = paper.VERDICTS
NC = paper.NC
COLUMNS = ("id", "section", "claim", "paper", "rebuilt", "control", "verdict", "rule", "why", "source", "scale",
           "seeds")


def _scale(cfg: dict) -> str:
    m, t = cfg["model"], cfg["train"]
    if is_paper_scale(cfg):
        return f"paper ({cfg['name']})"
    shape = m["size"] or f"L{m['n_layer']} d{m['n_embd']}"
    return f"reduced ({cfg['name']}: {shape}, {cfg['data']['corpus']}, {t['max_iters']} steps)"


def _window_x(vals, cid: str):
    """The one value that decides "every value in the window": the first one outside
    it, else the median (so the rebuilt number shown is the deciding one)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    r = paper.claim(cid).rule
    for v in sorted(vals, key=lambda v: -max(r.lo - v, v - r.hi)):
        if not r.lo <= v <= r.hi:
            return v
    return float(np.median(vals))


def _rng(vals, f=lambda v: f"{v:.3g}") -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "--"
    return f(min(vals)) if min(vals) == max(vals) else f"{f(min(vals))}-{f(max(vals))}"


class _Ledger:
    def __init__(self, cfg: dict):
        self.rows: list[dict] = []
        self.cfg = cfg
        self.caps = capabilities(cfg)
        self.scale = _scale(cfg)

    def add(self, cid: str, rebuilt: str, x, *, seeds: int | None = None, source: str = "", control: str = "",
            note: str = "", reason: str = "") -> None:
        c = paper.claim(cid)
        verdict, why = paper.judge(c, x, caps=self.caps, seeds=seeds, reason=reason)
        assert verdict in VERDICTS, verdict
        self.rows.append({"id": cid, "section": c.section, "claim": c.claim, "paper": c.paper, "rebuilt": rebuilt,
                          "control": control, "verdict": verdict, "rule": c.rule.describe(),
                          "why": "; ".join(p for p in (why, note) if p), "source": source, "scale": self.scale,
                          "seeds": "--" if seeds is None else str(seeds)})

    def fill_missing(self) -> None:
        """A row for every claim this config produced nothing for."""
        done = {r["id"] for r in self.rows}
        for c in paper.CLAIMS:
            if c.id not in done:
                self.add(c.id, "--", None,
                         reason=f"this config does not produce it (rebuilt by {c.rebuild or 'the studies'})")
        order = {c.id: i for i, c in enumerate(paper.CLAIMS)}
        self.rows.sort(key=lambda r: order[r["id"]])


# -------------------------------------------------------------------------------------- alpha study
def _alpha_entries(L: _Ledger, st: dict, cfg: dict) -> None:
    d = st["alpha_derived.json"]
    sa = cfg["studies"]["alpha"]
    seeds = int(sa["seeds"])
    faithful = d.get("faithful", "float32")
    ctrl_p = next((p for p in d.get("precisions", [])[1:]), None)
    protos = d.get("protocols") or {faithful: {"manifolds": d["manifolds"]}}
    ad = protos[faithful]["manifolds"].get("stiefel")
    cd = protos[ctrl_p]["manifolds"].get("stiefel") if ctrl_p else None
    src = (f"studies.alpha ({faithful} msign; sizes {min(sa['sizes'])}..{max(sa['sizes'])}, "
           f"{sa['iterations']} it)")
    if ad is None:
        return

    def both(get, f=fmt):
        a = get(ad)
        c = get(cd) if cd is not None else None
        return a, f(a), (f"{ctrl_p}: {f(c)}" if cd is not None else "")

    def fit(key):
        return lambda m: (m.get("fit") or {}).get(key)

    for key, cid in (("exponent", "alpha.fit.exponent"), ("prefactor", "alpha.fit.prefactor"), ("r2", "alpha.fit.r2")):
        x, txt, ctl = both(fit(key))
        L.add(cid, txt, x, seeds=seeds, source=src, control=ctl,
              reason=(ad.get("fit") or {}).get("reason", ""),
              note=f"fit over {(ad.get('fit') or {}).get('points')} sizes >= {sa['fit_min_n']}")
    out = ad.get("outlier") or {}
    if out.get("n") == 16:
        x, txt, ctl = both(lambda m: (m.get("outlier") or {}).get("observed_alpha_opt"))
        L.add("alpha.outlier", txt, x, seeds=seeds, source=src, control=ctl,
              note=f"our fit predicts {fmt(out.get('predicted_alpha_opt'))} at 16")
    for n in ("64", "768"):
        for kind, key in (("default", "violation_at_default"), ("best", "best_violation")):
            x, txt, ctl = both(lambda m: ((m.get("default_vs_best") or {}).get(n) or {}).get(key))
            L.add(f"alpha.n{n}.{kind}", txt, x, seeds=seeds, source=src, control=ctl)
    ur = ad.get("universal_ratio") or {}
    x, txt, ctl = both(lambda m: (m.get("universal_ratio") or {}).get("max_violation_ratio"))
    L.add("alpha.universal", f"max ratio {txt}", x, seeds=seeds, source=src, control=ctl,
          note=f"sizes {ur.get('sizes')}")
    per = {r["n"]: r for r in ad["per_size"]}
    if 768 in per:
        x = per[768]["alpha_opt"] / sa["default_alpha"]
        L.add("alpha.scale", f"{x:.3g}x", x, seeds=seeds, source=src)
    own = paper.paper_fit_alpha(768) / sa["default_alpha"]
    lo, hi = paper.claim("alpha.scale_vs_fit").value
    L.add("alpha.scale_vs_fit", f"0.003 x 768^0.67 = {paper.paper_fit_alpha(768):.3f} = {own:.1f}x of 0.01",
          lo <= own <= hi, source="the paper's own fit")
    conv = (ad.get("convergence") or {}).get("64")
    cconv = ((cd or {}).get("convergence") or {}).get("64") if cd else None
    if conv:
        for cid, key, f in (("alpha.conv64.peak", "peak", fmt), ("alpha.conv64.peak_iter", "peak_iteration", str),
                            ("alpha.conv64.final", "final", fmt)):
            L.add(cid, f(conv[key]), conv[key], seeds=seeds, source=src,
                  control=f"{ctrl_p}: {f(cconv[key])}" if cconv else "")
    big = [v for k, v in (ad.get("convergence") or {}).items() if int(k) >= 512]
    if big:
        plateau = float(np.median([v["median_first_80pct"] for v in big]))
        drop = [v["drop_last_20pct"] for v in big if v["drop_last_20pct"] is not None]
        L.add("alpha.conv512.plateau", fmt(plateau), plateau, seeds=seeds, source=src)
        L.add("alpha.conv512.drop", f"{np.median(drop):.3g}x" if drop else "--",
              float(np.median(drop)) if drop else None, seeds=seeds, source=src)
    floor = (d.get("floor") or {}).get("float32") or []
    cmp = [r for r in floor if r["n"] in sa["compare_sizes"] and r["ratio"] is not None] or \
          [r for r in floor if r["ratio"] is not None]
    if cmp:
        txt = "; ".join(f"n={r['n']}: bf16 {r['faithful_best']:.2g} vs float32 {r['control_best']:.2g} "
                        f"= {r['ratio']:.2g}x" for r in cmp)
        holds = not all(r["ratio"] >= 100 for r in cmp)
        L.add("alpha.bf16_floor", txt, holds, seeds=seeds, source="studies.alpha, both protocols",
              note="in float32 the violation is ~1e4x lower: the paper's alpha study measures the bf16 floor"
              if not holds else "")


# --------------------------------------------------------------------------------- absorption study
def _absorption_entries(L: _Ledger, st: dict, cfg: dict) -> None:
    d = st["absorption_derived.json"]
    sa = cfg["studies"]["absorption"]
    seeds = int(sa["seeds"])
    faithful = d.get("faithful", "float32")
    ctrl_p = next((p for p in d.get("precisions", [])[1:]), None)
    protos = d.get("protocols") or {faithful: {"manifolds": d["manifolds"]}}

    def sizes(proto):
        ab = (protos.get(proto) or {}).get("manifolds", {}).get("stiefel")
        if ab is None:
            return []
        return [v for k, v in ab["per_size"].items() if int(k) >= 32]

    ps, cs = sizes(faithful), sizes(ctrl_p) if ctrl_p else []
    if not ps:
        return
    src = f"studies.absorption ({faithful} msign; sizes >= 32 of {sorted(sa['sizes'])}, T={sa['report_T']})"

    def ctl(key, f):
        return f"{ctrl_p}: {_rng([p.get(key) for p in cs], f)}" if cs else ""

    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    eA = [p["e_A"] for p in ps]
    L.add("absorb.eA", _rng(eA, pct), _window_x(eA, "absorb.eA"), seeds=seeds, source=src, control=ctl("e_A", pct))
    peaks = [p.get("e_A_peak_T") for p in ps if p.get("e_A_peak_T") is not None]
    if peaks:
        L.add("absorb.eA_nonmonotone", f"peak T {_rng(peaks, str)} (median {np.median(peaks):g})",
              float(np.median(peaks)), seeds=seeds, source=src,
              control=f"{ctrl_p}: peak T {_rng([p.get('e_A_peak_T') for p in cs], str)}" if cs else "")
    eW = [p["e_W"] for p in ps]
    pct2 = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    L.add("absorb.eW", _rng(eW, pct2), max(eW), seeds=seeds, source=src, control=ctl("e_W", pct2))
    comp = [p["compression"] for p in ps]
    xf = lambda v: f"{v:.1f}x"  # noqa: E731
    L.add("absorb.compression", _rng(comp, xf), _window_x(comp, "absorb.compression"), seeds=seeds, source=src,
          control=ctl("compression", xf))
    ret = [p.get("retraction_factor") for p in ps]
    d2w = [p.get("direction_to_weight_factor") for p in ps]
    L.add("absorb.mechanism", f"1/eta part {_rng(d2w, xf)}, retraction's own factor {_rng(ret, lambda v: f'{v:.2f}x')}",
          any(r is not None and r >= 2 for r in ret), seeds=seeds, source=src,
          control=f"{ctrl_p}: retraction's own {_rng([p.get('retraction_factor') for p in cs], lambda v: f'{v:.2f}x')}"
          if cs else "")
    dg = ((protos.get(faithful) or {}).get("manifolds", {}).get("dgram-paper") or {}).get("per_size") or {}
    st = ((protos.get(faithful) or {}).get("manifolds", {}).get("stiefel") or {}).get("per_size") or {}
    both = sorted(int(k) for k in set(dg) & set(st) if int(k) >= 32
                  and dg[k].get("compression") is not None and st[k].get("compression") is not None)
    if both:
        L.add("absorb.dgram_weaker", "; ".join(f"n={n}: DGram {dg[str(n)]['compression']:.1f}x vs Stiefel "
                                              f"{st[str(n)]['compression']:.1f}x" for n in both),
              all(dg[str(n)]["compression"] < st[str(n)]["compression"] for n in both), seeds=seeds, source=src)
    fl = [(p.get("flatness") or {}).get("e_W_ratio") for p in ps]
    if any(f is not None for f in fl):
        L.add("absorb.flat", _rng(fl, lambda v: f"{v:.2f}"), _window_x(fl, "absorb.flat"), seeds=seeds, source=src,
              control=(f"{ctrl_p}: "
                       f"{_rng([(p.get('flatness') or {}).get('e_W_ratio') for p in cs], lambda v: f'{v:.2f}')}")
              if cs else "", note=f"T = {(ps[0].get('flatness') or {}).get('T')}")


# -------------------------------------------------------------------------------------------- audits
def _audit_entries(L: _Ledger, st: dict) -> None:
    au = st["audits.json"]
    sm, g, lb = au["softmax"], au["growth"], au["logit_bound"]
    src = "studies.audits"
    L.add("theory.jacobian_bound", f"worst slack {fmt(sm['bound'].get('worst_slack'))}",
          bool(sm["bound"].get("holds") and sm["quarter"].get("holds")), source=src)
    L.add("theory.corollary", f"worst slack {fmt(sm['corollary'].get('worst_slack'))}",
          bool(sm["corollary"].get("holds")), source=src,
          note="" if sm["corollary"].get("holds") else
          "two tied top logits keep ||J||_F near 1/2 for any Delta z; true with the top margin z(1) - z(2)")
    L.add("theory.logit_bound", f"{lb['bound']:g} (d={lb['d']}, d_k={lb['d_k']})",
          bool(lb.get("matches_paper")) if lb.get("matches_paper") is not None else None, source=src,
          reason="the config's logit_bound is not GPT-2 small's (d = 768, d_k = 64)")
    ge = au.get("gelu")
    if ge:
        L.add("theory.gelu", f"{ge['erf']['max_abs_derivative']:.4f} at x = {ge['erf']['at_x']:.3f} (erf), "
              f"{ge['tanh']['max_abs_derivative']:.4f} (tanh)", bool(ge["holds"]), source=src)
    pr = au.get("propositions")
    if pr:
        p1, p2 = pr["prop1"], pr["prop2"]
        ex = p1["example_small_R"]
        L.add("theory.prop1", f"violated in {p1['violated']}/{p1['cases_checked']} cases; L={ex['L']}, R={ex['R']}: "
              f"bound {ex['bound']:.2f} > max ||J||_F {ex['jac_fro_at_max_range']:.2f}", bool(p1["holds"]),
              source=src, note=p1["note"])
        L.add("theory.prop2", f"DGram: ||J||_F = {p2['min_jac_fro_over_rows']:.2g} at logit scale "
              f"{p2['logit_scale']:g}; Prop 1 holds: {p1['holds']}", bool(p2["holds"]), source=src,
              note=p2["note"])
    td = st.get("tangent_dims.csv")
    if td is not None and len(td):
        dg = td[td.manifold == "dgram"]
        ok = bool(((dg.minus_stiefel == dg[["m", "n"]].min(axis=1))).all())
        L.add("theory.dgram_extra_dims", ", ".join(f"{r.shape}: +{r.minus_stiefel}" for r in dg.itertuples()),
              ok, source=src)
    L.add("spectral.dgram_attn_end", f"bound {g['bound_at_end']:.4g} (sigma_0 {g['sigma0']:g} + sum eta "
          f"{g['eta_sum']:.4g})", bool(g["sigma_max_can_reach_threshold"]), source="studies.audits (paper schedule)",
          note="sigma_max grows by at most eta a step; only sigma^2 (Gram diagonal) could pass 1e5")
    at = g.get("bound_after_steps") or {}
    s16, s20 = (str(s) for s in paper.SIGMA_STEPS)
    if at.get(s16) is not None and at.get(s20) is not None:
        hi16, hi20 = paper.claim("spectral.bound_16k_20k").value
        L.add("spectral.bound_16k_20k", f"bound {at[s16]:.1f} at {int(s16) // 1000}k, {at[s20]:.1f} at "
              f"{int(s20) // 1000}k", hi16 <= at[s16] and hi20 <= at[s20], source="studies.audits (paper schedule)")
    mc = (au.get("msign_calls") or {}).get("by_iterations") or {}
    if "20" in mc:
        x = mc["20"]["stiefel_over_muon"]
        L.add("cost.msign_estimate", f"{x:g}x at 20 iterations" + (f", {mc['100']['stiefel_over_muon']:g}x at 100"
                                                                 if "100" in mc else ""), x, source=src,
              note=f"msign calls of one step on a {au['msign_calls']['n']}x{au['msign_calls']['n']} matrix, "
                   f"Stiefel over plain Muon (DGram: {mc['20']['dgram_over_muon']:g}x, its retraction is an SVD)")
    sh = au.get("adamw_share")
    if sh:
        L.add("params.adamw_share", f"{100 * sh['share']:.1f}% (tied head; {100 * sh['untied_head_share']:.1f}% "
              "if untied)", sh["share"], source=src)


# ---------------------------------------------------------------------------------------- training
def _final_losses(runs, v) -> list[float]:
    return [float(r.eval["val_loss"].iloc[-1]) for (vv, _), r in sorted(runs.items()) if vv == v]


def _sigma(r, module, mats) -> pd.Series:
    sp = r.spectral
    return sp[(sp.module == module) & sp.matrix.isin(mats)].groupby("step")["sigma_max"].max()


def _mean_end(runs, v, module, mats):
    vals = [float(_sigma(r, module, mats).iloc[-1]) for (vv, _), r in runs.items() if vv == v]
    return float(np.mean(vals)) if vals else None


def _att_end(runs, v, col):
    vals = []
    for (vv, _), r in runs.items():
        if vv == v and len(r.attention):
            a = r.attention
            vals.append(float(a[a.step == a.step.max()][col].mean()))
    return float(np.mean(vals)) if vals else None


def _training_entries(L: _Ledger, results: pd.DataFrame, runs, cfg: dict) -> None:
    from mwm.report.training import growth_bound  # matplotlib-heavy module: imported where needed

    res = results.set_index("variant")
    nseeds = len(cfg["grid"]["seeds"])
    src = "training runs (Table 4)"
    for v in paper.LOSSES:
        if v in res.index:
            got = float(res.loc[v, "final_val_mean"])
            L.add(f"loss.{v}", f"{got:.4f}", got, seeds=nseeds, source=src)
    if set(paper.LOSS_ORDER) <= set(res.index):
        losses = {v: _final_losses(runs, v) for v in paper.LOSS_ORDER}
        txt = " < ".join(f"{k} {np.mean(losses[k]):.4f}" for k in sorted(losses, key=lambda k: np.mean(losses[k])))
        spread = ", ".join(f"{k} spread {max(x) - min(x):.4f}" for k, x in losses.items())
        L.add("loss.order", txt, losses, seeds=min(len(x) for x in losses.values()), source=src, note=spread)
    pair = paper.claim("loss.hetero_vs_none").value
    if set(pair) <= set(res.index):
        losses = {v: _final_losses(runs, v) for v in pair}
        L.add("loss.hetero_vs_none", " vs ".join(f"{k} {np.mean(x):.4f} (spread {max(x) - min(x):.4f})"
                                                 for k, x in losses.items()), losses,
              seeds=min(len(x) for x in losses.values()), source=src)
    for v in paper.ONSETS:
        if v in res.index:
            status, onsets = res.loc[v, "status"], res.loc[v, "onset_steps"]
            unstable = str(status).startswith("Unstable")
            steps = [r.summary["onset_step"] for (vv, _), r in runs.items()
                     if vv == v and r.summary["status"] == "unstable" and r.summary.get("onset_step") is not None]
            x = float(np.median(steps)) if unstable and steps else None
            L.add(f"instability.{v}", f"{status}" + (f", onset {onsets}" if unstable else ""), x, seeds=nseeds,
                  source=src, reason=f"stable over {cfg['train']['max_iters']} steps")
    _instability_shapes(L, runs, nseeds)
    _stability_entries(L, runs, nseeds)
    for v in paper.COSTS:
        if v in res.index and res.loc[v, "cost_vs_none"] is not None:
            c = float(res.loc[v, "cost_vs_none"])
            L.add(f"cost.{v}", f"{c:.1f}x ({runs[next(iter(runs))].summary['device']})", c, seeds=nseeds, source=src)
    attn, mlp = ATTN_MATRICES, MLP_MATRICES
    sp_src = "spectral logs (max over matrices, last evaluation, seed mean)"
    for cid, v, module, mats in (("spectral.stiefel", "stiefel", "attn", attn),
                                 ("spectral.none_attn", "none", "attn", attn),
                                 ("spectral.none_mlp", "none", "mlp", mlp),
                                 ("spectral.dgram_mlp", "dgram", "mlp", mlp)):
        got = _mean_end(runs, v, module, mats)
        if got is not None:
            L.add(cid, f"{got:.3g}", got, seeds=nseeds, source=sp_src)
    dg = [r for (vv, _), r in sorted(runs.items()) if vv == "dgram"]
    if dg:
        for cid, step in zip(("spectral.dgram_16k", "spectral.dgram_20k"), paper.SIGMA_STEPS):
            vals = [float(_sigma(r, "attn", attn).get(step, np.nan)) for r in dg]
            vals = [x for x in vals if math.isfinite(x)]
            L.add(cid, fmt(np.mean(vals)) if vals else "--", float(np.mean(vals)) if vals else None, seeds=nseeds,
                  source=sp_src, reason=f"no evaluation at step {step} ({cfg['train']['max_iters']} steps)")
        s = _sigma(dg[0], "attn", attn)
        s = s[s > 0]
        if len(s) >= 3:
            x, y = s.index.values.astype(float), np.log(s.values)
            p = np.polyfit(x, y, 1)
            ss = float(((y - y.mean()) ** 2).sum())
            r2 = 1 - float(((y - np.polyval(p, x)) ** 2).sum()) / ss if ss > 0 else None
            L.add("spectral.exponential", f"r^2 {fmt(r2)} (log sigma vs step), {s.iloc[0]:.3g} -> {s.iloc[-1]:.3g}",
                  r2, seeds=nseeds, source=sp_src)
        l0 = [r.spectral[(r.spectral.layer == 0) & (r.spectral.matrix == "c_attn") & (r.spectral.module == "attn")]
              for r in dg]
        l0 = [float(x.sort_values("step")["sigma_max"].iloc[-1]) for x in l0 if len(x)]
        if l0:
            L.add("spectral.layer0", f"{np.mean(l0):.3g}", float(np.mean(l0)), seeds=nseeds, source=sp_src)
    _spectral_shapes(L, runs, cfg, nseeds)
    _long_entries(L, runs, cfg, growth_bound, nseeds)


def _stability_entries(L: _Ledger, runs, nseeds: int) -> None:
    """Which runs stay stable and finite: the Stiefel-attention assignments over the run, the failing ones'
    logged losses."""
    src = "run summaries and loss logs"
    stable = [r for (v, _), r in sorted(runs.items()) if v in paper.STIEFEL_ATTENTION]
    if stable:
        done = sum(r.summary["status"] == "completed" for r in stable)
        L.add("stability.stiefel_hetero", f"{done} of {len(stable)} runs completed", done == len(stable), seeds=nseeds,
              source=src)
    failing = [r for (v, _), r in sorted(runs.items()) if v in paper.DGRAM_ATTENTION]
    if failing:
        bad = [f"{r.variant} seed {r.seed}" for r in failing
               if not (np.isfinite(r.eval[["train_loss", "val_loss"]].to_numpy(dtype=float)).all()
                       and np.isfinite(r.metrics["train_loss"].to_numpy(dtype=float)).all())]
        L.add("instability.no_nan", "every logged loss finite" if not bad else f"non-finite losses in {', '.join(bad)}",
              not bad, seeds=nseeds, source=src)


def _at_or_before(s: pd.Series, step: float) -> float:
    """The value of a step-indexed series at the last logged step not after ``step`` (its first value if none)."""
    before = s[s.index <= step]
    return float(before.iloc[-1] if len(before) else s.iloc[0])


def _spectral_shapes(L: _Ledger, runs, cfg: dict, nseeds: int) -> None:
    """The shapes of the sigma_max trajectories that Section 6 describes, read from the spectral logs."""
    attn, mlp = ATTN_MATRICES, MLP_MATRICES
    src = "spectral logs (max over matrices)"

    def of(v):
        return [r for (vv, _), r in sorted(runs.items()) if vv == v]

    st = of("stiefel")
    if st:
        vals = [float(x) for r in st for x in _sigma(r, "mlp", mlp).values]
        x = _window_x(vals, "spectral.stiefel_mlp")
        L.add("spectral.stiefel_mlp", f"{min(vals):.4g}-{max(vals):.4g} over every logged step", x, seeds=nseeds,
              source=src)
    none = of("none")
    if none:
        peaks = [(float(s.max()), float(s.idxmax())) for s in (_sigma(r, "mlp", mlp) for r in none)]
        v, k = float(np.mean([p[0] for p in peaks])), float(np.mean([p[1] for p in peaks]))
        L.add("spectral.none_mlp_peak", f"{v:.3g}", v, seeds=nseeds, source=src + ", seed mean")
        L.add("spectral.none_mlp_peak_step", f"{k:.0f}", k, seeds=nseeds, source=src + ", seed mean")
    late = []
    for v in ("hetero", "dgram"):
        ratios = []
        for r in of(v):
            s = _sigma(r, "mlp", mlp)
            ratios.append(float(s.iloc[-1]) / _at_or_before(s, 0.75 * float(s.index.max())))
        if ratios:
            late.append((v, float(np.mean(ratios))))
    if late:
        x = max(g for _, g in late)
        L.add("spectral.dgram_mlp_levels", ", ".join(f"{v} x{g:.3g}" for v, g in late), x, seeds=nseeds,
              source=src + ", seed mean of end / value at 75% of the run")
    dg, hi = of("dgram"), of("hetero-inv")
    unstable = [r for r in dg + hi if r.summary["status"] == "unstable" and r.summary.get("onset_step") is not None]
    if dg and hi:
        a = pd.concat([_sigma(r, "attn", attn) for r in dg], axis=1).mean(axis=1)
        b = pd.concat([_sigma(r, "attn", attn) for r in hi], axis=1).mean(axis=1)
        first = min((r.summary["onset_step"] for r in unstable), default=None)
        common = a.index.intersection(b.index)
        common = common[common < first] if first is not None else common
        if len(common):
            ratio = np.maximum(a[common] / b[common], b[common] / a[common])
            x = float(ratio.max())
            L.add("spectral.dgram_attn_alike", f"{x:.3g}x at step {int(ratio.idxmax())}"
                  + (f" (steps before {first})" if first is not None else ""), x, seeds=nseeds, source=src)
    if unstable:
        growth = [(_at_or_before(_sigma(r, "attn", attn), r.summary["onset_step"])
                   / float(_sigma(r, "attn", attn).iloc[0]),
                   f"{r.variant} seed {r.seed}") for r in unstable]
        x, who = min(growth)
        L.add("spectral.growth_precedes", f"{x:.3g}x ({who}, the smallest of {len(growth)})", x, seeds=nseeds,
              source=src)


def _instability_shapes(L: _Ledger, runs, nseeds: int) -> None:
    """The shapes of the paper's divergences, read from the val-loss curves of unstable runs."""
    def unstable(v):
        return [r for (vv, _), r in sorted(runs.items()) if vv == v and r.summary["status"] == "unstable"]

    dg = unstable("dgram")
    if dg:
        vals = [float(r.eval[r.eval.step >= r.summary["onset_step"]]["val_loss"].median()) for r in dg]
        L.add("instability.dgram_plateau", f"{np.mean(vals):.2f}", float(np.mean(vals)), seeds=nseeds,
              source="eval logs after the onset")
    hi = unstable("hetero-inv")
    if hi:
        r = hi[0]
        ev = r.eval[r.eval.step >= r.summary["onset_step"]].reset_index(drop=True)
        k = int(ev.val_loss.idxmax())
        spike = float(ev.val_loss[k])
        after = ev.iloc[k:]
        j = int(after.val_loss.idxmin())
        drop = float(ev.val_loss[j])
        later = ev.iloc[j:]
        second = float(later.step[later.val_loss.idxmax()]) if len(later) > 1 else None
        after = ev[ev.step > second] if second is not None else ev.iloc[:0]
        osc = float(after.val_loss.median()) if len(after) else None
        L.add("instability.heteroinv_spike", f"{spike:.2f}", spike, seeds=nseeds, source="eval logs (first seed)")
        L.add("instability.heteroinv_drop", f"{drop:.2f}", drop, seeds=nseeds, source="eval logs (first seed)")
        L.add("instability.heteroinv_second", fmt(second), second, seeds=nseeds, source="eval logs (first seed)",
              reason="no second spike after the drop")
        L.add("instability.heteroinv_oscillation", fmt(osc), osc, seeds=nseeds, source="eval logs (first seed)",
              reason="no evaluation after the second spike")


def _long_entries(L: _Ledger, runs, cfg: dict, growth_bound, nseeds: int) -> None:
    """Does the mechanism appear below paper scale? Read from the config's own runs;
    comparable only for the long config (or paper scale)."""
    attn = ATTN_MATRICES
    dg = [r for (vv, _), r in sorted(runs.items()) if vv == "dgram"]
    st = [r for (vv, _), r in sorted(runs.items()) if vv == "stiefel"]
    src = f"training runs ({cfg['name']}, {cfg['train']['max_iters']} steps)"
    if dg:
        worst, ok = None, True
        for r in dg:
            s = _sigma(r, "attn", attn)
            b = growth_bound(cfg["train"], float(s.iloc[0]), s.index.values)
            ratio = s.values / b
            worst = max(worst or 0.0, float(ratio.max()))
            ok = ok and bool((ratio <= 1 + 1e-3).all())
        L.add("long.sigma_vs_bound", f"max sigma / bound {worst:.3g}", ok, seeds=nseeds, source=src)
        g = [float(_sigma(r, "attn", attn).iloc[-1] / _sigma(r, "attn", attn).iloc[0]) for r in dg]
        L.add("long.sigma_growth", f"{np.mean(g):.3g}x", float(np.mean(g)), seeds=nseeds, source=src)
    if dg and st:
        for cid, col in (("long.logit_range", "logit_range_max"), ("long.entropy", "entropy_mean"),
                         ("long.jacobian", "jac_fro_mean")):
            a, b = _att_end(runs, "dgram", col), _att_end(runs, "stiefel", col)
            x = a / b if a is not None and b else None
            L.add(cid, f"DGram {fmt(a)} / Stiefel {fmt(b)} = {fmt(x)}", x, seeds=nseeds, source=src)
    early = [r.summary.get("onset_step") for (vv, _), r in runs.items()
             if vv in ("dgram", "hetero-inv") and r.summary["status"] == "unstable"]
    first = min(early) if early else None
    if any(vv in ("dgram", "hetero-inv") for vv, _ in runs):
        L.add("long.stable_before_onset", "stable" if first is None else f"unstable from step {first}",
              first is None or first >= paper.STABLE_UNTIL, seeds=nseeds, source=src)


def build_ledger(cfg: dict, results: pd.DataFrame, runs, studies: dict) -> pd.DataFrame:
    L = _Ledger(cfg)
    _alpha_entries(L, studies, cfg)
    _absorption_entries(L, studies, cfg)
    _audit_entries(L, studies)
    _training_entries(L, results, runs, cfg)
    L.fill_missing()
    return pd.DataFrame(L.rows, columns=list(COLUMNS))


def build_values_ledger(cfg: dict, values: dict, what: str) -> pd.DataFrame:
    """The ledger of a config that rebuilds a few rows from its runs (a sweep, the mechanism experiment):
    ``values`` as ``{id: (x, rebuilt, reason)}``, judged here; every other claim says this config does not
    produce it."""
    L = _Ledger(cfg)
    seeds = len(cfg["grid"]["seeds"])
    for cid, (x, rebuilt, reason) in values.items():
        L.add(cid, rebuilt, x, seeds=seeds, source=f"{what} ({cfg['name']}, {cfg['train']['max_iters']} steps)",
              reason=reason)
    L.fill_missing()
    return pd.DataFrame(L.rows, columns=list(COLUMNS))


def build_sweep_ledger(cfg: dict, res: pd.DataFrame) -> pd.DataFrame:
    """The ledger of a learning-rate sweep (``workflow.report: sweep``): its ``sweep.*`` rows from the
    sweep's runs (:func:`mwm.report.sweep.sweep_ledger_values`)."""
    from mwm.report.sweep import sweep_ledger_values

    return build_values_ledger(cfg, sweep_ledger_values(cfg, res), "sweep runs")


def build_mechanism_ledger(cfg: dict, res: pd.DataFrame) -> pd.DataFrame:
    """The ledger of the mechanism experiment (``workflow.report: mechanism``): its ``mech.*`` rows
    (:func:`mwm.report.mechanism.mechanism_ledger_values`)."""
    from mwm.report.mechanism import mechanism_ledger_values

    return build_values_ledger(cfg, mechanism_ledger_values(cfg, res), "mechanism runs")


def build_mechanism2_ledger(cfg: dict, res: pd.DataFrame) -> pd.DataFrame:
    """The ledger of a round of the per-baseline mechanism experiment (``workflow.report: mechanism2`` or
    ``mechanism3``): its round's rows (:func:`mwm.report.mechanism2.mechanism2_ledger_values`)."""
    from mwm.report.mechanism2 import mechanism2_ledger_values

    return build_values_ledger(cfg, mechanism2_ledger_values(cfg, res), f"{cfg['workflow']['report']} runs")


def write_ledger(df: pd.DataFrame, out: Path, incomplete: str | None = None) -> None:
    """``ledger.csv`` and ``ledger.md``. ``incomplete`` (a partial report: which runs it holds): every row's
    verdict is :data:`mwm.paper.INCOMPLETE` with that as its why, its rebuilt value shown but not judged."""
    if incomplete:
        df = df.assign(verdict=paper.INCOMPLETE, why=incomplete)
    atomic_write_text(out / "ledger.csv", df.to_csv(index=False))
    counts = df.verdict.value_counts()
    lines = ["# Ledger: the paper's numbers, rebuilt", "",
             "Generated by `python -m mwm.report` from `results/`; never edited by hand. Rules and paper values: "
             "`src/mwm/paper/`. Studies rows are judged on the faithful protocol (bf16 msign as released); "
             "`control` shows the float32 control.", "",
             "Verdicts: " + ", ".join(f"{k}: {counts.get(k, 0)}" for k in VERDICTS), "",
             "| " + " | ".join(COLUMNS) + " |",
             "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for _, r in df.iterrows():
        cells = [str(r[c]).replace("|", "\\|") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(out / "ledger.md", "\n".join(lines) + "\n")
