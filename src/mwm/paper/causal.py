"""The causal experiments' rules: how a mechanism run failed, round 1's fixed shares (``restore``, ``cause``),
and the per-baseline rounds' decision procedure (``share_ci``, ``restore_ci``, ``cause_outcomes``: exact
binomial statistics, Holm over the primary contrasts) with each round's rows, written from its declaration in
its experiment's module (:data:`ROUNDS`). Every rule here was fixed before its experiment's first run."""

from __future__ import annotations

from typing import Mapping, Sequence

from mwm.experiments import EXPERIMENTS, MechRound
from mwm.paper.rules import NOT_TESTED, UNRESOLVED, Claim, Rule
from mwm.stats import binomial_p, clopper_pearson, holm, holm_adjusted

__all__ = ["FAIL_MARGIN", "RESTORE_SHARE", "MIN_FAILED_CELLS", "FAIL_SHARE", "FAIL_MARGINS_SENSITIVITY",
           "MECH2_BASELINES", "RESTORE_NULL", "CI_LEVEL", "CHECK_SHARE", "MECH2_OUTCOMES", "ROUNDS", "round_claims",
           "mech2_contrast", "mech2_outcome", "mech_primary_decisions", "mech_values", "JUDGES"]

#: The mechanism experiment (fixed before its first run). A run failed to train iff it did not complete
#: (the divergence rule) or its final val loss exceeds that of the worse Stiefel-attention reference
#: (All Stiefel, Hetero) at the same step size and seed by more than FAIL_MARGIN nats (the divergence
#: rule's default threshold, the schema's train.divergence.threshold).
FAIL_MARGIN = 0.5
#: An intervention restores training iff it trains in at least RESTORE_SHARE[1] of the (baseline, rate, seed)
#: cells where the plain arm failed, and does not iff in at most RESTORE_SHARE[0]; between: not resolved.
RESTORE_SHARE = (1 / 3, 2 / 3)
#: Fewer failed cells than this leave an intervention's contrast "not resolved" (nothing to restore).
MIN_FAILED_CELLS = 4
#: mech.fails: at the experiment's largest step size, at least this share of the plain DGram-attention
#: runs must fail for "reproduced".
FAIL_SHARE = 0.5

# The second mechanism experiment (config/mechanism2.yaml; fixed before its first run). A run failed by the
# FAIL_MARGIN rule above; 0.3 and 1.0 only feed a sensitivity table, never a verdict.
FAIL_MARGINS_SENSITIVITY = (0.3, FAIL_MARGIN, 1.0)
#: Each baseline is its own experiment: All DGram, and Hetero-inv (DGram attention + Stiefel MLP).
MECH2_BASELINES = ("dgram", "hetero-inv")
#: The share restored is tested against this (and mech2.fails' failed share against FAIL_SHARE).
RESTORE_NULL = 0.5
#: Two-sided Clopper-Pearson intervals at this level; 1 - CI_LEVEL is the Holm family's alpha.
CI_LEVEL = 0.95
#: A contrast is "not tested" when the intervention's manipulation check failed or is unknown in more than this
#: share of the cells where its baseline's plain arm failed.
CHECK_SHARE = 0.5
#: A contrast's outcome (mech2_outcome), as the cause rows read it.
MECH2_OUTCOMES = ("restores", "does not restore", UNRESOLVED, NOT_TESTED)


_MECH2_LABEL = {"dgram": "All DGram", "hetero-inv": "Hetero-inv (DGram attention, Stiefel MLP)"}
_MECH2_FAILED = (f"failed: not completed, or final val loss > the worse of All Stiefel / Hetero at the same rate and "
                 f"seed + {FAIL_MARGIN:g} nats")

#: Every round of the per-baseline mechanism experiment, by its report (``workflow.report``): each is declared
#: in its experiment's module (:mod:`mwm.experiments`), and :func:`round_claims` writes its rows.
ROUNDS = {name: e.round for name, e in EXPERIMENTS.items() if e.round is not None}


