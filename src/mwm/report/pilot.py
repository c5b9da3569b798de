"""A mechanism pilot's tables: where does each plain baseline fail, does each arm's check hold, and can the
rules of a round reach a verdict with a given number of seeds?

A pilot (``config/mechanism3-pilot.yaml``) trains the arms of a planned round on seeds no judged config
uses, to choose its rate, steps and seed count before its rules are committed. Nothing here judges a
claim. Per (arm, rate): the final losses, the failed runs (the rounds' per-run rule,
:func:`mwm.report.mechanism.mechanism_results`) with their Clopper-Pearson interval, and each
manipulation check (:mod:`mwm.train.manipulation`): the solver check per module kind (attention and
MLP apart) with its worst evaluation, and the saturation check. Then the power of a round's decision
at each baseline's observed failure share (:func:`restore_power`): the chance that ``n`` seeds give a
"restores" outcome when the intervention trains a share ``q`` of the failed cells, under Holm's first
(strictest) step.

    python -m mwm.report.pilot --config config/mechanism3-pilot.yaml [--results results]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

import pandas as pd

from mwm import paper
from mwm.plan.runs import run_config
from mwm.plan.variants import rate_label, sweep_points
from mwm.stats import binomial_p, clopper_pearson
from mwm.train import manipulation

__all__ = ["pilot_rows", "restore_power", "min_failed_cells", "power_rows", "load_pilot", "main"]


def _frac(flags: Sequence) -> str:
    known = [f for f in flags if f is not None]
    return f"{sum(bool(f) for f in known)}/{len(flags)}" + (f" ({len(flags) - len(known)} unknown)"
                                                            if len(known) < len(flags) else "")


def _worst(values: Sequence, side: str) -> str:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return "--" if not vals else f"{(min if side == 'min' else max)(vals):.3g}"


def pilot_rows(cfg: dict, runs, res: pd.DataFrame) -> list[dict]:
    """One row per (arm, rate) of the pilot's grid: seeds, median final loss, failed runs (with the 95%
    Clopper-Pearson interval), and the checks: solver per module kind (passed runs, lowest alignment share,
    highest violation) and saturation (passed runs, lowest layer entropy)."""
    rows = []
    for variant, (arm, rate) in sweep_points(cfg["grid"]).items():
        train = run_config(cfg, variant)["train"]
        mods = manipulation.checked_modules(train)
        got = [manipulation.run_checks(train, runs[variant, seed].solver.to_dict("records"),
                                       runs[variant, seed].attention.to_dict("records"))
               for seed in cfg["grid"]["seeds"]]
        g = res[(res.arm == arm) & (res.rate == rate)]
        failed = [None if f is None else bool(f) for f in g.failed]
        k, n = sum(f is True for f in failed), sum(f is not None for f in failed)
        ci = clopper_pearson(k, n, paper.CI_LEVEL) if n else None
        row = {"arm": arm, "eta": rate_label(rate), "seeds": len(g),
               "final loss (median)": f"{g.final_val_loss.median():.3f}",
               "failed": _frac(failed) + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")}
        for m in ("attn", "mlp"):
            kinds = [c["solver"]["per_kind"].get(m) for c in got]
            if m not in mods or any(x is None for x in kinds):
                row[f"solver check {m}"] = "--"
                continue
            row[f"solver check {m}"] = (f"{_frac([x['passed'] for x in kinds])}, share >= "
                                        f"{_worst([x['alignment_share_min'] for x in kinds], 'min')}, violation <= "
                                        f"{_worst([x['violation_max'] for x in kinds], 'max')}")
        row["reference gap <="] = _worst([c["solver"].get("reference_gap_max") for c in got], "max")
        row["saturation check"] = (f"{_frac([c['saturation']['passed'] for c in got])}, entropy >= "
                                   f"{_worst([c['saturation']['entropy_min'] for c in got], 'min')}")
        rows.append(row)
    return rows


def min_failed_cells(family: int, alpha: float = 1 - paper.CI_LEVEL) -> int:
    """The fewest tested cells, all restored, whose exact two-sided binomial p against
    :data:`mwm.paper.RESTORE_NULL` passes Holm's first step (``alpha / family``) and whose Clopper-Pearson
    lower bound is above the null."""
    k = 1
    while not (binomial_p(k, k, paper.RESTORE_NULL) < alpha / family
               and clopper_pearson(k, k, paper.CI_LEVEL)[0] > paper.RESTORE_NULL):
        k += 1
    return k


def _binom_pmf(k: int, n: int, p: float) -> float:
    return math.comb(n, k) * p ** k * (1 - p) ** (n - k)


def restore_power(n: int, fail_share: float, restore_share: float, family: int = 4) -> float:
    """P(outcome "restores") for ``n`` paired seeds when the plain arm fails each with ``fail_share`` and the
    intervention (its check holding) trains a failed cell with ``restore_share``: failed cells F ~ Bin(n, f),
    restored R ~ Bin(F, q), "restores" iff the Clopper-Pearson lower bound of R / F is above the null and the
    exact p is below ``alpha / family`` (Holm's first step: a lower bound on the power within the family).
    By symmetry it is also P("does not restore") at ``1 - restore_share``."""
    alpha = (1 - paper.CI_LEVEL) / family
    total = 0.0
    for f in range(1, n + 1):
        pf = _binom_pmf(f, n, fail_share)
        for r in range(f + 1):
            if clopper_pearson(r, f, paper.CI_LEVEL)[0] > paper.RESTORE_NULL and \
                    binomial_p(r, f, paper.RESTORE_NULL) < alpha:
                total += pf * _binom_pmf(r, f, restore_share)
    return total


def power_rows(fail_shares: dict[str, float], seeds: Sequence[int], restore_shares: Sequence[float] = (1.0, 0.9, 0.8),
               family: int = 4) -> list[dict]:
    """Per baseline (its observed failure share) and seed count: :func:`restore_power` at each restore share."""
    return [{"baseline": b, "failure share": f"{f:.2f}", "seeds": n,
             **{f"P(verdict) at q = {q:g}": f"{restore_power(n, f, q, family):.2f}" for q in restore_shares}}
            for b, f in fail_shares.items() for n in seeds]


def load_pilot(cfg: dict, root: str) -> tuple[dict, list[str]]:
    """Every run of the pilot's grid (refused by name where one is missing) and the numerics versions found:
    a pilot chooses a design and is never judged, so its runs are read whatever version made them (the
    versions are printed; a version moves no training loss unless its history says so)."""
    from mwm.numerics import recorded_version
    from mwm.plan.runs import Plan
    from mwm.report.load import ReportError, read_grid

    runs, missing = read_grid(Plan(cfg, root))
    if missing:
        raise ReportError("pilot runs missing:\n  " + "\n  ".join(missing))
    versions = sorted({str(recorded_version(r.summary)) for r in runs.values()})
    return runs, versions


def main(argv: list[str] | None = None) -> int:
    from mwm.config import load_config
    from mwm.report.mechanism import mechanism_results
    from mwm.report.tables import markdown

    p = argparse.ArgumentParser(prog="python -m mwm.report.pilot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the pilot's config file")
    p.add_argument("--results", default="results", help="the results folder (default: results)")
    p.add_argument("--seeds", type=int, nargs="+", default=[8, 10, 12, 14, 16],
                   help="seed counts of the power table (default: 8 10 12 14 16)")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
        runs, versions = load_pilot(cfg, args.results)
    except (FileNotFoundError, ValueError) as e:  # a ConfigError and a ReportError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 1
    res = mechanism_results(cfg, runs)
    print(f"# Pilot {cfg['name']}: {len(res)} runs, seeds {', '.join(map(str, cfg['grid']['seeds']))}, "
          f"numerics version(s) {', '.join(versions)}\n")
    print(markdown(pd.DataFrame(pilot_rows(cfg, runs, res))))
    plain = res[res.arm.isin(paper.MECH2_BASELINES) & res.failed.notna()]
    for rate, g in plain.groupby("rate"):
        shares = {b: float(x.failed.astype(bool).mean()) for b, x in g.groupby("arm")}
        print(f"\n## Power at eta {rate_label(rate)} (Holm's first step over 4 contrasts: at least "
              f"{min_failed_cells(4)} failed cells, all restored)\n")
        print(markdown(pd.DataFrame(power_rows(shares, args.seeds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
