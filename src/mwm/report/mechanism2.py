"""The per-baseline mechanism experiment's report, one per pre-registered round (``workflow.report:
mechanism2`` for ``config/mechanism2.yaml``, ``mechanism3`` for ``config/mechanism3.yaml``; the round's
arms, rates and checks are its experiment's ``round``, :data:`mwm.paper.ROUNDS`, its rows ``<prefix>.*``).

Softmax saturation or the inner solve, asked of each DGram-attention baseline on its own
(:data:`mwm.paper.MECH2_BASELINES`). Compute first, then draw: :func:`mechanism2_results` gives one row
per run with the per-run failure rule (:func:`mwm.report.mechanism.mechanism_results`) and both
manipulation checks recomputed from the run's logs (:mod:`mwm.train.manipulation`, the same function
the run wrote into its ``summary.json``); :func:`mechanism2_contrasts` turns the paired (rate, seed)
cells of each (baseline, kind of intervention) into :func:`mwm.paper.mech2_contrast`, whose cells
count as tested only where the twin's own check passed; :func:`mechanism2_ledger_values` hands them to
the round's rules. The tables and figures only read those. Files are named after the report
(``<report>`` below: ``mechanism2`` or ``mechanism3``):

- ``<report>_runs.csv``: every run, its reference loss, whether it failed, both checks (the solver check pooled
  and per module kind)
- ``table_<report>``: per arm and rate, each seed's final loss (F: failed; x: its check failed)
- ``table_<report>_contrasts``: per baseline and kind, the counts, interval, p-values and outcome
- ``table_<report>_margins``: the same outcomes under failure margins of 0.3, 0.5 (the rule's) and 1.0
- ``fig_<report>_loss``: final val loss per arm and rate, one dot per seed, failed circled, check failed crossed
- ``fig_<report>_chain``: the chain of a failed plain run of each baseline beside its fixed-solve and
  unit-q/k twins and All Stiefel
- ``fig_<report>_checks``: the manipulation checks along training per arm (per module kind where the round
  checks them apart), with their thresholds
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mwm import paper
from mwm.experiments import MechRound
from mwm.report.mechanism import fig_mechanism_chain, fig_mechanism_loss, mechanism_results
from mwm.report.tables import write_table
from mwm.train import manipulation
from mwm.plan.runs import run_config
from mwm.plan import variants
from mwm.plan.variants import intervention_label, rate_label, sweep_points

__all__ = ["KINDS", "CHECK_OF", "round_of", "arm_kind", "mechanism2_results", "mechanism2_contrasts",
           "mechanism2_decisions", "mechanism2_ledger_values", "mechanism2_report"]

#: The kind of intervention (:attr:`mwm.experiments.MechRound.kinds`) each train setting makes: (key, value);
#: value None matches any value of that key. An arm's settings must all make one kind: a solver arm may
#: change the solver, its penalty and its iterations together with the normalization.
KINDS = {("solver_normalize", "all"): "solver", ("solver_normalize", "attn"): "solver_attn",
         ("attn_qk_scale", None): "saturation", ("solver", "admm"): "solver", ("admm_rho", None): "solver",
         ("dual_ascent_steps", None): "solver"}
#: The manipulation check (a key of ``manipulation.run_checks``) that shows each kind took hold.
CHECK_OF = {"solver": "solver", "solver_attn": "solver", "saturation": "saturation"}
STABLE = "completed"


def round_of(cfg: dict) -> MechRound:
    """The round this config's report rebuilds (``workflow.report``)."""
    return paper.ROUNDS[cfg["workflow"]["report"]]


def arm_kind(grid: dict, arm: str) -> str | None:
    """The kind of an intervention arm whose settings all make one kind (:data:`KINDS`), else None
    (:func:`mwm.plan.variants.arm_kind`)."""
    return variants.arm_kind(grid, arm, KINDS)


def _records(df: pd.DataFrame) -> list[dict]:
    return df.to_dict("records") if len(df) else []