def _mech_restore_text(rnd: MechRound, b: str, kind: str) -> str:
    check = ("those where the twin's manipulation check passed are tested" if kind == "saturation" or not
             rnd.per_kind_check else "those where the twin's manipulation check passed in attention and in the MLP "
             "apart (each module kind's median alignment share and violation at every checked evaluation) are tested")
    cells = (f"over the (rate, seed) cells at rate{'s' if len(rnd.rates) > 1 else ''} "
             f"{' and '.join(f'{r:g}' for r in rnd.rates)} where plain "
             f"{_MECH2_LABEL[b]} failed ({_MECH2_FAILED}) and its {kind} twin ({rnd.arms[kind]}) has a verdict, "
             f"{check}; share = tested cells where the twin trained / tested cells; ")
    ci = f"the {CI_LEVEL:.0%} Clopper-Pearson interval of the share"
    if kind in rnd.primary:
        decide = (f"reproduced iff the lower bound of {ci} is > {RESTORE_NULL:g} and Holm's step-down (alpha = "
                  f"{1 - CI_LEVEL:.2g}, over the primary contrasts {' and '.join(rnd.primary)} x "
                  f"{' and '.join(MECH2_BASELINES)} that are tested) rejects share = {RESTORE_NULL:g} by its exact "
                  f"two-sided binomial p-value, not reproduced iff the upper bound is < {RESTORE_NULL:g} and Holm "
                  "rejects, else not resolved (also with no failed cell)")
    else:
        decide = (f"secondary, no Holm: reproduced iff the lower bound of {ci} is > {RESTORE_NULL:g}, not "
                  f"reproduced iff its upper bound is < {RESTORE_NULL:g}, else not resolved (also with no failed "
                  "cell)")
    return (cells + decide + f"; not tested when the check failed or is unknown in more than {CHECK_SHARE:.0%} "
            "of the failed cells; harm (the twin failing where the plain arm trained, whatever its check) is "
            "counted and shown, not part of the verdict")


def round_claims(name: str, rnd: MechRound, b: str) -> tuple[Claim, ...]:
    """The ``<prefix>.*`` rows of round ``name`` (its experiment, which a config's ``workflow.report`` names)
    and baseline ``b``: each baseline is its own experiment."""
    label, p = _MECH2_LABEL[b], rnd.prefix
    kw = dict(min_seeds=rnd.min_seeds, needs=name)
    restores = {"solver": (f"{rnd.arms['solver']} restores {label} where it failed", "6 (mechanism)",
                           "(an alternative the paper does not test)"),
                "saturation": (f"removing softmax saturation ({rnd.arms['saturation']}) restores {label} where it "
                               "failed", "5, 6 (mechanism)", "(implied by Sections 5-6)"),
                "solver_attn": (f"(secondary) {rnd.arms.get('solver_attn')} restores {label} where it failed",
                                "6 (mechanism)", "(an alternative the paper does not test)")}
    return (
        Claim(f"{p}.fails.{b}", f"{label} fails to train at large step sizes where Stiefel attention trains "
              f"(fresh seeds): share of its plain runs failed at the largest rate ({rnd.rates[-1]:g})", "4, 6",
              "DGram attention unstable",
              Rule("share_ci", text=f"{_MECH2_FAILED}; over the plain {_MECH2_LABEL[b]} runs at rate "
                   f"{rnd.rates[-1]:g}: "
                   f"reproduced iff the {CI_LEVEL:.0%} Clopper-Pearson lower bound of the failed share is > "
                   f"{FAIL_SHARE:g}, not reproduced iff its upper bound is < {FAIL_SHARE:g}, else not resolved",
                   **kw), rnd.rebuild, FAIL_SHARE),
        *(Claim(f"{p}.{k}_restores.{b}", *restores[k], Rule("restore_ci", text=_mech_restore_text(rnd, b, k), **kw),
                rnd.rebuild, True) for k in rnd.kinds),
        Claim(f"{p}.cause.{b}", f"why DGram attention fails in {label}: softmax saturation (the paper) or the "
              "inner solve", "6", "softmax saturation",
              Rule("cause_outcomes", text=f"from the outcomes of {p}.saturation_restores.{b} and "
                   f"{p}.solver_restores.{b} (each restores / does not restore / not resolved / not tested): "
                   "not tested if either is not tested, else not resolved if either is not resolved, else saturation "
                   "supported (only saturation restores), solver supported (only solver restores), both supported, "
                   "neither supported", **kw), rnd.rebuild),
    )

