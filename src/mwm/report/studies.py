"""Study figures and tables: alpha_opt and its fit, convergence curves (alpha = 0.1),
Figure 3 (absorption), Tables 1-2 and the theory-audit table."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mwm import paper
from mwm.workflow.stages import study_files
from mwm.report import style
from mwm.report.load import ReportError
from mwm.report.tables import write_table

__all__ = ["load_studies", "studies_report", "solver_study_report", "STUDY_FILES", "SOLVER_STUDY_FILES"]

#: The study files the report loads (mwm.workflow.stages: each study's ``report_reads``).
STUDY_FILES = study_files(("alpha", "absorption", "audits"), reads=True)
#: The solver study's files: drawn when present (the DAG's report rule requires them).
SOLVER_STUDY_FILES = study_files(("solvers",), reads=True)


def load_studies(folder: str | Path, required: tuple[str, ...] = STUDY_FILES, cfg: dict | None = None) -> dict:
    """The study results under ``folder``: every ``required`` file (an error names the
    missing ones) and the solver study's when present. Each result's provenance is checked: made by this
    code's numerics and, given the config ``cfg``, from its own ``studies.<study>`` section (a study run by
    hand with overrides is refused, naming the file)."""
    folder = Path(folder)
    missing = [f for f in required if not (folder / f).exists()]
    if missing:
        raise ReportError(f"study results missing in {folder}: {', '.join(missing)}")
    out = {}
    optional = [f for f in SOLVER_STUDY_FILES if (folder / f).exists() and f not in required]
    for f in required + tuple(optional):
        try:
            out[f] = json.loads((folder / f).read_text()) if f.endswith(".json") else pd.read_csv(folder / f)
        except Exception as exc:  # json or pandas errors
            raise ReportError(f"cannot read {folder / f}: {exc}") from exc
        if f.endswith(".json"):
            _check_numerics(folder / f, out[f])
            if cfg is not None:
                _check_section(folder / f, out[f], cfg)
    return out


def _check_section(path: Path, derived: dict, cfg: dict) -> None:
    """A study whose recorded section hash is not that of the config's section is refused: its numbers
    would stand in the report under settings that did not make them."""
    from mwm.config import config_hash

    study = path.name.split("_")[0].split(".")[0]
    section = (cfg.get("studies") or {}).get(study)
    got = (derived.get("meta") or {}).get("section_hash")
    if section is None or got == config_hash(section):
        return
    raise ReportError(f"{path}: made from settings other than studies.{study} of config {cfg['name']} (section "
                      f"hash {got}, the config's {config_hash(section)}): a study run with overrides or another "
                      "config; rerun it from the config (snakemake reruns it once this file is removed)")


def _check_numerics(path: Path, derived: dict) -> None:
    """A study made with other numerics than this code's is refused, naming both versions."""
    from mwm.numerics import VERSION

    got = (derived.get("meta") or {}).get("numerics") if isinstance(derived, dict) else None
    if got != VERSION:
        made = f"numerics version {got}" if got is not None else "no recorded numerics version (older code)"
        raise ReportError(f"{path}: made with {made}; this code's is {VERSION} (docs/findings.md, Numerics "
                          f"changes): rerun the study (snakemake reruns it)")


def _faithful(st: dict, name: str) -> str | None:
    return st[name].get("faithful")


def _square_faithful(df: pd.DataFrame, precision: str | None) -> pd.DataFrame:
    """Rows of the faithful protocol's square study (files from before the
    precision/shape columns pass through)."""
    if precision is not None and "precision" in df:
        df = df[df.precision == precision]
    if "m" in df:
        df = df[df.m == df.n]
    return df


def _per_size(d: dict) -> list[dict]:
    ps = d["per_size"]
    return sorted(ps if isinstance(ps, list) else [{"n": int(k), **v} for k, v in ps.items()], key=lambda r: r["n"])