def mechanism2_results(cfg: dict, runs, margin: float = paper.FAIL_MARGIN) -> pd.DataFrame:
    """:func:`mechanism_results` (``margin``: the failure rule's, paper.FAIL_MARGIN unless a sensitivity
    row asks otherwise) with ``kind`` (:func:`arm_kind`), both checks of every run (``solver_check`` pooled,
    ``solver_check_kinds`` in attention and the MLP apart, ``saturation_check``: True / False / None for unknown,
    with ``alignment_share_min`` and ``entropy_min``) and ``check``: the one its kind claims in this round (the
    per-kind solver check where the round asks for it; None for a plain arm)."""
    grid = cfg["grid"]
    res = mechanism_results(cfg, runs, margin)
    kinds = [arm_kind(grid, a) for a in res.arm]
    res["kind"] = pd.Series(kinds, index=res.index, dtype=object)
    per_kind = round_of(cfg).per_kind_check
    cols = {k: [] for k in ("solver_check", "solver_check_kinds", "saturation_check", "alignment_share_min",
                            "violation_max", "entropy_min")}
    for row in res.itertuples():
        r = runs[row.variant, row.seed]
        got = manipulation.run_checks(run_config(cfg, row.variant)["train"], _records(r.solver),
                                      _records(r.attention))
        cols["solver_check"].append(got["solver"]["passed"])
        apart = [k["passed"] for k in got["solver"]["per_kind"].values()]
        cols["solver_check_kinds"].append(None if not apart or None in apart else all(apart))
        cols["saturation_check"].append(got["saturation"]["passed"])
        cols["alignment_share_min"].append(got["solver"]["alignment_share_min"])
        cols["violation_max"].append(got["solver"]["violation_max"])
        cols["entropy_min"].append(got["saturation"]["entropy_min"])
    for k, v in cols.items():
        res[k] = pd.Series(v, index=res.index, dtype=object)
    check = {k: f"{c}_check_kinds" if c == "solver" and per_kind else f"{c}_check" for k, c in CHECK_OF.items()}
    res["check"] = pd.Series([None if k is None else getattr(r, check[k]) for k, r in zip(kinds, res.itertuples())],
                             index=res.index, dtype=object)
    return res


def _verdict(x) -> bool | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else bool(x)


def mechanism2_contrasts(cfg: dict, res: pd.DataFrame) -> dict[tuple[str, str], dict]:
    """``{(baseline, kind): mwm.paper.mech2_contrast(cells)}`` for every intervention arm with a kind, its
    cells the (rate, seed) pairs of the config's sweep: (plain failed, twin failed, twin's check). Two arms
    of one (baseline, kind) are refused: each contrast is one arm against its baseline."""
    by = res.set_index(["arm", "rate", "seed"])
    out: dict[tuple[str, str], dict] = {}
    for cand, base in cfg["grid"]["intervention"].items():
        kind = arm_kind(cfg["grid"], cand)
        if kind is None:
            continue
        if (base, kind) in out:
            raise ValueError(f"grid.intervention: two {kind} arms of {base}; "
                             "a contrast is one arm against its baseline")
        cells = []
        for row in res[res.arm == base].itertuples():
            twin = by.loc[(cand, row.rate, row.seed)]
            cells.append((_verdict(row.failed), _verdict(twin["failed"]), _verdict(twin["check"])))
        out[base, kind] = paper.mech2_contrast(cells)
    return out


def _filled(cfg: dict, con: dict) -> dict:
    """The contrasts with every primary one present: an absent arm stands as a contrast of no cells (status
    "nothing to restore"), which never enters Holm's family; its ledger rows say the arm is absent."""
    full = dict(con)
    for b in paper.MECH2_BASELINES:
        for k in round_of(cfg).primary:
            full.setdefault((b, k), paper.mech2_contrast([]))
    return full


def mechanism2_decisions(cfg: dict, res: pd.DataFrame) -> dict[str, dict]:
    """:func:`mwm.paper.mech_values` of this config's contrasts (absent primary arms filled empty)."""
    return paper.mech_values(round_of(cfg), _filled(cfg, mechanism2_contrasts(cfg, res)))