def _judge_restore(c: Claim, x: tuple[int, int]) -> tuple[str, str]:
    """``x``: (cells the intervention restored, cells where the plain arm failed); ``c.value``: whether the
    claim is that it restores (True) or that it does not (False)."""
    restored, failed = x
    if failed < MIN_FAILED_CELLS:
        return UNRESOLVED, (f"the plain arm failed in {failed} cell(s), fewer than {MIN_FAILED_CELLS}: "
                            "nothing to restore")
    share = restored / failed
    lo, hi = RESTORE_SHARE
    shown = f"trains in {restored} of {failed} failed cells ({share:.0%})"
    if lo < share < hi:
        return UNRESOLVED, shown + f", between {lo:.0%} and {hi:.0%}"
    restores = share >= hi
    return ("reproduced" if restores == bool(c.value) else "not reproduced"), \
        shown + (": restores" if restores else ": does not restore")



def _judge_cause(x: Mapping[str, bool | None]) -> tuple[str, str]:
    """``x``: each contrast as it came out relative to its own claim (True: as claimed, None: not resolved):
    ``cap`` (the attention cap restores), ``normalized`` (the normalized solve restores), ``mlp_control``
    (the MLP cap does not restore)."""
    shown = ", ".join(f"{k} {'as claimed' if v else 'not resolved' if v is None else 'against its claim'}"
                      for k, v in x.items())
    cap, normalized, control = x.get("cap"), x.get("normalized"), x.get("mlp_control")
    if cap is None or normalized is None or (cap and control is None):
        return UNRESOLVED, shown
    saturation = bool(cap and control)
    verdict = {(True, False): "saturation supported", (False, True): "solver supported",
               (True, True): "both supported", (False, False): "neither supported"}[saturation, bool(normalized)]
    return verdict, shown



def _judge_share_ci(c: Claim, x: tuple[int, int]) -> tuple[str, str]:
    """``x``: (runs that came out as claimed, runs); ``c.value``: the share the interval is held against."""
    k, n = x
    if n < 1:
        return UNRESOLVED, "no runs"
    lo, hi = clopper_pearson(k, n, CI_LEVEL)
    shown = f"{k} of {n} ({k / n:.0%}), {CI_LEVEL:.0%} CP [{lo:.3f}, {hi:.3f}]"
    if lo > c.value:
        return "reproduced", shown + f": lower bound above {c.value:g}"
    if hi < c.value:
        return "not reproduced", shown + f": upper bound below {c.value:g}"
    return UNRESOLVED, shown + f": contains {c.value:g}"