def fig_alpha(st: dict, out: Path) -> None:
    derived = st["alpha_derived.json"]["manifolds"]
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL, 2.4))
    for i, (mf, d) in enumerate(derived.items()):
        ps = _per_size(d)
        n = np.array([r["n"] for r in ps])
        a = np.array([r["alpha_opt"] for r in ps])
        axes[0].plot(n, a, "o", color=f"C{i}", label=rf"{mf}: observed $\alpha_{{opt}}$")
        fit = d.get("fit") or {}
        if fit.get("prefactor") is not None and fit.get("exponent") is not None:
            xs = np.geomspace(n.min(), n.max(), 50)
            r2 = fit.get("r2")  # undefined for a fit through two points or a flat optimum
            axes[0].plot(xs, fit["prefactor"] * xs ** fit["exponent"], color=f"C{i}",
                         label=rf"fit ${fit['prefactor']:.2g}\,n^{{{fit['exponent']:.2f}}}$, $r^2$ = "
                               + ("--" if r2 is None else f"{r2:.2f}"))
    xs = np.geomspace(16, 1024, 50)
    pf, pe = paper.ALPHA_FIT["prefactor"], paper.ALPHA_FIT["exponent"]
    axes[0].plot(xs, paper.paper_fit_alpha(xs), "k--", lw=0.8, label=rf"paper: ${pf:g}\,n^{{{pe:g}}}$")
    axes[0].set(xscale="log", yscale="log", xlabel="matrix size n", ylabel=r"$\alpha_{opt}$",
                title="optimal dual-ascent step size")
    axes[0].legend()
    prec = _faithful(st, "alpha_derived.json")
    tr = _square_faithful(st["alpha_trajectories.csv"], prec)
    sel = tr[np.isclose(tr.alpha, st["alpha_derived.json"].get("universal_alpha", 0.1))]
    sizes = sorted(sel.n.unique())
    cmap = plt.get_cmap("viridis")
    for j, n in enumerate(sizes):
        c = sel[sel.n == n].groupby("iteration")["violation"].mean()
        axes[1].plot(c.index, c.values, color=cmap(j / max(len(sizes) - 1, 1)), label=f"n={n}")
    axes[1].set(yscale="log", xlabel="iteration", ylabel=r"$\|H\|_{RMS}$ (seed mean)",
                title=rf"tangent violation at $\alpha$ = 0.1 ({prec or 'float32'} msign)")
    axes[1].legend(ncol=2)
    style.save(fig, out, "fig_alpha_opt_and_convergence")


def fig_absorption(st: dict, out: Path) -> None:
    sm = _square_faithful(st["absorption_summary.csv"], _faithful(st, "absorption_derived.json"))
    variants = list(dict.fromkeys(sm.manifold))
    fig, axes = plt.subplots(len(variants), 2, figsize=(style.FULL, 1.7 * len(variants)), squeeze=False,
                             sharex=True)
    cmap = plt.get_cmap("viridis")
    for row, v in enumerate(variants):
        sub = sm[sm.manifold == v]
        sizes = sorted(sub.n.unique())
        for j, n in enumerate(sizes):
            c = sub[sub.n == n].sort_values("T")
            col = cmap(j / max(len(sizes) - 1, 1))
            axes[row][0].plot(c["T"], c["e_A_mean"], "o-", ms=2, color=col, label=f"n={n}")
            axes[row][1].plot(c["T"], c["e_W_mean"], "o-", ms=2, color=col)
        if v == "stiefel":  # the paper's Table 2 (Stiefel, T = 20): e_A 8-16 %, e_W within 1 %
            lo, hi = paper.ABSORB_EA
            mid, half = (lo + hi) / 2, (hi - lo) / 2
            axes[row][0].errorbar([20], [mid], yerr=[[half], [half]], fmt="none", ecolor="k", capsize=3,
                                  label="paper, T=20")
            axes[row][1].plot([20], [paper.ABSORB_EW_MAX], "kv", ms=4, label="paper: < 1% at T=20")
            axes[row][1].legend()
        axes[row][0].set(yscale="log", ylabel=f"{v}\n$e_A(T)$")
        axes[row][1].set(yscale="log", ylabel="$e_W(T)$")
    axes[0][0].set_title(r"update direction error $e_A(T)$")
    axes[0][1].set_title(r"retracted weight error $e_W(T)$")
    axes[-1][0].set_xlabel("dual-ascent iterations T")
    axes[-1][1].set_xlabel("dual-ascent iterations T")
    axes[0][0].legend(ncol=3)
    style.save(fig, out, "fig3_absorption")


