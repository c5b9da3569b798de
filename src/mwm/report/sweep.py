"""The learning-rate sweep's report (``workflow.report: sweep``, :mod:`mwm.plan.variants`).

Compute first, then draw: :func:`sweep_results` turns the runs into one row per run,
:func:`summarize` into one row per (assignment, rate), :func:`stability` into each
assignment's stability edge and best rate; the figures and tables only read those.

- ``sweep_runs.csv``: assignment, rate, seed, status, onset step, final val loss
- ``table_sweep_order``: the paper's loss ordering at the shared rate and at each one's best
- ``table_sweep_grid``: per assignment and rate: seeds, unstable seeds, mean / min / max final loss
- ``table_sweep``: per assignment: best rate and its loss, the loss at the shared rate, the
  stability edge, the first unstable rate and its earliest onset
- ``fig_sweep_lr``: final val loss against the step size per assignment (mean, seed band;
  unstable runs marked), with the shared rate
- ``fig_sweep_edge``: the mechanism's chain before the onset at each DGram-attention
  assignment's first unstable rate: attention sigma_max against the growth bound, max logit
  range, attention entropy and softmax-Jacobian norm, beside its capped intervention run and
  All Stiefel at the same rate
- the ledger: the ``sweep.*`` rows of :mod:`mwm.paper` and ``loss.order`` (its shared-rate runs are
  the paper's protocol at this scale); every other claim says this config does not produce it
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mwm import paper
from mwm.config.names import ATTN_MATRICES, PAPER_ASSIGNMENTS
from mwm.plan.runs import run_config
from mwm.plan.variants import intervention_keys, intervention_label, rate_label, sweep_points, sweep_variant
from mwm.report.tables import fmt, write_table

__all__ = ["STABLE", "sweep_results", "summarize", "Stability", "stability", "chain_series", "sweep_report"]

#: The run status that counts as stable; anything else (unstable, failed) does not.
STABLE = "completed"


def sweep_results(cfg: dict, runs) -> pd.DataFrame:
    """One row per run of the sweep: assignment, rate, seed, status, onset step, final val loss
    (NaN for a run that did not complete: its loss is not compared)."""
    rows = []
    for variant, (assignment, rate) in sweep_points(cfg["grid"]).items():
        for seed in cfg["grid"]["seeds"]:
            r = runs[variant, seed]
            ok = r.summary["status"] == STABLE
            rows.append({"assignment": assignment, "rate": rate, "seed": seed, "variant": variant,
                         "status": r.summary["status"], "onset_step": r.summary.get("onset_step"),
                         "final_val_loss": float(r.eval["val_loss"].iloc[-1]) if ok else np.nan})
    return pd.DataFrame(rows)


def summarize(res: pd.DataFrame) -> pd.DataFrame:
    """One row per (assignment, rate): seeds, unstable seeds (not completed), and the mean, min
    and max final val loss over the stable seeds."""
    out = []
    for (a, rate), g in res.groupby(["assignment", "rate"], sort=False):
        ok = g[g.status == STABLE]
        loss = ok.final_val_loss
        out.append({"assignment": a, "rate": rate, "seeds": len(g), "unstable": int((g.status != STABLE).sum()),
                    "mean": float(loss.mean()) if len(ok) else np.nan,
                    "min": float(loss.min()) if len(ok) else np.nan,
                    "max": float(loss.max()) if len(ok) else np.nan,
                    "first_onset": (float(g.onset_step.dropna().min()) if g.onset_step.notna().any() else np.nan)})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Stability:
    """One assignment's sweep: ``edge_rank`` stable rates counted from the smallest (every seed
    stable at each; ``len(rates)``: stable throughout), ``edge`` the largest of them (None: the
    smallest rate is unstable already), ``first_unstable`` the smallest rate with an unstable seed
    (None: none) and ``onset`` that rate's earliest onset step, ``best`` the rate with the lowest
    seed-mean final loss among the rates where every seed is stable (None: no such rate)."""

    assignment: str
    edge_rank: int
    edge: float | None
    first_unstable: float | None
    onset: float | None
    best: float | None


def stability(summary: pd.DataFrame) -> dict[str, Stability]:
    """:class:`Stability` of every assignment in ``summary`` (:func:`summarize`)."""
    out = {}
    for a, g in summary.groupby("assignment", sort=False):
        g = g.sort_values("rate")
        stable = (g.unstable == 0).tolist()
        rank = next((i for i, ok in enumerate(stable) if not ok), len(stable))
        rates = g.rate.tolist()
        first = rates[rank] if rank < len(rates) else None
        onset = float(g.first_onset.iloc[rank]) if first is not None and not np.isnan(g.first_onset.iloc[rank]) \
            else None
        ok = g[g.unstable == 0]
        best = float(ok.rate.iloc[int(np.argmin(ok["mean"].values))]) if len(ok) else None
        out[a] = Stability(a, rank, rates[rank - 1] if rank else None, first, onset, best)
    return out


# -------------------------------------------------------------------------------------------- the ledger
def sweep_ledger_values(cfg: dict, res: pd.DataFrame) -> dict:
    """The rebuilt value of each ``sweep.*`` claim, with what the ledger row shows: ``{id: (x, rebuilt,
    reason)}``. The losses and rates come from :func:`stability`; nothing here chooses a verdict."""
    summary = summarize(res)
    st = stability(summary)
    shared = float(cfg["train"]["muon_lr"])
    out = {}

    # the paper's ordering at each assignment's best rate, and at the shared rate (the paper's protocol)
    out["sweep.order_tuned"] = _order_value(res, st, {a: st[a].best for a in st})
    out["loss.order"] = _order_value(res, st, {a: shared for a in st})

    paper5 = [a for a in PAPER_ASSIGNMENTS if a in st]
    factors = {a: max(st[a].best / shared, shared / st[a].best) for a in paper5 if st[a].best is not None}
    # "within 2x of each": one assignment beyond it decides; all within it needs every assignment's best
    beyond = bool(factors) and max(factors.values()) > paper.SHARED_RATE_FACTOR
    if not factors or (len(factors) < len(paper5) and not beyond):
        out["sweep.shared_rate"] = (None, "--", "no rate where every seed is stable: "
                                    + ", ".join(a for a in paper5 if a not in factors))
    else:
        worst = max(factors, key=factors.get)
        out["sweep.shared_rate"] = (factors[worst], f"{factors[worst]:.3g}x ({worst}: best eta "
                                    f"{rate_label(st[worst].best)}, shared {rate_label(shared)})", "")

    low, high = paper.claim("sweep.stability_edge").value
    edges = {a: st[a].edge_rank for a in (*low, *high) if a in st}
    shown = ", ".join(f"{a} {_edge_text(st[a])}" for a in (*low, *high) if a in st)
    out["sweep.stability_edge"] = (edges, shown or "--", "")

    tests, texts = [], []
    caps = attention_caps(cfg)
    for cand, base in caps.items():
        if base not in st or cand not in st or st[base].first_unstable is None:
            continue
        rate = st[base].first_unstable
        row = summary[(summary.assignment == cand) & (summary.rate == rate)]
        restored = bool(len(row)) and int(row.unstable.iloc[0]) == 0
        tests.append(restored)
        texts.append(f"{cand} at eta {rate_label(rate)} ({base}'s first unstable rate): "
                     f"{int(row.unstable.iloc[0]) if len(row) else '?'} of "
                     f"{int(row.seeds.iloc[0]) if len(row) else '?'} "
                     "seeds unstable")
    if not caps:
        out["sweep.cap_restores"] = (None, "--", "no grid.intervention capping attention in this config")
    elif not tests:
        out["sweep.cap_restores"] = (None, "--", "no intervention baseline went unstable at any rate of the sweep: "
                                     "nothing to intervene on")
    else:
        out["sweep.cap_restores"] = (all(tests), "; ".join(texts), "")
    return out


def attention_caps(cfg: dict) -> dict[str, str]:
    """The interventions that cap attention's singular values: ``{candidate: baseline}``."""
    return {c: b for c, b in cfg["grid"]["intervention"].items()
            if "attn_sigma_cap" in intervention_keys(cfg["grid"], c)}