def mech2_contrast(cells: Sequence[tuple[bool | None, bool | None, bool | None]]) -> dict:
    """One baseline x one intervention over its (rate, seed) cells, each ``(plain_failed, twin_failed,
    twin_check)`` (None: no verdict / check unknown). Counts: ``failed`` (the plain arm failed and the twin has
    a verdict), ``tested`` (of those, the twin's check passed), ``restored`` (of tested, the twin trained),
    ``untested`` (failed - tested), ``harm_of`` (the plain arm trained and the twin has a verdict), ``harm``
    (of those, the twin failed: whatever its check says, since a check cannot excuse a broken run),
    ``missing`` (either arm without a verdict); ``ci`` and ``p``: restored / tested against
    :data:`RESTORE_NULL` (None with nothing tested); ``status``: "nothing to restore" (no failed cell),
    "not tested" (untested > CHECK_SHARE x failed) or "tested"."""
    failed = tested = restored = harm = harm_of = missing = 0
    for plain_failed, twin_failed, twin_check in cells:
        if plain_failed is None or twin_failed is None:
            missing += 1
        elif plain_failed:
            failed += 1
            if twin_check is True:
                tested += 1
                restored += not twin_failed
        else:
            harm_of += 1
            harm += bool(twin_failed)
    untested = failed - tested
    if failed < 1:
        status = "nothing to restore"
    elif untested > CHECK_SHARE * failed:
        status = NOT_TESTED
    else:
        status = "tested"
    return {"cells": len(cells), "failed": failed, "tested": tested, "restored": restored, "untested": untested,
            "harm": harm, "harm_of": harm_of, "missing": missing, "status": status,
            "ci": clopper_pearson(restored, tested, CI_LEVEL) if tested else None,
            "p": binomial_p(restored, tested, RESTORE_NULL) if tested else None}



def mech2_outcome(x: Mapping) -> str:
    """A contrast's outcome (one of :data:`MECH2_OUTCOMES`) from :func:`mech2_contrast`'s dict plus ``reject``
    (whether the null share was rejected: Holm's decision for a primary contrast, p < 1 - CI_LEVEL for a
    secondary one). Both bounds are read, so the outcome is symmetric in restoring and not restoring."""
    if x["status"] == NOT_TESTED:
        return NOT_TESTED
    if x["status"] != "tested" or not x["reject"]:
        return UNRESOLVED
    lo, hi = x["ci"]
    if lo > RESTORE_NULL:
        return "restores"
    if hi < RESTORE_NULL:
        return "does not restore"
    return UNRESOLVED



def _mech_decided(rnd: MechRound, contrasts: Mapping[tuple[str, str], Mapping]) -> dict[tuple[str, str], dict]:
    """Every contrast given, plus ``reject``, ``p_holm`` and ``family`` (the Holm family's size; 0 for a
    secondary one). The family: the round's primary contrasts with status "tested", every one of them required."""
    primary = [(b, k) for b in MECH2_BASELINES for k in rnd.primary]
    absent = [key for key in primary if key not in contrasts]
    if absent:
        raise KeyError(f"no contrast for {', '.join(f'{b} x {k}' for b, k in absent)}")
    family = {f"{b}|{k}": contrasts[b, k]["p"] for b, k in primary if contrasts[b, k]["status"] == "tested"}
    rejected, adjusted = holm(family, 1 - CI_LEVEL), holm_adjusted(family)
    out = {}
    for (b, k), con in contrasts.items():
        x = dict(con)
        if (b, k) in primary:
            key = f"{b}|{k}"
            x.update(reject=rejected.get(key, False), p_holm=adjusted.get(key), family=len(family))
        else:
            x.update(reject=con["p"] is not None and con["p"] < 1 - CI_LEVEL, p_holm=None, family=0)
        out[b, k] = x
    return out



def mech_primary_decisions(rnd: MechRound, contrasts: Mapping[tuple[str, str], Mapping]) -> dict[tuple[str, str], str]:
    """``{(baseline, kind): outcome}`` for the round's primary contrasts, from ``{(baseline, kind):``
    :func:`mech2_contrast` ``}``: Holm's step-down at 1 - CI_LEVEL over exactly those primary contrasts that
    are tested (failed cells, checks held), then :func:`mech2_outcome`."""
    decided = _mech_decided(rnd, contrasts)
    return {(b, k): mech2_outcome(decided[b, k]) for b in MECH2_BASELINES for k in rnd.primary}