def _protocols(d: dict) -> dict:
    return d.get("protocols") or {d.get("faithful", "float32"): {"manifolds": d["manifolds"]}}


def table1(st: dict, out: Path) -> pd.DataFrame:
    rows = []
    d0 = st["alpha_derived.json"]
    for prec, proto in _protocols(d0).items():
        for mf, d in proto["manifolds"].items():
            fit = d.get("fit") or {}
            for r in _per_size(d):
                rows.append({"precision": prec, "manifold": mf, "shape": f"{r['n']}x{r['n']}",
                             "alpha_opt_observed": r["alpha_opt"], "alpha_opt_fitted": r.get("predicted_alpha_opt"),
                             f"paper_fit_{paper.paper_fit_label()}": paper.paper_fit_alpha(r["n"]),
                             "best_violation": r["best_violation"],
                             "violation_at_0.01": r.get("violation_at_default"),
                             "violation_at_0.1": r.get("violation_at_universal"),
                             "H(Lambda_0)": r.get("initial_violation_mean"),
                             "in_fit": r["n"] >= (fit.get("min_n") or 0)})
        for mf, tall in (proto.get("tall") or {}).items():
            for r in tall:
                rows.append({"precision": prec, "manifold": mf, "shape": f"{r['m']}x{r['n']}",
                             "alpha_opt_observed": r["alpha_opt"], "alpha_opt_fitted": None,
                             f"paper_fit_{paper.paper_fit_label()}": paper.paper_fit_alpha(r["n"]),
                             "best_violation": r["best_violation"],
                             "violation_at_0.01": r["violation_at_default"],
                             "violation_at_0.1": r["violation_at_universal"],
                             "H(Lambda_0)": r["initial_violation_mean"], "in_fit": False})
    df = pd.DataFrame(rows)
    write_table(df, out, "table1_alpha_opt", "Table 1: observed and fitted alpha_opt per shape and msign precision "
                f"(faithful: {d0.get('faithful', 'float32')}; seed mean of the final tangent violation after the "
                "configured iterations; tall shapes are GPT-2's c_attn 3:1 and c_fc 4:1)")
    return df


def table2(st: dict, out: Path) -> pd.DataFrame:
    rows = []
    for prec, proto in _protocols(st["absorption_derived.json"]).items():
        for mf, d in proto["manifolds"].items():
            for r in _per_size(d):
                rows.append({"precision": prec, "manifold": mf, "n": r["n"], "T": r["T"], "e_A": r["e_A"],
                             "e_W": r["e_W"], "compression e_A/e_W": r["compression"],
                             "of which 1/eta": r.get("direction_to_weight_factor"),
                             "of which retraction": r.get("retraction_factor"),
                             "e_W(5)/e_W(last)": (r.get("flatness") or {}).get("e_W_ratio")})
    df = pd.DataFrame(rows)
    write_table(df, out, "table2_absorption", "Table 2: dual-ascent error e_A and retracted-weight error e_W at T, "
                "and the compression split into 1/eta and the retraction's own factor")
    return df