def _present(cfg: dict) -> set[tuple[str, str]]:
    grid = cfg["grid"]
    return {(b, k) for c, b in grid["intervention"].items() if (k := arm_kind(grid, c))}


def mechanism2_ledger_values(cfg: dict, res: pd.DataFrame) -> dict:
    """The rebuilt value of each of the round's claims (``<prefix>.*``): ``{id: (x, rebuilt, reason)}``. Nothing
    here chooses a verdict; :func:`mwm.paper.judge` does, the same way for every row."""
    rnd = round_of(cfg)
    p = rnd.prefix
    rates = sorted(res.rate.unique())
    top = float(max(rates))
    at = "rates " + ", ".join(rate_label(r) for r in rates)
    if tuple(float(r) for r in rates) != tuple(float(r) for r in rnd.rates):
        at += f" (the rule's are {', '.join(f'{r:g}' for r in rnd.rates)})"
    present, arms = _present(cfg), set(res.arm)
    values = mechanism2_decisions(cfg, res)
    out = {}
    for b in paper.MECH2_BASELINES:
        plain = res[(res.arm == b) & (res.rate == top) & res.failed.notna()]
        if b not in arms:
            out[f"{p}.fails.{b}"] = (None, "--", f"no {b} arm in grid.assignments")
        elif not len(plain):
            out[f"{p}.fails.{b}"] = (None, "--", f"no {b} run with a reference at eta {rate_label(top)}")
        else:
            k = int(plain.failed.astype(bool).sum())
            out[f"{p}.fails.{b}"] = ((k, len(plain)), f"{k} of {len(plain)} runs failed at eta {rate_label(top)}", "")
        for kind in rnd.kinds:
            cid = f"{p}.{kind}_restores.{b}"
            if (b, kind) not in present:
                out[cid] = (None, "--", f"no {kind} arm of {b} in grid.intervention")
                continue
            x = values[cid]
            out[cid] = (x, f"{x['restored']} of {x['tested']} tested failed cells trained ({x['failed']} failed, "
                           f"{x['untested']} untested; harm {x['harm']}/{x['harm_of']}; {at})", "")
        cause = values[f"{p}.cause.{b}"]
        if not all((b, k) in present for k in ("saturation", "solver")):
            out[f"{p}.cause.{b}"] = (None, "--", f"needs both the saturation and the solver arm of {b}")
        else:
            out[f"{p}.cause.{b}"] = (cause, "; ".join(f"{k}: {v}" for k, v in cause.items()), "")
    return out


# -------------------------------------------------------------------------------------------- tables, figures
def _cell(r) -> str:
    cell = "--" if np.isnan(r.final_val_loss) else f"{r.final_val_loss:.3f}"
    cell += " F" if r.failed is True else "" if r.failed is False else " ?"
    return cell + (" x" if r.check is False else " ?c" if r.kind is not None and r.check is None else "")


def _ci(x: dict) -> str:
    return "--" if x["ci"] is None else f"[{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]"


def _p(v) -> str:
    return "--" if v is None else f"{v:.3g}"


def contrast_rows(cfg: dict, res: pd.DataFrame, margin: float) -> list[dict]:
    """One row per present (baseline, kind): the contrast's counts, interval, p-values and outcome."""
    values, rnd = mechanism2_decisions(cfg, res), round_of(cfg)
    rows = []
    for b in paper.MECH2_BASELINES:
        for kind in rnd.kinds:
            if (b, kind) not in _present(cfg):
                continue
            x = values[f"{rnd.prefix}.{kind}_restores.{b}"]
            rows.append({"margin": f"{margin:g}", "baseline": b, "kind": kind,
                         "family": "primary" if kind in rnd.primary else "secondary",
                         "failed cells": x["failed"], "tested": x["tested"], "restored": x["restored"],
                         "untested": x["untested"], "95% CP": _ci(x), "p": _p(x["p"]), "p (Holm)": _p(x["p_holm"]),
                         "harm": f"{x['harm']}/{x['harm_of']}", "outcome": paper.mech2_outcome(x)})
    return rows


