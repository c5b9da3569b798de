"""The mechanism experiment's report (``workflow.report: mechanism``, ``config/mechanism.yaml``).

Softmax saturation or the inner solve? Compute first, then draw: :func:`mechanism_results` gives one
row per run with the per-run failure rule of :mod:`mwm.paper` applied (``failed``: the run did not
complete, or ends more than ``paper.FAIL_MARGIN`` above the worse Stiefel-attention reference at its
rate and seed); :func:`contrasts` counts, per kind of intervention, the cells (baseline, rate, seed)
where the plain arm failed and those its twin restored; :func:`mechanism_ledger_values` hands them to
the ``mech.*`` rules. The figures and tables only read those.

- ``mechanism_runs.csv``: every run, its reference loss and whether it failed
- ``table_mechanism``: per arm and rate, each seed's final loss (F: failed) and the failed count
- ``table_mechanism_contrasts``: per intervention, the failed cells of its baseline and those it restored
- ``fig_mechanism_loss``: final val loss per arm and rate, one dot per seed, with each seed's threshold
- ``fig_mechanism_chain``: for a failed plain run of each baseline at the largest rate, the chain (attention
  sigma_max against the growth bound, max logit range, entropy, softmax-Jacobian norm, the attention
  solves' alignment beside a converged solve's) beside its normalized and capped twins and All Stiefel
- ``fig_solver_quality``: every arm's solve quality against sigma_max (:mod:`mwm.report.solver_quality`)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mwm import paper
from mwm.plan.runs import run_config
from mwm.plan.variants import arm_kind, intervention_label, rate_label, sweep_points, sweep_variant
from mwm.report.scale import capabilities
from mwm.report.tables import write_table

__all__ = ["KINDS", "ROWS", "intervention_kind", "mechanism_results", "contrasts", "mechanism_ledger_values",
           "mechanism_report"]

#: The kind of intervention each train setting makes (:func:`mwm.plan.variants.arm_kind`): an arm changes one
#: thing, and the normalized solve is on every matrix.
KINDS = {("attn_sigma_cap", None): "cap", ("solver_normalize", "all"): "normalized",
         ("mlp_sigma_cap", None): "mlp_control"}
#: Each kind's ledger row.
ROWS = {"cap": "mech.cap_restores", "normalized": "mech.normalized_restores", "mlp_control": "mech.mlp_cap_control"}
STABLE = "completed"


def intervention_kind(grid: dict, cand: str) -> str | None:
    """``cap``, ``normalized`` or ``mlp_control`` for an intervention arm that changes one thing (the normalized
    solve on every matrix), else None (a combination, or a normalized solve of one module only)."""
    return arm_kind(grid, cand, KINDS)


def mechanism_results(cfg: dict, runs, margin: float = paper.FAIL_MARGIN) -> pd.DataFrame:
    """One row per run: arm (the grid's assignment), baseline (its intervention's, or itself), kind, rate,
    seed, status, final val loss, the reference loss (the worse completed Stiefel-attention reference at
    the same rate and seed; NaN without one) and ``failed`` (True / False; None without a reference):
    not completed, or above the reference by more than ``margin`` nats (the rule's is paper.FAIL_MARGIN)."""
    grid = cfg["grid"]
    rows = []
    for variant, (arm, rate) in sweep_points(grid).items():
        for seed in grid["seeds"]:
            r = runs[variant, seed]
            ok = r.summary["status"] == STABLE
            rows.append({"arm": arm, "baseline": grid["intervention"].get(arm, arm),
                         "kind": intervention_kind(grid, arm) if arm in grid["intervention"] else None,
                         "rate": rate, "seed": seed, "variant": variant, "status": r.summary["status"],
                         "final_val_loss": float(r.eval["val_loss"].iloc[-1]) if len(r.eval) else np.nan,
                         "completed": ok})
    res = pd.DataFrame(rows)
    refs = [a for a in paper.STIEFEL_ATTENTION if a in set(res.arm)]
    ref_loss = (res[res.arm.isin(refs) & res.completed].groupby(["rate", "seed"]).final_val_loss.max())
    res["reference_loss"] = [ref_loss.get((r, s), np.nan) for r, s in zip(res.rate, res.seed)]

    def failed(row):
        if not row.completed:
            return True
        if np.isnan(row.reference_loss):
            return None
        return bool(row.final_val_loss > row.reference_loss + margin)

    res["failed"] = [failed(r) for r in res.itertuples()]
    return res


def contrasts(cfg: dict, res: pd.DataFrame) -> dict[str, dict]:
    """Per kind (:data:`KINDS`): ``{"restored", "failed", "cells"}`` pooled over the candidates of that kind:
    the (baseline, rate, seed) cells where the plain baseline failed and its twin has a verdict, and those
    where the twin did not fail. Kinds without a candidate are absent."""
    by = res.set_index(["arm", "rate", "seed"])
    out: dict[str, dict] = {}
    for cand, base in cfg["grid"]["intervention"].items():
        kind = intervention_kind(cfg["grid"], cand)
        if kind is None:
            continue
        acc = out.setdefault(kind, {"restored": 0, "failed": 0, "cells": [], "candidates": []})
        acc["candidates"].append(cand)
        plain = res[(res.arm == base) & (res.failed == True)]  # noqa: E712 (None is no verdict)
        for row in plain.itertuples():
            twin = by.loc[(cand, row.rate, row.seed), "failed"]
            if twin is None:
                continue
            acc["failed"] += 1
            acc["restored"] += int(not bool(twin))
            acc["cells"].append((base, row.rate, row.seed, not bool(twin)))
    return out


def _outcome(verdict: str) -> bool | None:
    return True if verdict == "reproduced" else False if verdict == "not reproduced" else None


def mechanism_ledger_values(cfg: dict, res: pd.DataFrame) -> dict:
    """The rebuilt value of each ``mech.*`` claim: ``{id: (x, rebuilt, reason)}``. Nothing here chooses a
    verdict; :func:`mwm.paper.judge` does, the same way for every row (``mech.cause`` reads the three
    contrasts' verdicts under their own rules)."""
    out = {}
    top = float(res.rate.max())
    plain = res[res.arm.isin(paper.DGRAM_ATTENTION) & (res.rate == top) & res.failed.notna()]
    if len(plain):
        k = int(plain.failed.astype(bool).sum())
        out["mech.fails"] = (k / len(plain), f"{k} of {len(plain)} runs failed at eta {rate_label(top)} "
                             "(" + ", ".join(f"{a} {int(g.failed.astype(bool).sum())}/{len(g)}"
                                             for a, g in plain.groupby("arm")) + ")", "")
    else:
        out["mech.fails"] = (None, "--", f"no All DGram or Hetero-inv run with a reference at eta {rate_label(top)}")
    con = contrasts(cfg, res)
    caps, seeds = capabilities(cfg), len(cfg["grid"]["seeds"])
    outcome = {}
    for (key, _), kind in KINDS.items():
        cid = ROWS[kind]
        c = con.get(kind)
        if c is None:
            out[cid] = (None, "--", f"no intervention arm setting only {key} in grid.intervention")
            outcome[kind] = None
            continue
        x = (c["restored"], c["failed"])
        out[cid] = (x, f"{c['restored']} of {c['failed']} failed cells restored ({', '.join(c['candidates'])})", "")
        outcome[kind] = _outcome(paper.judge(paper.claim(cid), x, caps=caps, seeds=seeds)[0])
    out["mech.cause"] = (outcome, "; ".join(f"{kind}: {'--' if v is None else 'as claimed' if v else 'against'}"
                                            for kind, v in outcome.items()), "")
    return out


# -------------------------------------------------------------------------------------------- tables, figures
def mechanism_tables(cfg: dict, res: pd.DataFrame, out: Path) -> None:
    from mwm.io import atomic_write_text

    atomic_write_text(out / "mechanism_runs.csv", res.to_csv(index=False))
    rows = []
    for (arm, rate), g in res.groupby(["arm", "rate"], sort=False):
        row = {"arm": arm, "changes": intervention_label(cfg["grid"], arm) or "--", "eta": rate_label(rate)}
        for r in g.sort_values("seed").itertuples():
            cell = "--" if np.isnan(r.final_val_loss) else f"{r.final_val_loss:.3f}"
            row[f"seed {r.seed}"] = cell + (" F" if r.failed is True else "" if r.failed is False else " ?")
        row["failed"] = f"{int((g.failed == True).sum())}/{len(g)}"  # noqa: E712
        rows.append(row)
    write_table(pd.DataFrame(rows), out, "table_mechanism",
                f"Every arm at every step size: each seed's final validation loss, F where the run failed to train "
                f"(not completed, or above the worse of All Stiefel / Hetero at its rate and seed by more than "
                f"{paper.FAIL_MARGIN:g} nats; ? without a reference)")
    con = contrasts(cfg, res)
    crow = []
    for cand, base in cfg["grid"]["intervention"].items():
        kind = intervention_kind(cfg["grid"], cand)
        cells = [c for c in (con.get(kind) or {}).get("cells", []) if c[0] == base] if kind else []
        crow.append({"intervention": cand, "baseline": base, "changes": intervention_label(cfg["grid"], cand),
                     "ledger row": ROWS[kind] if kind else "--",
                     "failed cells of the baseline": len(cells), "restored": sum(c[3] for c in cells),
                     "cells (eta, seed: restored?)": ", ".join(f"{rate_label(c[1])}/{c[2]}: {'yes' if c[3] else 'no'}"
                                                                for c in cells) or "--"})
    write_table(pd.DataFrame(crow), out, "table_mechanism_contrasts",
                "Each intervention against its baseline: the (rate, seed) cells where the plain baseline failed, and "
                "those where the intervention trained (the mech.* ledger rows pool them per kind)")


def _round1_kind(grid: dict, arm: str) -> str | None:
    return intervention_kind(grid, arm) if arm in grid["intervention"] else None


#: Markers of fig_mechanism_loss per kind of arm (None: a plain arm).
LOSS_MARKERS = {None: "o", "cap": "^", "normalized": "s", "mlp_control": "v"}


def fig_mechanism_loss(cfg: dict, res: pd.DataFrame, out: Path, kind_of=_round1_kind, markers=LOSS_MARKERS,
                       name: str = "fig_mechanism_loss", title: str | None = None) -> None:
    """Every seed's final loss per arm and rate, circled where it failed, with the seeds' failure thresholds;
    ``kind_of(grid, arm)`` picks each arm's marker from ``markers``; where ``res`` has a ``check`` column, a red
    x marks the runs whose manipulation check failed."""
    import matplotlib.pyplot as plt

    from mwm.report import style

    rates = sorted(res.rate.unique())
    arms = list(dict.fromkeys(res.arm))
    fig, axes = plt.subplots(1, len(rates), figsize=(style.FULL, 2.8), sharey=True, squeeze=False)
    for ax, rate in zip(axes[0], rates):
        d = res[res.rate == rate]
        for i, arm in enumerate(arms):
            g = d[d.arm == arm]
            base = cfg["grid"]["intervention"].get(arm, arm)
            y = g.final_val_loss.values.astype(float)
            x = i + np.linspace(-0.2, 0.2, len(g)) if len(g) > 1 else np.full(len(g), float(i))
            ax.scatter(x, y, s=9, color=style.color(base), marker=markers.get(kind_of(cfg["grid"], arm), "D"),
                       linewidths=0.8)
            bad = (g.failed == True).values  # noqa: E712
            ax.scatter(x[bad], y[bad], s=30, facecolors="none", edgecolors="k", linewidths=0.6)
            if "check" in g:
                unchecked = (g.check == False).values  # noqa: E712
                ax.scatter(x[unchecked], y[unchecked], s=22, marker="x", color="r", linewidths=0.6)
        thr = d.drop_duplicates("seed").reference_loss + paper.FAIL_MARGIN
        if thr.notna().any():
            ax.axhspan(thr.min(), thr.max(), color="grey", alpha=0.2, lw=0)
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=60, ha="right", fontsize=5)
        ax.set_title(rf"$\eta$ = {rate_label(rate)}")
    axes[0][0].set_ylabel("final val loss (circled: failed)")
    fig.suptitle(title or ("Each seed of each arm; grey band: the failure thresholds of the seeds (worse "
                           f"Stiefel-attention reference + {paper.FAIL_MARGIN:g})"))
    style.save(fig, out, name)


