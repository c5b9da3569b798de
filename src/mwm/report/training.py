"""Figures 4-7, the attention-saturation figures, the inner solve's quality and Tables 3-4, from the
training runs."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.patches import FancyBboxPatch
from PIL import Image

from mwm import paper
from mwm.optim.assignments import resolve_assignment
from mwm.io import atomic_write, atomic_write_json
from mwm.config.layout import SIZES, hidden_matrix_shapes
from mwm.optim.manifolds import get_manifold
from mwm.train.model import GPT, GPTConfig
from mwm.config.names import (ADAMW, ATTN_MATRICES, MLP_MATRICES, NAMED_ASSIGNMENTS, PAPER_ASSIGNMENTS, UNCONSTRAINED,
                              is_colnorm, parse_variant)
from mwm.plan.variants import assignment_spec
from mwm.train.schedule import muon_lr_series
from mwm.report import style
from mwm.report.load import RunData, load_spectrum, spectra_steps
from mwm.report.tables import write_table
from mwm.workflow.stages import STAGES

__all__ = ["training_report", "run_metrics", "write_run_metrics", "base_variants", "ablation_pairs", "aggregate_status",
           "growth_bound"]

ATTN_MATS, MLP_MATS = ATTN_MATRICES, MLP_MATRICES


def base_variants(runs) -> list[str]:
    return list(dict.fromkeys(v for v, _ in runs if not is_colnorm(v)))


def ablation_pairs(runs) -> list[tuple[str, str]]:
    vs = {v for v, _ in runs}
    return [(parse_variant(v)[0], v) for v in dict.fromkeys(v for v, _ in runs) if is_colnorm(v)
            and parse_variant(v)[0] in vs]


def seeds_of(runs, variant) -> list[RunData]:
    return [r for (v, _), r in sorted(runs.items()) if v == variant]


def aggregate_status(rs: list[RunData]) -> tuple[str, list]:
    unstable = [r for r in rs if r.summary["status"] == "unstable"]
    failed = [r for r in rs if r.summary["status"] == "failed"]
    onsets = [r.summary["onset_step"] for r in unstable]
    if failed:
        return f"Failed ({len(failed)}/{len(rs)} seeds)", onsets
    if unstable:
        return ("Unstable" if len(unstable) == len(rs) else f"Unstable ({len(unstable)}/{len(rs)} seeds)"), onsets
    return "Stable", onsets


def _curve(rs: list[RunData], frame: str, col: str):
    tabs = [getattr(r, frame).set_index("step")[col] for r in rs]
    df = pd.concat(tabs, axis=1)
    return df.index.values, df.mean(axis=1).values, df.min(axis=1).values, df.max(axis=1).values


# ----------------------------------------------------------------------------------- Figure 5


def fig_val_loss(runs, out: Path, variants: list[str], stem: str, title: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL, 2.7))
    max_step = max(r.summary["max_iters"] for r in runs.values())
    zoom_from = int(0.2 * max_step)
    paper_scale = max_step >= paper.STEPS
    stable_vals = []
    for v in variants:
        rs = seeds_of(runs, v)
        x, mean, lo, hi = _curve(rs, "eval", "val_loss")
        status, onsets = aggregate_status(rs)
        lab = style.label(v) + ("" if status == "Stable" else f" [{status}]")
        if v in paper.LOSSES:
            lab += f" (paper: {paper.LOSSES[v]:.4f})"
            if paper_scale:  # the paper's final value, where it was measured
                axes[1].plot(paper.STEPS, paper.LOSSES[v], "D", ms=3, color=style.color(v))
                stable_vals.append(np.array([paper.LOSSES[v]]))
        for ax, part in ((axes[0], True), (axes[1], status == "Stable")):
            if not part:
                continue
            sel = x >= (zoom_from if ax is axes[1] else 0)
            ax.plot(x[sel], mean[sel], color=style.color(v), ls=style.linestyle(v), label=lab,
                    marker="." if sel.sum() == 1 else None)  # a run stopped after one evaluation
            if len(rs) > 1:
                ax.fill_between(x[sel], lo[sel], hi[sel], color=style.color(v), alpha=0.2, lw=0)
        if status == "Stable":
            stable_vals.append(mean[x >= zoom_from])
        for r, onset in zip([r for r in rs if r.summary["status"] == "unstable"], onsets):
            ev = r.eval.set_index("step")["val_loss"]
            at = ev.index[ev.index >= onset]
            if len(at):
                axes[0].plot(at[0], ev.loc[at[0]], "x", color=style.color(v), ms=6, mew=1.5)
            else:  # stopped at the onset before another evaluation: mark the onset step
                # at the last finite val loss, where the curve ends
                before = ev[(ev.index < onset) & np.isfinite(ev.values)]
                if len(before):
                    axes[0].plot(onset, before.iloc[-1], "x", color=style.color(v), ms=6, mew=1.5)
    fig.suptitle(title)
    axes[0].set(title="full trajectory (x: onset of instability)", xlabel="step", ylabel="val loss (nats)")
    axes[1].set(title=f"stable runs, steps >= {zoom_from}" + (" (diamonds: paper)" if paper_scale else ""),
                xlabel="step", ylabel="val loss (nats)")
    if stable_vals:
        vals = np.concatenate([s for s in stable_vals if len(s)]) if any(len(s) for s in stable_vals) else []
        vals = np.asarray(vals)
        vals = vals[np.isfinite(vals)]
        if len(vals):
            pad = 0.05 * (vals.max() - vals.min() + 1e-6)
            axes[1].set_ylim(vals.min() - pad, vals.max() + pad)
    style.legend_below(fig, axes[0], ncol=3)
    style.save(fig, out, stem)


# ----------------------------------------------------------------------------------- Figure 6
def _sigma_series(rs: list[RunData], module: str, mats) -> tuple[np.ndarray, np.ndarray]:
    per_seed = []
    for r in rs:
        sp = r.spectral
        sel = sp[(sp.module == module) & sp.matrix.isin(mats)]
        per_seed.append(sel.groupby("step")["sigma_max"].max())
    df = pd.concat(per_seed, axis=1)
    return df.index.values, df.mean(axis=1).values


def growth_bound(train: dict, sigma0: float, steps: np.ndarray) -> np.ndarray:
    """sigma_max(W_t) <= sigma_max(W_0) + sum_{s<t} eta_s (||A||_2 <= 1, singular-value-keeping retraction)."""
    eta = np.concatenate([[0.0], np.cumsum(muon_lr_series(train))])
    return sigma0 + eta[np.clip(steps.astype(int), 0, len(eta) - 1)]


def fig_sigma(runs, out: Path, variants: list[str], train: dict) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL, 2.7))
    for v, lw in zip(variants, style.widths(len(variants))):
        rs = seeds_of(runs, v)
        for ax, module, mats in ((axes[0], "attn", ATTN_MATS), (axes[1], "mlp", MLP_MATS)):
            x, y = _sigma_series(rs, module, mats)
            ax.plot(x, y, color=style.color(v), ls="--" if v == "none" else "-", lw=lw, label=style.label(v))
    # the bound concerns DGram attention: start it from their largest initial sigma_max
    sp = pd.concat([r.spectral for r in runs.values()])
    first = sp[(sp.module == "attn") & sp.matrix.isin(ATTN_MATS) & (sp.step == sp.step.min())]
    dg = first[first.manifold == "dgram"]
    sigma0 = float((dg if len(dg) else first)["sigma_max"].max())
    x_all = np.unique(np.concatenate([r.spectral.step.values for r in runs.values()]))
    axes[0].plot(x_all, growth_bound(train, sigma0, x_all), color="k", ls=":", lw=0.8,
                 label=r"bound $\sigma_0 + \sum_s \eta_s$")
    axes[0].set(yscale="log", title=r"attention $\sigma_{\max}$ (max over c_attn, c_proj)", xlabel="step",
                ylabel=r"$\sigma_{\max}$")
    axes[1].set(title=r"MLP $\sigma_{\max}$ (max over c_fc, c_proj)", xlabel="step", ylabel=r"$\sigma_{\max}$")
    style.legend_below(fig, axes[0])
    style.save(fig, out, "fig6_sigma_max")


def fig_sigma_layers(runs, out: Path, variants: list[str]) -> None:
    fig, axes = plt.subplots(1, len(variants), figsize=(style.FULL, 1.9), squeeze=False, sharey=True)
    mats = []
    for v in variants:
        sp = pd.concat([r.spectral for r in seeds_of(runs, v)])
        sel = sp[(sp.module == "attn") & sp.matrix.isin(ATTN_MATS)]
        mats.append(sel.groupby(["layer", "step"])["sigma_max"].max().unstack("step"))
    vmin = max(min(m.values.min() for m in mats), 1e-3)
    vmax = max(max(m.values.max() for m in mats), vmin * 10)
    for ax, v, m in zip(axes[0], variants, mats):
        im = ax.imshow(m.values, aspect="auto", origin="lower", norm=LogNorm(vmin, vmax), cmap="viridis",
                       extent=[m.columns.min(), m.columns.max(), -0.5, m.shape[0] - 0.5])
        ax.set(title=style.label(v), xlabel="step", yticks=range(m.shape[0]))
    axes[0][0].set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), label=r"attention $\sigma_{\max}$", shrink=0.9)
    style.save(fig, out, "fig6_sigma_max_layers")


# ----------------------------------------------------------------------------------- Figure 7
SPECTRUM_KEY = "transformer.h.0.attn.c_attn.weight"


def _spectrum_runs(runs):
    picks = {}
    for v in ("dgram", "stiefel"):
        rs = seeds_of(runs, v)
        if rs:
            picks[v] = rs[0]
    return picks


def fig_spectrum(runs, out: Path) -> list[Path]:
    picks = _spectrum_runs(runs)
    if len(picks) < 2:
        return []
    steps = sorted(set(spectra_steps(picks["dgram"])) & set(spectra_steps(picks["stiefel"])))
    shown = [steps[i] for i in sorted(set(np.linspace(0, len(steps) - 1, min(6, len(steps))).astype(int)))]
    fig, axes = plt.subplots(1, len(shown), figsize=(style.FULL, 1.8), sharey=True, squeeze=False)
    for ax, step in zip(axes[0], shown):
        for v, r in picks.items():
            ax.plot(load_spectrum(r, step, SPECTRUM_KEY), color=style.color(v), label=style.label(v))
        ax.set(title=f"step {step}", yscale="log", xlabel="index (descending)")
    axes[0][0].set_ylabel("singular value (layer 0 c_attn)")
    axes[0][0].legend()
    paths = style.save(fig, out, "fig7_spectrum")

    frames = []
    ymax = max(load_spectrum(r, s, SPECTRUM_KEY).max() for r in picks.values() for s in steps)
    ymin = min(max(load_spectrum(r, s, SPECTRUM_KEY).min(), 1e-6) for r in picks.values() for s in steps)
    for step in steps:
        f, axs = plt.subplots(1, 2, figsize=(style.COLUMN * 1.6, 1.8), sharey=True)
        for ax, (v, r) in zip(axs, sorted(picks.items())):
            ax.plot(load_spectrum(r, step, SPECTRUM_KEY), color=style.color(v))
            ax.set(title=f"{style.label(v)}, step {step}", yscale="log", ylim=(ymin / 2, ymax * 2), xlabel="index")
        buf = io.BytesIO()
        f.savefig(buf, format="png", dpi=100)
        plt.close(f)
        buf.seek(0)
        frames.append(Image.open(buf).convert("P", palette=Image.Palette.ADAPTIVE))
    gif = out / "fig7_spectrum.gif"
    atomic_write(gif, lambda p: frames[0].save(p, format="GIF", save_all=True, append_images=frames[1:],
                                                 duration=400, loop=0))
    return paths + [gif]


# ------------------------------------------------------------------------- attention saturation
ATT_METRICS = (("logit_range_max", r"max logit range $\Delta z$", "max"),
               ("entropy_mean", "attention entropy (nats)", "mean"),
               ("jac_fro_mean", r"softmax Jacobian $\|J\|_F$", "mean"))
ATT_SHORT = {"logit_range_max": r"logit range $\Delta z$ (max)", "entropy_mean": "entropy (nats, mean)",
             "jac_fro_mean": r"$\|J\|_F$ (mean)"}


def fig_attention(runs, out: Path, variants: list[str]) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(style.FULL, 2.5))
    for v, lw in zip(variants, style.widths(len(variants))):
        rs = seeds_of(runs, v)
        for ax, (col, lab, how) in zip(axes, ATT_METRICS):
            per = [getattr(r.attention.groupby("step")[col], how)() for r in rs]
            y = pd.concat(per, axis=1).mean(axis=1)
            ax.plot(y.index, y.values, color=style.color(v), ls=style.linestyle(v), lw=lw, label=style.label(v))
            ax.set(title=lab, xlabel="step", ylabel=f"{how} over layers and heads")
    axes[0].set_yscale("log")
    style.legend_below(fig, axes[0])
    style.save(fig, out, "fig_attention_saturation")
    n_layers = int(max(r.attention.layer.max() for r in runs.values())) + 1
    fig, axes = plt.subplots(3, n_layers, figsize=(style.FULL, 4.6), squeeze=False, sharex=True)
    for v, lw in zip(variants, style.widths(len(variants))):
        att = pd.concat([r.attention for r in seeds_of(runs, v)])
        for i, (col, lab, how) in enumerate(ATT_METRICS):
            g = att.groupby(["layer", "step"])[col]
            g = g.max() if how == "max" else g.mean()
            for layer in range(n_layers):
                y = g.loc[layer]
                axes[i][layer].plot(y.index, y.values, color=style.color(v), ls=style.linestyle(v), lw=lw,
                                    label=style.label(v))
                axes[i][layer].set_title(f"layer {layer}: {ATT_SHORT[col]}")
    for layer in range(n_layers):
        axes[0][layer].set_yscale("log")
        axes[-1][layer].set_xlabel("step")
    style.legend_below(fig, axes[0][0])
    style.save(fig, out, "fig_attention_layers")


# ----------------------------------------------------------------------------------- Figure 4
def fig_assignments(cfg: dict, out: Path, variants: list[str]) -> None:
    model = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4))
    boxes = [("wte / wpe", "transformer.wte.weight"), ("ln_1", "transformer.h.0.ln_1.weight"),
             ("attn.c_attn\n(Q,K,V)", "transformer.h.0.attn.c_attn.weight"),
             ("attn.c_proj", "transformer.h.0.attn.c_proj.weight"), ("ln_2", "transformer.h.0.ln_2.weight"),
             ("mlp.c_fc", "transformer.h.0.mlp.c_fc.weight"), ("mlp.c_proj", "transformer.h.0.mlp.c_proj.weight"),
             ("ln_f / lm_head\n(tied)", "transformer.ln_f.weight")]
    fig, ax = plt.subplots(figsize=(style.FULL, 0.45 * len(variants) + 0.6))
    for row, v in enumerate(variants):
        assignment, _ = parse_variant(v)
        plan = resolve_assignment(dict(model.named_parameters()), assignment_spec(cfg["grid"], assignment))
        y = len(variants) - 1 - row
        ax.text(-0.2, y, style.label(v), ha="right", va="center")
        for col, (text, pname) in enumerate(boxes):
            target = plan[pname]
            ax.add_patch(FancyBboxPatch((col + 0.05, y - 0.35), 0.9, 0.7, boxstyle="round,pad=0.02",
                                        fc=style.MANIFOLD_COLORS.get(target, "#ffffff"), ec="k", lw=0.5))
            word = {"none": "Muon", "adamw": "AdamW", "dgram": "DGram"}.get(target, target.capitalize())
            ax.text(col + 0.5, y, f"{text}\n{word}", ha="center", va="center", fontsize=5)
    ax.set(xlim=(-2.2, len(boxes)), ylim=(-0.6, len(variants) - 0.4))
    ax.axis("off")
    ax.set_title("Optimizer / manifold per module of a GPT-2 block (every block alike)")
    style.save(fig, out, "fig4_assignments")


# ----------------------------------------------------------------------------------- tables
def table_assignments(cfg: dict, out: Path, variants: list[str]) -> pd.DataFrame:
    rows = []
    for v in variants:
        a, retraction = parse_variant(v)
        spec = assignment_spec(cfg["grid"], a)
        if isinstance(spec, str):
            pair = NAMED_ASSIGNMENTS[spec] or (ADAMW, ADAMW)
            attn, mlp = pair
        else:
            attn = mlp = "pattern: " + "; ".join(f"{k}->{m}" for k, m in spec.items())
        rows.append({"variant": v, "label": style.label(v), "attention": attn, "mlp": mlp,
                     "dgram_retraction": retraction})
    df = pd.DataFrame(rows)
    write_table(df, out, "table3_assignments", "Table 3: manifold assignments (Muon = unconstrained Muon)")
    return df


def run_metrics(runs) -> dict:
    """The config's DVC metrics (``metrics.json``): per variant, the final val loss's mean and spread
    (population std) over the seeds that have one, how many seeds completed, and which seeds ran."""
    out = {}
    for v in dict.fromkeys(v for v, _ in sorted(runs)):
        rs = seeds_of(runs, v)
        finals = [r.summary["final_val_loss"] for r in rs if r.summary["final_val_loss"] is not None
                  and math.isfinite(r.summary["final_val_loss"])]
        out[v] = {"final_val_loss_mean": round(float(np.mean(finals)), 6) if finals else None,
                  "final_val_loss_std": round(float(np.std(finals)), 6) if finals else None,
                  "completed": sum(r.summary["status"] == "completed" for r in rs),
                  "seeds": [r.seed for r in rs]}
    return out


def write_run_metrics(runs, out: Path) -> Path:
    return atomic_write_json(out / STAGES["report"].file("metrics"), run_metrics(runs), sort_keys=False)


def table_results(runs, out: Path, variants: list[str]) -> pd.DataFrame:
    none_time = None
    if any(v == "none" for v, _ in runs):
        none_time = np.mean([r.summary["mean_step_time"] for r in seeds_of(runs, "none")])
    rows = []
    for v in variants:
        rs = seeds_of(runs, v)
        finals = np.array([r.summary["final_val_loss"] if r.summary["final_val_loss"] is not None else np.nan
                           for r in rs], dtype=float)
        status, onsets = aggregate_status(rs)
        t = np.mean([r.summary["mean_step_time"] for r in rs])
        rows.append({
            "variant": v, "label": style.label(v), "seeds": len(rs),
            "final_val_loss": f"{np.nanmean(finals):.4f} ± {np.nanstd(finals):.4f}" if len(rs) > 1
            else f"{finals[0]:.4f}",
            "final_val_mean": float(np.nanmean(finals)), "final_val_std": float(np.nanstd(finals)),
            "best_val_loss": float(np.nanmean([r.summary["best_val_loss"] or np.nan for r in rs])),
            "status": status, "onset_steps": ", ".join(str(o) for o in onsets) if onsets else "--",
            "step_time_s": float(t), "cost_vs_none": float(t / none_time) if none_time else None,
        })
    df = pd.DataFrame(rows)
    write_table(df.drop(columns=["final_val_mean", "final_val_std"]), out, "table4_results",
                "Table 4: final validation loss (mean ± std over seeds), status, onset step and "
                "per-step cost relative to Unconstrained")
    return df


def table_expressiveness(cfg: dict, out: Path) -> pd.DataFrame:
    shapes = hidden_matrix_shapes(SIZES["gpt2"]["n_embd"])
    rows = []
    for key, (m, n) in shapes.items():
        row = {"matrix (GPT-2 small)": key, "shape": f"{m}x{n}"}
        for mf in ("stiefel", "dgram", "oblique"):
            row[mf] = get_manifold(mf).tangent_dim(m, n)
        row["dgram - stiefel"] = row["dgram"] - row["stiefel"]
        rows.append(row)
    per_block = {}
    for a in (a for a in PAPER_ASSIGNMENTS if a not in UNCONSTRAINED):
        attn, mlp = NAMED_ASSIGNMENTS[a]
        per_block[a] = sum(get_manifold(attn if k.startswith("attn") else mlp).tangent_dim(*s)
                           for k, s in shapes.items())
    for a, total in per_block.items():
        rows.append({"matrix (GPT-2 small)": f"block total: {a}", "shape": "", "stiefel": None, "dgram": None,
                     "oblique": None, "dgram - stiefel": None, "assignment_tangent_dim": total})
    df = pd.DataFrame(rows)
    write_table(df, out, "table_expressiveness", "Tangent-space dimensions (expressiveness) at GPT-2 small shapes")
    return df


def training_report(cfg: dict, runs, out: Path) -> dict:
    """Write every training figure and table; return numbers the ledger needs."""
    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    # a solver comparison's candidate repeats its baseline's assignment: it has its own figure
    variants = [v for v in base_variants(runs) if v not in cfg["grid"]["solver_comparison"]]
    fig_assignments(cfg, out, variants)
    fig_val_loss(runs, out, variants, "fig5_val_loss", "Validation loss")
    pairs = ablation_pairs(runs)
    if pairs:
        fig_val_loss(runs, out, [v for p in pairs for v in p], "fig_ablation_val_loss",
                     "DGram retraction: paper (solid) vs colnorm (dashed)")
    fig_sigma(runs, out, variants, cfg["train"])
    fig_sigma_layers(runs, out, variants)
    fig_spectrum(runs, out)
    fig_attention(runs, out, variants)
    from mwm.report.solver_quality import fig_solver_quality, solver_quality

    fig_solver_quality(solver_quality({k: r for k, r in runs.items() if k[0] in variants}), out)
    table_assignments(cfg, out, list(dict.fromkeys(v for v, _ in runs)))
    results = table_results(runs, out, list(dict.fromkeys(v for v, _ in runs)))
    table_expressiveness(cfg, out)
    return {"results": results}