def _order_value(res: pd.DataFrame, st: dict, rate: dict) -> tuple:
    """``(losses, shown, reason)`` of the paper's loss ordering with each assignment at ``rate[a]``: its
    final losses per seed there, when every seed is stable there."""
    order = list(paper.LOSS_ORDER)
    absent = [a for a in order if a not in st]
    if absent:
        return None, "--", f"not in the sweep: {', '.join(absent)}"
    losses = {a: res[(res.assignment == a) & np.isclose(res.rate, rate[a] or np.nan)].final_val_loss.tolist()
              for a in order}
    unstable = [a for a in order if rate[a] is None or not losses[a] or any(np.isnan(losses[a]))]
    if unstable:
        return None, "--", f"a seed unstable (or no stable rate) for {', '.join(unstable)}"
    shown = " < ".join(f"{a} {np.mean(v):.4f} (eta {rate_label(rate[a])})"
                       for a, v in sorted(losses.items(), key=lambda kv: np.mean(kv[1])))
    return losses, shown, ""


def _edge_text(s: Stability) -> str:
    if s.first_unstable is None:
        return "stable at every rate"
    if s.edge is None:
        return f"unstable from the smallest rate, eta {rate_label(s.first_unstable)}"
    return f"eta {rate_label(s.edge)} (unstable at {rate_label(s.first_unstable)})"