def mech_values(rnd: MechRound, contrasts: Mapping[tuple[str, str], Mapping]) -> dict[str, dict]:
    """The rebuilt value of each ``<prefix>.*_restores.*`` and ``<prefix>.cause.*`` row of round ``rnd``,
    ``{claim id: x}`` for :func:`judge`, from ``{(baseline, kind):`` :func:`mech2_contrast` ``}`` (the primary
    ones required, a secondary one judged where given). ``<prefix>.fails.*`` takes ``(failed runs, runs)`` at
    the largest rate."""
    decided = _mech_decided(rnd, contrasts)
    out: dict[str, dict] = {f"{rnd.prefix}.{k}_restores.{b}": x for (b, k), x in decided.items()}
    for b in MECH2_BASELINES:
        out[f"{rnd.prefix}.cause.{b}"] = {k: mech2_outcome(decided[b, k]) for k in ("saturation", "solver")}
    return out



def _judge_restore_ci(c: Claim, x: Mapping) -> tuple[str, str]:
    """``x``: a contrast with its ``reject`` (:func:`mech_values`); ``c.value``: the claim is that it restores."""
    outcome = mech2_outcome(x)
    harm = f"harm: the twin failed in {x['harm']} of {x['harm_of']} cells where the plain arm trained"
    if x["status"] == "nothing to restore":
        return UNRESOLVED, f"the plain arm failed in no cell with a twin verdict: nothing to restore; {harm}"
    if outcome == NOT_TESTED:
        return NOT_TESTED, (f"manipulation check failed or unknown in {x['untested']} of {x['failed']} failed cells "
                            f"(more than {CHECK_SHARE:.0%}); {harm}")
    lo, hi = x["ci"]
    shown = (f"trains in {x['restored']} of {x['tested']} tested failed cells ({x['restored'] / x['tested']:.0%}), "
             f"{CI_LEVEL:.0%} CP [{lo:.3f}, {hi:.3f}], p = {x['p']:.3g}")
    if x.get("family"):
        shown += (f", Holm-adjusted {x['p_holm']:.3g} over {x['family']} tested primary contrast(s): "
                  f"{'rejects' if x['reject'] else 'does not reject'} {RESTORE_NULL:g}")
    else:
        shown += f" (secondary: {'rejects' if x['reject'] else 'does not reject'} {RESTORE_NULL:g}, no Holm)"
    shown += f"; {x['untested']} failed cell(s) untested (check failed or unknown); {harm}"
    if outcome == UNRESOLVED:
        return UNRESOLVED, shown
    restores = outcome == "restores"
    return ("reproduced" if restores == bool(c.value) else "not reproduced"), \
        shown + (": restores" if restores else ": does not restore")



def _judge_cause_outcomes(x: Mapping[str, str]) -> tuple[str, str]:
    """``x``: ``{"saturation": outcome, "solver": outcome}`` (:data:`MECH2_OUTCOMES`)."""
    bad = {k: v for k, v in x.items() if v not in MECH2_OUTCOMES}
    if bad or set(x) != {"saturation", "solver"}:
        raise ValueError(f"cause outcomes {dict(x)!r}: needs saturation and solver, each one of {MECH2_OUTCOMES}")
    shown = f"saturation {x['saturation']}, solver {x['solver']}"
    if NOT_TESTED in x.values():
        return NOT_TESTED, shown
    if UNRESOLVED in x.values():
        return UNRESOLVED, shown
    verdict = {(True, False): "saturation supported", (False, True): "solver supported",
               (True, True): "both supported", (False, False): "neither supported"}[
        x["saturation"] == "restores", x["solver"] == "restores"]
    return verdict, shown



#: How each causal kind of rule judges a rebuilt value: ``(claim, value) -> (verdict, why)``.
JUDGES = {"restore": _judge_restore, "cause": lambda c, x: _judge_cause(x), "share_ci": _judge_share_ci,
          "restore_ci": _judge_restore_ci, "cause_outcomes": lambda c, x: _judge_cause_outcomes(x)}
