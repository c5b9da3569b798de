"""Training with a cheaper inner solver against the paper's: ``grid.solver_comparison``.

Each entry pairs a candidate variant (the baseline's assignment, trained with another
inner solver through ``grid.train_overrides``) with its baseline, over the grid's
seeds. ``fig_solver_training`` draws both validation curves (mean, band min-max over
seeds) and the per-seed difference candidate - baseline against the baseline's seed
spread; ``table_solver_training`` gives the final losses and the verdict.

The verdict's rule is fixed here, before any result is read, and applied the same way
whichever way the numbers fall:

* fewer than :data:`MIN_SEEDS` seeds trained by both: ``too few seeds``;
* any of the paired runs not ``completed`` (unstable or failed): ``not comparable``;
* ``|mean paired difference| <= spread``, where ``spread`` is the baseline's range of
  final validation losses over the seeds (max - min): ``equal within seed noise``;
* otherwise ``candidate higher`` or ``candidate lower``.

The table also names the solver the candidate trains with (from its overrides) and
the solver study's fastest candidate that matches the paper's e_W per manifold
(``solvers_derived.json``), so a reader sees whether the trained candidate is the one
the study picked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mwm.report import style
from mwm.report.tables import write_table

__all__ = ["MIN_SEEDS", "verdict", "solver_training_report"]

#: The fewest paired seeds for a verdict on equality within seed noise.
MIN_SEEDS = 3


def verdict(baseline: list[float], candidate: list[float], statuses: list[str]) -> tuple[str, float, float]:
    """``(verdict, mean paired difference, baseline spread)`` for final losses paired by seed."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    diff = float(np.mean(c - b)) if len(b) else float("nan")
    spread = float(b.max() - b.min()) if len(b) else float("nan")
    if len(b) < MIN_SEEDS:
        return "too few seeds", diff, spread
    if any(s != "completed" for s in statuses):
        return "not comparable (a run did not complete)", diff, spread
    if abs(diff) <= spread:
        return "equal within seed noise", diff, spread
    return ("candidate higher" if diff > 0 else "candidate lower"), diff, spread


def _solver_text(cfg: dict, variant: str) -> str:
    over = cfg["grid"]["train_overrides"].get(variant, {})
    train = {**cfg["train"], **over}
    steps = train["solver_max_steps"] or train["dual_ascent_steps"]
    parts = [train["solver"], f"{steps} it.", "warm" if train["warm_start"] else "cold"]
    if train["solver"] == "admm":
        parts.append(f"rho {train['admm_rho']:g}")
    else:
        parts.append(f"alpha {train['dual_ascent_alpha']:g}")
    if train["solver_tol"] is not None:
        parts.append(f"tol {train['solver_tol']:g}")
    return ", ".join(parts)


def _study_pick(studies: dict) -> str:
    derived = studies.get("solvers_derived.json")
    if not derived:
        return "no solver study"
    picks = []
    for manifold, d in sorted(derived["by_manifold"].items()):
        f = d.get("fastest_matching")
        picks.append(f"{manifold}: {f['candidate'] if f else 'none matches'}")
    for m in derived.get("not_captured") or []:
        picks.append(f"{m['assignment']}: not captured ({m['reason']})")
    return "; ".join(picks)


def _paired(runs, baseline: str, candidate: str):
    seeds = sorted({s for v, s in runs if v == baseline} & {s for v, s in runs if v == candidate})
    return seeds, [runs[baseline, s] for s in seeds], [runs[candidate, s] for s in seeds]


def _final(r) -> float:
    v = r.summary["final_val_loss"]
    return float("nan") if v is None else float(v)