# -------------------------------------------------------------------------------------------- tables, figures
def sweep_tables(cfg: dict, res: pd.DataFrame, out: Path) -> None:
    from mwm.io import atomic_write_text

    atomic_write_text(out / "sweep_runs.csv", res.to_csv(index=False))
    summary = summarize(res)
    grid = summary.assign(rate=summary.rate.map(rate_label),
                          **{k: summary[k].map(lambda v: fmt(v)) for k in ("mean", "min", "max")},
                          first_onset=summary.first_onset.map(lambda v: "--" if np.isnan(v) else f"{v:.0f}"))
    write_table(grid, out, "table_sweep_grid", f"Final validation loss per assignment and Muon step size "
                f"({len(cfg['grid']['seeds'])} seeds; stable seeds only; unstable: seeds not completed)")
    shared = float(cfg["train"]["muon_lr"])
    rows = []
    for a, s in stability(summary).items():
        at = summary[(summary.assignment == a) & (summary.rate == shared)]
        bt = summary[(summary.assignment == a) & (summary.rate == s.best)] if s.best is not None else at.iloc[:0]
        rows.append({"assignment": a,
                     "best eta": "--" if s.best is None else rate_label(s.best),
                     "loss at best": "--" if bt.empty else f"{bt['mean'].iloc[0]:.4f} ({bt['min'].iloc[0]:.4f}-"
                                                           f"{bt['max'].iloc[0]:.4f})",
                     f"loss at shared eta {rate_label(shared)}": "--" if at.empty or np.isnan(at['mean'].iloc[0])
                     else f"{at['mean'].iloc[0]:.4f} ({at['min'].iloc[0]:.4f}-{at['max'].iloc[0]:.4f})",
                     "stability edge": _edge_text(s),
                     "onset at first unstable": "--" if s.onset is None else f"{s.onset:.0f}"})
    vals = sweep_ledger_values(cfg, res)
    orderings = (("at the shared rate (the paper's protocol)", "loss.order"),
                 ("each at its best rate", "sweep.order_tuned"))
    orders = [{"ordering": what, "final val loss, seed means (best first)": vals[cid][1] if vals[cid][0] is not None
               else f"-- ({vals[cid][2]})"} for what, cid in orderings]
    write_table(pd.DataFrame(orders), out, "table_sweep_order", "The paper's ordering (Hetero < All Stiefel < "
                "Unconstrained) at the shared Muon step size and with each assignment at its own best (the ledger's "
                "loss.order and sweep.order_tuned rows judge them)")
    write_table(pd.DataFrame(rows), out, "table_sweep", "Each assignment tuned: its best Muon step size (lowest "
                "seed-mean final validation loss where every seed is stable; mean and seed range), the loss at the "
                "shared step size, and its stability edge (the largest step size stable at every seed and below)")


def fig_sweep_lr(cfg: dict, res: pd.DataFrame, out: Path) -> None:
    import matplotlib.pyplot as plt

    from mwm.report import style

    summary = summarize(res)
    shared = float(cfg["train"]["muon_lr"])
    fig, ax = plt.subplots(figsize=(style.COLUMN * 1.4, 2.6))
    for a, g in summary.groupby("assignment", sort=False):
        g = g.sort_values("rate")
        capped = a in cfg["grid"]["intervention"]
        c = style.color(cfg["grid"]["intervention"].get(a, a))
        ax.plot(g.rate, g["mean"], color=c, ls="--" if capped else "-", marker="o", ms=2.5,
                label=style.label(a) + (f" ({intervention_label(cfg['grid'], a)})" if capped else ""))
        ax.fill_between(g.rate, g["min"], g["max"], color=c, alpha=0.15, lw=0)
        bad = g[g.unstable > 0]
        top = np.nanmax(summary["max"].values) if summary["max"].notna().any() else 1.0
        ax.scatter(bad.rate, np.where(np.isnan(bad["mean"]), top, bad["mean"]), marker="x", color=c, s=18,
                   zorder=3)
    ax.axvline(shared, color="k", ls=":", lw=0.8, label=f"shared eta {rate_label(shared)}")
    ax.set(xscale="log", xlabel=r"Muon step size $\eta$", ylabel="final val loss (stable seeds)",
           title=f"{len(cfg['grid']['seeds'])} seeds, {cfg['train']['max_iters']} steps; x: a seed unstable")
    style.legend_below(fig, ax, ncol=3)
    style.save(fig, out, "fig_sweep_lr")