def table_audits(st: dict, out: Path) -> pd.DataFrame:
    au = st["audits.json"]
    sm = au["softmax"]
    g = au["growth"]
    lb = au["logit_bound"]
    rows = [
        {"statement": "||J||_F^2 = ||s||^2 - 2||s||_3^3 + ||s||^4", "holds": sm["identity"].get("holds"),
         "worst slack / error": sm["identity"].get("max_abs_error", sm["identity"].get("worst_slack"))},
        {"statement": "||J||_F^2 <= ||s||^2 (1 - ||s||^2)", "holds": sm["bound"].get("holds"),
         "worst slack / error": sm["bound"].get("worst_slack")},
        {"statement": "||J||_F^2 <= 1/4", "holds": sm["quarter"].get("holds"),
         "worst slack / error": sm["quarter"].get("worst_slack")},
        {"statement": "||J||_F <= sqrt(2(n-1)) exp(-Delta z / 2)", "holds": sm["corollary"].get("holds"),
         "worst slack / error": sm["corollary"].get("worst_slack")},
        {"statement": "same with the top margin z(1) - z(2) in place of Delta z",
         "holds": sm["corollary_margin"].get("holds"),
         "worst slack / error": sm["corollary_margin"].get("worst_slack")},
        {"statement": f"|Z_ij| <= ||X||^2 / sqrt(d_k) = {lb['bound']:g} (d={lb['d']}, d_k={lb['d_k']})",
         "holds": lb.get("matches_paper"), "worst slack / error": None},
        {"statement": f"sigma_max(W_t) <= sigma_0 + sum eta = {g['bound_at_end']:.4g} at the end of the schedule",
         "holds": True, "worst slack / error": None},
        {"statement": f"sigma_max > {g['threshold']:g} reachable under the stated algorithm",
         "holds": g["sigma_max_can_reach_threshold"], "worst slack / error": None},
    ]
    sc = au.get("spectral_check") or {}
    if sc.get("holds") is not None:
        rows.append({"statement": "logged sigma_max within the growth bound (training run)", "holds": sc["holds"],
                     "worst slack / error": sc.get("worst_slack")})
    df = pd.DataFrame(rows)
    write_table(df, out, "table_theory_audits", "Theory audits: the paper's statements checked numerically")
    return df


_FAMILIES = {  # (solver, warm, with tolerance) -> label, marker
    ("dual_ascent", False, False): ("dual ascent, cold", "o"),
    ("dual_ascent", True, False): ("dual ascent, warm", "s"),
    ("dual_ascent", False, True): ("dual ascent, cold + tol", "v"),
    ("dual_ascent", True, True): ("dual ascent, warm + tol", "^"),
    ("admm", False, False): ("ADMM, cold", "D"),
    ("admm", True, False): ("ADMM, warm", "P"),
    ("admm", True, True): ("ADMM, warm + tol", "X"),
}


_SOLVER_TABLE_COLUMNS = ["manifold", "paper e_W", "paper msign", "cheapest matching", "its e_W", "msign ratio",
                         "wall ratio", "<= 1/2 cost"]


def _not_captured_rows(missing: list[dict]) -> list[dict]:
    """Table rows of the capture trainings that captured nothing (named by assignment)."""
    return [{"manifold": f"{m['assignment']} (assignment)", "cheapest matching": f"not captured: {m['reason']}",
             "<= 1/2 cost": False} for m in missing]