def _chain_cases(cfg: dict, res: pd.DataFrame) -> list[tuple[str, float, int, bool]]:
    """(baseline, rate, seed, failed) per DGram-attention baseline: its first failed run at the largest rate
    (else its first seed there)."""
    top = float(res.rate.max())
    out = []
    for base in paper.DGRAM_ATTENTION:
        d = res[(res.arm == base) & (res.rate == top)].sort_values("seed")
        if d.empty:
            continue
        bad = d[d.failed == True]  # noqa: E712
        row = (bad if len(bad) else d).iloc[0]
        out.append((base, top, int(row.seed), bool(len(bad))))
    return out


def _chain_twins(cfg: dict, base: str) -> list[tuple[str, str]]:
    """(candidate, line style) of the normalized and capped twins of ``base``."""
    styles = {"normalized": "--", "cap": ":"}
    return [(c, styles[k]) for c, b in cfg["grid"]["intervention"].items()
            if b == base and (k := intervention_kind(cfg["grid"], c)) in styles]


def fig_mechanism_chain(cfg: dict, res: pd.DataFrame, runs, out: Path, twins=_chain_twins,
                        name: str = "fig_mechanism_chain") -> None:
    """The chain of each baseline's case (:func:`_chain_cases`) beside ``twins(cfg, base)``: (candidate, line
    style) pairs, and All Stiefel."""
    import matplotlib.pyplot as plt

    from mwm.report import style
    from mwm.report.sweep import chain_series
    from mwm.report.training import growth_bound

    cases = _chain_cases(cfg, res)
    panels = (("sigma", r"attention $\sigma_{\max}$"), ("logit_range_max", "max logit range"),
              ("entropy_mean", "attention entropy"), ("jac_fro_mean", r"softmax-Jacobian $\|J\|_F$"),
              ("alignment", "solve alignment"))
    fig, axes = plt.subplots(max(len(cases), 1), len(panels), figsize=(style.FULL, 1.9 * max(len(cases), 1)),
                             squeeze=False)
    if not cases:
        axes[0, 0].text(0.02, 0.5, "no All DGram or Hetero-inv run in this config", transform=axes[0, 0].transAxes)
        for ax in axes.ravel():
            ax.axis("off")
    for row, (base, rate, seed, failed) in zip(axes, cases):
        shown = [(base, "-")] + twins(cfg, base) + ([("stiefel", "-")] if "stiefel" in set(res.arm) else [])
        for arm, ls in shown:
            series = chain_series(runs[sweep_variant(arm, rate), seed])
            sig = series["sigma"]
            col = "grey" if arm == "stiefel" else style.color(base)
            lab = style.label(arm) if arm in (base, "stiefel") else intervention_label(cfg["grid"], arm)
            for ax, (key, _) in zip(row, panels):
                y = series[key]
                ax.plot(y.index, y.values, color=col, ls=ls, label=lab)
            if arm == base:
                c = series["alignment_converged"]
                if len(c):
                    row[-1].plot(c.index, c.values, color="k", lw=0.6, label="converged solve (plain run)")
                steps = sig.index.values
                tc = run_config(cfg, sweep_variant(arm, rate))["train"]
                row[0].plot(steps, growth_bound(tc, float(sig.iloc[0]), steps), color="k", ls="-.", lw=0.7,
                            label=r"bound $\sigma_0 + \sum \eta_s$")
        for ax, (key, title) in zip(row, panels):
            ax.set(title=title, xlabel="step")
        row[0].set_ylabel(f"{style.label(base)}, eta {rate_label(rate)}, seed {seed}" + ("" if failed else
                                                                                      " (none failed)"))
        row[0].set_yscale("log")
        row[1].set_yscale("log")
        row[0].legend(fontsize=4.5)
        row[-1].legend(fontsize=4.5)
    style.save(fig, out, name)


def mechanism_report(cfg: dict, runs, out: Path) -> pd.DataFrame:
    """Every product of the mechanism report in ``out``; returns the per-run results."""
    from mwm.report import style
    from mwm.report.solver_quality import fig_solver_quality, solver_quality

    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    res = mechanism_results(cfg, runs)
    mechanism_tables(cfg, res, out)
    fig_mechanism_loss(cfg, res, out)
    fig_mechanism_chain(cfg, res, runs, out)
    points = sweep_points(cfg["grid"])
    arms = list(cfg["grid"]["assignments"])
    fig_solver_quality(solver_quality(runs, group=lambda v: points[v][0]), out,
                       title="Inner-solve quality per arm (every rate and seed): the update (solid) and a converged "
                             "solve (dashed)",
                       color=lambda arm: f"C{arms.index(arm) % 10}",
                       label=lambda arm: (style.label(arm) if arm not in cfg["grid"]["intervention"]
                                          else f"{arm} ({intervention_label(cfg['grid'], arm)})"))
    return res