def mechanism2_tables(cfg: dict, runs, res: pd.DataFrame, out: Path) -> None:
    from mwm.io import atomic_write_text

    name = cfg["workflow"]["report"]
    atomic_write_text(out / f"{name}_runs.csv", res.to_csv(index=False))
    rows = []
    for (arm, rate), g in res.groupby(["arm", "rate"], sort=False):
        row = {"arm": arm, "changes": intervention_label(cfg["grid"], arm) or "--", "eta": rate_label(rate)}
        for r in g.sort_values("seed").itertuples():
            row[f"seed {r.seed}"] = _cell(r)
        row["failed"] = f"{int((g.failed == True).sum())}/{len(g)}"  # noqa: E712
        row["check held"] = "--" if g.kind.iloc[0] is None else f"{int((g.check == True).sum())}/{len(g)}"  # noqa: E712
        rows.append(row)
    write_table(pd.DataFrame(rows), out, f"table_{name}",
                "Every arm at every step size: each seed's final validation loss, F where the run failed to train "
                f"(not completed, or above the worse of All Stiefel / Hetero at its rate and seed by more than "
                f"{paper.FAIL_MARGIN:g} nats; ? without a reference), x where the intervention's manipulation check "
                "failed (that cell is not tested)")
    write_table(pd.DataFrame(contrast_rows(cfg, res, paper.FAIL_MARGIN)), out, f"table_{name}_contrasts",
                "Each intervention against its own baseline over the paired (rate, seed) cells: the plain arm's "
                "failed cells, those tested (the twin's check held), those restored, the 95% Clopper-Pearson "
                "interval of the restored share, its exact binomial p against 0.5 (Holm over the tested primary "
                "contrasts), harm (the twin failed where the plain arm trained) and the outcome")
    rows = []
    for m in paper.FAIL_MARGINS_SENSITIVITY:
        r = res if m == paper.FAIL_MARGIN else mechanism2_results(cfg, runs, m)
        rows += contrast_rows(cfg, r, m)
    write_table(pd.DataFrame(rows), out, f"table_{name}_margins",
                f"The contrasts under other failure margins (nats above the worse reference): the rule's is "
                f"{paper.FAIL_MARGIN:g}; {', '.join(f'{m:g}' for m in paper.FAIL_MARGINS_SENSITIVITY)} show how "
                "much the outcome leans on it. Only the rule's margin gives ledger verdicts")


def fig_mechanism2_loss(cfg: dict, res: pd.DataFrame, out: Path) -> None:
    fig_mechanism_loss(cfg, res, out, kind_of=arm_kind,
                       markers={None: "o", "solver": "s", "solver_attn": "D", "saturation": "^"},
                       name=f"fig_{cfg['workflow']['report']}_loss",
                       title="Each seed of each arm; red x: its manipulation check failed; grey: the failure "
                             f"thresholds (reference + {paper.FAIL_MARGIN:g})")


def _twins(cfg: dict, base: str) -> list[tuple[str, str]]:
    styles = {"solver": "--", "saturation": ":"}
    return [(c, styles[k]) for c, b in cfg["grid"]["intervention"].items()
            if b == base and (k := arm_kind(cfg["grid"], c)) in styles]


def _shares(sol: pd.DataFrame, suffix: str = "") -> pd.DataFrame:
    cols = [f"alignment_share{suffix}", f"violation{suffix}"]
    if not len(sol):
        return pd.DataFrame(columns=cols)
    q = sol.groupby("step").agg(a=("alignment", "median"), c=("alignment_converged", "median"),
                                v=("violation", "median"))
    return pd.DataFrame({cols[0]: np.where(q.c > 0, q.a / q.c.where(q.c > 0), np.nan), cols[1]: q.v}, index=q.index)