def fig_solvers(st: dict, out: Path) -> None:
    """e_W against cost (msign-equivalents) per solver family and manifold, on the
    in-training sequences, with the Pareto front and the paper's baseline."""
    df = st["solvers_summary.csv"]
    derived = st["solvers_derived.json"]
    mans = sorted(df.manifold.unique())
    missing = derived.get("not_captured") or []  # capture trainings that diverged before their window
    notes = [f"{m['assignment']}: not captured ({m['reason']})" for m in missing]
    if not mans:  # nothing captured: the figure and the table say so and why
        fig, ax = plt.subplots(figsize=(style.FULL, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "Inner-solver study: nothing captured\n" + "\n".join(notes or ["(no captured sequence)"]),
                ha="center", va="center", fontsize=6, wrap=True)
        style.save(fig, out, "fig_solvers_pareto")
        write_table(pd.DataFrame(_not_captured_rows(missing), columns=_SOLVER_TABLE_COLUMNS), out, "table_solvers",
                    "Inner solvers on in-training sequences: not captured (the capture trainings diverged)")
        return
    fig, axes = plt.subplots(1, len(mans), figsize=(style.FULL, 2.6), squeeze=False)
    for ax, man in zip(axes[0], mans):
        d = df[df.manifold == man]
        for i, ((solver, warm, has_tol), (label, marker)) in enumerate(_FAMILIES.items()):
            sel = d[(d.solver == solver) & (d.warm.astype(str).str.lower() == str(warm).lower())
                    & (d.tol.notna() == has_tol)]
            rhos = sorted(sel.rho.dropna().unique()) or [None]
            for j, rho in enumerate(rhos):  # one curve per ADMM penalty
                part = sel if rho is None else sel[sel.rho == rho]
                if len(part):
                    part = part.sort_values("msign_eq")
                    ax.plot(part.msign_eq, part.e_W, marker=marker, ms=3.5, lw=0.6, color=f"C{i}",
                            ls=("-", "--", ":", "-.")[j % 4],
                            label=label if rho is None else f"{label}, rho {rho:g}")
        pts = d.sort_values(["msign_eq", "e_W"])
        front, best = [], np.inf
        for c, e in zip(pts.msign_eq, pts.e_W):
            if e < best:
                front.append((c, e))
                best = e
        if front:
            ax.step(*zip(*front), where="post", color="k", lw=0.8, alpha=0.5, label="Pareto front")
        b = derived["by_manifold"].get(man, {})
        if b.get("baseline_e_W") is not None:
            ax.axhline(b["baseline_e_W"], color="k", ls="--", lw=0.7, label="paper: 20 cold iterations")
            ax.axvline(0.5 * b["baseline_msign_eq"], color="grey", ls=":", lw=0.7, label="half its cost")
        ax.set(xscale="log", yscale="log", xlabel="msign-equivalents per step", ylabel="e_W (vs 200-it. cold)",
               title=man)
    axes[0][0].legend(fontsize=5)
    fig.tight_layout()
    style.save(fig, out, "fig_solvers_pareto")
    rows = []
    for man, e in derived["by_manifold"].items():
        best = e.get("cheapest_matching") or {}
        rows.append({"manifold": man, "paper e_W": e["baseline_e_W"], "paper msign": e["baseline_msign_eq"],
                     "cheapest matching": best.get("candidate", "none"), "its e_W": best.get("e_W"),
                     "msign ratio": best.get("msign_ratio"), "wall ratio": best.get("wall_ratio"),
                     "<= 1/2 cost": best.get("half_cost_met", False)})
    rows.extend(_not_captured_rows(missing))
    write_table(pd.DataFrame(rows, columns=_SOLVER_TABLE_COLUMNS), out, "table_solvers",
                "Inner solvers on in-training sequences: the cheapest one matching the paper's e_W")
    table_solvers_alignment(df, out)


def table_solvers_alignment(df: pd.DataFrame, out: Path) -> None:
    """Each candidate's alignment with the momentum beside the converged solve's, plain and normalized
    side by side (a candidate's ``-norm`` twin: solved on W / sigma_max)."""
    if "align" not in df:
        return
    d = df.sort_values(["manifold", "normalize", "msign_eq", "candidate"])
    rows = [{"manifold": r.manifold, "candidate": r.candidate, "normalized": bool(r.normalize),
             "msign-eq": f"{r.msign_eq:.0f}", "alignment": f"{r.align:.3f}", "converged": f"{r.align_conv:.3f}",
             "e_A vs converged": f"{r.e_A_conv:.3g}"} for r in d.itertuples()]
    write_table(pd.DataFrame(rows), out, "table_solvers_alignment",
                "Inner solvers on in-training sequences: each update's alignment with the momentum, "
                "tr(G^T A) / ||G||_* (matrix mean), beside a converged solve's (scale-normalized ADMM), and its "
                "distance from that solve; -norm: the same solver on W / sigma_max")


def solver_study_report(st: dict, out: Path) -> None:
    """The report of a config that measures the inner solvers alone (``workflow.report:
    solvers``): the Pareto figure and its table."""
    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    fig_solvers(st, out)


def studies_report(st: dict, out: Path) -> None:
    style.apply()
    out.mkdir(parents=True, exist_ok=True)
    fig_alpha(st, out)
    fig_absorption(st, out)
    table1(st, out)
    table2(st, out)
    table_audits(st, out)
    if all(f in st for f in SOLVER_STUDY_FILES):
        fig_solvers(st, out)