def _figure(runs, out: Path, comparisons: dict) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(comparisons), 2, figsize=(style.FULL, 2.4 * len(comparisons)), squeeze=False)
    for row, (candidate, baseline) in zip(axes, comparisons.items()):
        seeds, base, cand = _paired(runs, baseline, candidate)
        # validation loss per step, one column per seed
        b = pd.concat([r.eval.set_index("step")["val_loss"] for r in base], axis=1)
        c = pd.concat([r.eval.set_index("step")["val_loss"] for r in cand], axis=1)
        c.columns = b.columns = seeds
        for df, name, ls in ((b, baseline, "-"), (c, candidate, "--")):
            x = df.index.values
            row[0].plot(x, df.mean(axis=1), color=style.color(baseline), ls=ls,
                        label=f"{name} (mean of {len(seeds)} seeds)")
            if len(seeds) > 1:
                row[0].fill_between(x, df.min(axis=1), df.max(axis=1), color=style.color(baseline),
                                    alpha=0.15 if ls == "-" else 0.3, lw=0)
        diff = (c - b).dropna()
        spread = (b.max(axis=1) - b.min(axis=1)).reindex(diff.index)
        row[1].fill_between(diff.index.values, -spread, spread, color="#bbbbbb", alpha=0.5, lw=0,
                            label="± baseline seed spread")
        for s in seeds:
            row[1].plot(diff.index.values, diff[s], lw=0.7, label=f"seed {s}")
        row[1].axhline(0.0, color="k", lw=0.5)
        row[0].set(title=f"{style.label(baseline)}: paper's solver (solid) vs cheaper solver (dashed)",
                   xlabel="step", ylabel="val loss (nats)")
        row[1].set(title=f"{candidate} - {baseline}, per seed", xlabel="step", ylabel="difference (nats)")
        # the late part is what the verdict reads: zoom the loss panel to its second half
        late = b.index.values >= b.index.values.max() / 2
        vals = np.concatenate([b.values[late].ravel(), c.reindex(b.index).values[late].ravel()])
        vals = vals[np.isfinite(vals)]
        if len(vals):
            ins = row[0].inset_axes([0.5, 0.45, 0.47, 0.5])
            for frame, ls in ((b, "-"), (c, "--")):
                sel = frame.index.values >= frame.index.values.max() / 2
                ins.plot(frame.index.values[sel], frame.mean(axis=1).values[sel], color=style.color(baseline), ls=ls)
            pad = 0.05 * (vals.max() - vals.min() + 1e-6)
            ins.set_ylim(vals.min() - pad, vals.max() + pad)
            ins.tick_params(labelsize=5)
        row[0].legend(loc="lower left")
        row[1].legend(loc="upper right", ncol=2)
    style.save(fig, out, "fig_solver_training")


def solver_training_report(cfg: dict, runs, studies: dict, out: Path) -> pd.DataFrame | None:
    """The figure and table of ``grid.solver_comparison`` (None when the config has none)."""
    comparisons = cfg["grid"]["solver_comparison"]
    if not comparisons:
        return None
    style.apply()
    rows = []
    for candidate, baseline in comparisons.items():
        seeds, base, cand = _paired(runs, baseline, candidate)
        fb, fc = [_final(r) for r in base], [_final(r) for r in cand]
        statuses = [r.summary["status"] for r in base + cand]
        v, diff, spread = verdict(fb, fc, statuses)
        tb = np.mean([r.summary["mean_step_time"] for r in base]) if base else float("nan")
        tc = np.mean([r.summary["mean_step_time"] for r in cand]) if cand else float("nan")
        rows.append({
            "candidate": candidate, "baseline": baseline,
            "candidate solver": _solver_text(cfg, candidate), "baseline solver": _solver_text(cfg, baseline),
            "study's fastest match": _study_pick(studies), "seeds": len(seeds),
            "baseline final val": float(np.mean(fb)) if fb else None,
            "candidate final val": float(np.mean(fc)) if fc else None,
            "mean paired diff": diff,
            "paired diff range": f"{min(np.subtract(fc, fb)):+.4f} .. {max(np.subtract(fc, fb)):+.4f}" if fb else "",
            "baseline seed spread": spread, "verdict": v,
            "step time ratio": float(tc / tb) if base and cand else None,
        })
    df = pd.DataFrame(rows)
    write_table(df, out, "table_solver_training",
                f"Training with a cheaper inner solver: final validation loss paired by seed; equal within seed "
                f"noise when |mean difference| <= the baseline's seed range (>= {MIN_SEEDS} seeds)")
    _figure(runs, out, comparisons)
    return df