def chain_series(r) -> dict[str, pd.Series]:
    """The mechanism's chain in one run, per logged step: attention sigma_max (max over c_attn and c_proj),
    the max logit range, mean entropy and mean softmax-Jacobian norm over heads, and the attention solves'
    mean alignment and a converged solve's (empty where the run measured none)."""
    sp = r.spectral
    att = r.attention.groupby("step")
    q = r.solver[r.solver.module == "attn"].groupby("step") if len(r.solver) else None
    empty = pd.Series(dtype=float)
    return {"sigma": sp[(sp.module == "attn") & sp.matrix.isin(ATTN_MATRICES)].groupby("step")["sigma_max"].max(),
            "logit_range_max": att["logit_range_max"].max(), "entropy_mean": att["entropy_mean"].mean(),
            "jac_fro_mean": att["jac_fro_mean"].mean(),
            "alignment": q["alignment"].mean() if q is not None else empty,
            "alignment_converged": q["alignment_converged"].mean() if q is not None else empty}


def fig_sweep_edge(cfg: dict, res: pd.DataFrame, runs, out: Path) -> None:
    """The mechanism's chain at each DGram-attention assignment's first unstable rate, over the steps up to
    its onset (its first unstable seed), beside the capped candidate and All Stiefel at that rate."""
    import matplotlib.pyplot as plt

    from mwm.report import style
    from mwm.report.training import growth_bound

    st = stability(summarize(res))
    cases = [(a, st[a]) for a in paper.DGRAM_ATTENTION if a in st and st[a].first_unstable is not None]
    panels = (("sigma", r"attention $\sigma_{\max}$"), ("logit_range_max", "max logit range"),
              ("entropy_mean", "attention entropy"), ("jac_fro_mean", r"softmax-Jacobian $\|J\|_F$"))
    fig, axes = plt.subplots(max(len(cases), 1), 4, figsize=(style.FULL, 1.9 * max(len(cases), 1)), squeeze=False)
    if not cases:
        axes[0, 0].text(0.02, 0.5, "no DGram-attention assignment went unstable at any rate of the sweep",
                        transform=axes[0, 0].transAxes)
        for ax in axes.ravel():
            ax.axis("off")
    capped_of = {b: c for c, b in attention_caps(cfg).items()}
    for row, (a, s) in zip(axes, cases):
        rate = s.first_unstable
        pts = res[(res.assignment == a) & (res.rate == rate) & (res.status != "completed")]
        seed = int(pts.seed.iloc[0])
        onset = pts.onset_step.iloc[0]
        shown = [(a, "-")] + [(v, ls) for v, ls in ((capped_of.get(a), "--"), ("stiefel", ":")) if v in st]
        for v, ls in shown:
            r = runs[sweep_variant(v, rate), seed]
            series = chain_series(r)
            sig = series["sigma"]
            c = style.color(a if v == capped_of.get(a) else v)
            lab = style.label(v) + (f" ({intervention_label(cfg['grid'], v)})" if v == capped_of.get(a) else "")
            for ax, (key, _) in zip(row, panels):
                y = series[key]
                ax.plot(y.index, y.values, color=c, ls=ls, label=lab)
            if v == a:
                steps = sig.index.values
                tc = run_config(cfg, sweep_variant(v, rate))["train"]
                row[0].plot(steps, growth_bound(tc, float(sig.iloc[0]), steps), color="k", ls="-.", lw=0.7,
                            label=r"bound $\sigma_0 + \sum \eta_s$")
        for ax, (key, title) in zip(row, panels):
            if onset is not None and not pd.isna(onset):
                ax.axvline(float(onset), color="grey", lw=0.6)  # the onset
            ax.set(title=title, xlabel="step")
        row[0].set_ylabel(f"{style.label(a)}, eta {rate_label(rate)}, seed {seed}")
        row[0].set_yscale("log")
        row[1].set_yscale("log")
        row[0].legend(fontsize=5)
    style.save(fig, out, "fig_sweep_edge")


def sweep_report(cfg: dict, runs, out: Path) -> pd.DataFrame:
    """Every product of the sweep report in ``out``; returns the per-run results."""
    from mwm.report import style

    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    res = sweep_results(cfg, runs)
    sweep_tables(cfg, res, out)
    fig_sweep_lr(cfg, res, out)
    fig_sweep_edge(cfg, res, runs, out)
    return res