def check_series(cfg: dict, runs) -> pd.DataFrame:
    """Per run and evaluation: the solver check's alignment share and violation (medians over the checked
    modules' matrices; per module kind too, ``_attn`` and ``_mlp``, where the round checks them apart) and the
    lowest layer's mean attention entropy, with arm, rate and seed."""
    parts = []
    per_kind = round_of(cfg).per_kind_check
    for variant, (arm, rate) in sweep_points(cfg["grid"]).items():
        mods = manipulation.checked_modules(run_config(cfg, variant)["train"])
        for seed in cfg["grid"]["seeds"]:
            r = runs[variant, seed]
            sol = r.solver[r.solver.module.isin(mods)] if len(r.solver) else r.solver
            q = _shares(sol)
            if per_kind:
                for m in ("attn", "mlp"):
                    q = q.join(_shares(sol[sol.module == m] if len(sol) else sol, f"_{m}"), how="outer")
            ent = (r.attention.groupby(["step", "layer"]).entropy_mean.mean().groupby("step").min()
                   if len(r.attention) else pd.Series(dtype=float))
            d = q.join(ent.rename("entropy_min"), how="outer").reset_index().rename(columns={"index": "step"})
            parts.append(d.assign(arm=arm, rate=rate, seed=seed))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def fig_mechanism2_checks(cfg: dict, runs, out: Path) -> None:
    """Per arm (median over seeds, both rates pooled) the three checked quantities along training, with the
    thresholds and the step the checks start from."""
    import matplotlib.pyplot as plt

    from mwm.report import style

    df = check_series(cfg, runs)
    kinds = (("_attn", ", attention"), ("_mlp", ", MLP")) if round_of(cfg).per_kind_check else (("", ""),)
    panels = tuple((f"alignment_share{k}", f"solve alignment / converged{t}", manipulation.ALIGNMENT_SHARE, "min")
                   for k, t in kinds) + tuple((f"violation{k}", f"tangent violation{t}", manipulation.VIOLATION_MAX,
                                               "max") for k, t in kinds) + (
        ("entropy_min", "lowest layer entropy (nats)", manipulation.ENTROPY_MIN, "min"),)
    fig, axes = plt.subplots(1, len(panels), figsize=(style.FULL * max(1.0, len(panels) / 3), 2.6), squeeze=False)
    arms = list(cfg["grid"]["assignments"])
    for ax, (key, title, thr, side) in zip(axes[0], panels):
        if len(df) and df[key].notna().any():
            for arm, g in df.groupby("arm", sort=False):
                m = g.groupby("step")[key].median().dropna()
                kind = arm_kind(cfg["grid"], arm)
                ls = {"solver": "--", "solver_attn": "-.", "saturation": ":"}.get(kind, "-")
                ax.plot(m.index, m.values, color=f"C{arms.index(arm) % 10}", ls=ls, marker="o", ms=2,
                        label=arm if kind is None else f"{arm} ({intervention_label(cfg['grid'], arm)})")
        ax.axhline(thr, color="k", lw=0.8, ls="--")
        ax.axvspan(0, manipulation.FROM_STEP, color="grey", alpha=0.15, lw=0)
        ax.set(title=f"{title}: passes at {'>=' if side == 'min' else '<='} {thr:g}", xlabel="step")
        if not key.startswith("alignment_share"):
            ax.set_yscale("log")
    fig.suptitle(f"Manipulation checks along training (median over seeds; grey: before step {manipulation.FROM_STEP}, "
                 "not checked)")
    style.legend_below(fig, axes[0][0], ncol=3)
    style.save(fig, out, f"fig_{cfg['workflow']['report']}_checks")


def mechanism2_report(cfg: dict, runs, out: Path) -> pd.DataFrame:
    """Every product of the report in ``out``; returns the per-run results."""
    from mwm.report import style

    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    res = mechanism2_results(cfg, runs)
    mechanism2_tables(cfg, runs, res, out)
    fig_mechanism2_loss(cfg, res, out)
    fig_mechanism_chain(cfg, res, runs, out, twins=_twins, name=f"fig_{cfg['workflow']['report']}_chain")
    fig_mechanism2_checks(cfg, runs, out)
    return res
