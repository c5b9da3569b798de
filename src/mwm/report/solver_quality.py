"""The inner solve's quality along training (``solver.csv``, :mod:`mwm.optim.quality`), against the weight scale.

``solver_quality(runs)`` gathers every run's rows with its variant; ``fig_solver_quality`` draws, per
module (attention, MLP) and assignment, the median update alignment and the median alignment a converged
solve reaches on the same pairs, in bins of the matrix's sigma_max (on DGram its largest column norm, on
Stiefel 1). Where the two part, the solve no longer finds what the constraint allows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mwm.report import style

__all__ = ["solver_quality", "quality_bins", "fig_solver_quality"]


def solver_quality(runs, group=lambda variant: variant) -> pd.DataFrame:
    """Every run's ``solver.csv`` rows with ``variant``, ``seed`` and ``group`` (``group(variant)``: how the
    figure pools variants, e.g. a sweep variant's assignment); empty when no run measured a solve."""
    parts = [r.solver.assign(variant=v, seed=s, group=group(v)) for (v, s), r in sorted(runs.items())
             if len(r.solver)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def quality_bins(df: pd.DataFrame, per_decade: int = 4) -> pd.DataFrame:
    """Medians of ``alignment`` and ``alignment_converged`` per (group, module, bin of log10 scale): one
    row per bin with its geometric centre and the number of (matrix, step) rows in it."""
    if df.empty:
        return pd.DataFrame(columns=["group", "module", "scale", "alignment", "alignment_converged", "n"])
    b = np.floor(np.log10(df["scale"].clip(lower=1e-12)) * per_decade)
    agg = (df.assign(bin=b).groupby(["group", "module", "bin"], sort=False)
           .agg(alignment=("alignment", "median"), alignment_converged=("alignment_converged", "median"),
                n=("alignment", "size")).reset_index())
    agg["scale"] = 10 ** ((agg["bin"] + 0.5) / per_decade)
    return agg.drop(columns="bin").sort_values(["group", "module", "scale"]).reset_index(drop=True)


def fig_solver_quality(df: pd.DataFrame, out: Path, title: str = "", color=style.color, label=style.label) -> None:
    """Update alignment (solid) and a converged solve's (dashed) against sigma_max, attention and MLP."""
    import matplotlib.pyplot as plt

    bins = quality_bins(df)
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL, 2.6), sharey=True)
    for ax, (module, name) in zip(axes, (("attn", "attention"), ("mlp", "MLP"))):
        part = bins[bins.module == module]
        for g, d in part.groupby("group", sort=False):
            ax.plot(d.scale, d.alignment, color=color(g), marker="o", ms=2.5, label=label(g))
            ax.plot(d.scale, d.alignment_converged, color=color(g), ls="--", lw=0.8)
        if part.empty:
            ax.text(0.5, 0.5, "no constrained matrix", transform=ax.transAxes, ha="center")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xscale="log", xlabel=r"$\sigma_{\max}$ of the matrix", title=f"{name} matrices")
    axes[0].set_ylabel(r"alignment $\mathrm{tr}(U^\top A)/\|U\|_*$ (median)")
    fig.suptitle(title or "Inner-solve quality along training: the update (solid) and a converged solve (dashed)")
    style.legend_below(fig, axes[0] if len(bins[bins.module == "attn"]) else axes[1], ncol=3)
    style.save(fig, out, "fig_solver_quality")
