"""How a claim's rule is written and judged: the verdicts, :class:`Rule` and :class:`Claim`, and the judges
of the general rule kinds (``window``, ``audit``, ``test``, ``order``, ``edge``); :mod:`mwm.paper.causal` holds
the causal experiments' kinds, :func:`mwm.paper.judge` applies any of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["NC", "TOO_FEW", "UNRESOLVED", "CAUSE_VERDICTS", "NOT_TESTED", "INCOMPLETE", "VERDICTS", "Rule", "Claim",
           "window", "factor", "JUDGES"]

NC = "not comparable at this scale"
TOO_FEW = "too few seeds"
UNRESOLVED = "not resolved"
#: The mechanism experiment's verdicts (rule kind ``cause``), besides "not resolved".
CAUSE_VERDICTS = ("saturation supported", "solver supported", "both supported", "neither supported")
#: The second mechanism experiment's verdict for a contrast whose manipulation check did not hold.
NOT_TESTED = "not tested"
#: Every verdict of a report drawn from part of its config's grid (``python -m mwm.report --partial``): the
#: rules are written for the whole grid, so none is applied to part of it.
INCOMPLETE = "not judged: incomplete"
VERDICTS = ("reproduced", "not reproduced", TOO_FEW, NC, "contradicted by an audit", UNRESOLVED, *CAUSE_VERDICTS,
            NOT_TESTED, INCOMPLETE)


@dataclass(frozen=True)
class Rule:
    kind: str  # window | audit | order | edge | test | restore | cause | share_ci | restore_ci | cause_outcomes
    lo: float | None = None
    hi: float | None = None
    min_seeds: int = 1
    needs: str = "any"
    text: str = ""

    def describe(self) -> str:
        parts = [self.text] if self.text else []
        if self.kind == "window" and not self.text:
            parts.append(f"reproduced iff {self.lo:g} <= x <= {self.hi:g}")
        if self.min_seeds > 1:
            parts.append(f">= {self.min_seeds} seeds")
        if self.needs != "any":
            parts.append(f"comparable only with {self.needs}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    section: str
    paper: str
    rule: Rule
    rebuild: str = "config/paper.yaml"
    value: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def window(lo, hi, text="", **kw) -> Rule:
    """A ``window`` rule: reproduced iff ``lo <= x <= hi``."""
    return Rule("window", lo, hi, text=text, **kw)


def factor(x: float, f: float, **kw) -> Rule:
    """A ``window`` rule within a factor ``f`` of ``x``."""
    return Rule("window", x / f, x * f, text=f"within {f:g}x of {x:g}", **kw)


def _judge_window(c: Claim, x: float) -> tuple[str, str]:
    r = c.rule
    ok = r.lo <= float(x) <= r.hi
    return ("reproduced" if ok else "not reproduced"), f"{float(x):.4g} {'inside' if ok else 'outside'} " \
        f"[{r.lo:.4g}, {r.hi:.4g}]"



def _judge_audit(c: Claim, x: bool) -> tuple[str, str]:
    return ("reproduced" if bool(x) else "contradicted by an audit"), \
        ("the statement holds" if bool(x) else "the statement fails")



def _judge_test(c: Claim, x: bool) -> tuple[str, str]:
    return ("reproduced" if bool(x) else "not reproduced"), \
        ("came out as claimed" if bool(x) else "came out against the claim")



def _judge_order(c: Claim, losses: Mapping[str, Sequence[float]]) -> tuple[str, str]:
    """Every pair of conditions is a link: resolved when the gap of seed means exceeds the seed spread
    (max - min) of both. A resolved link against the paper's order decides "not reproduced" wherever
    it sits; "reproduced" needs every adjacent link resolved in order (then every pair is); anything
    else is "too few seeds"."""
    order = list(c.value)
    n = min(len(losses[k]) for k in order)
    if n < c.rule.min_seeds:
        return TOO_FEW, f"{n} seed(s) per condition, the rule needs {c.rule.min_seeds}"
    mean = {k: sum(losses[k]) / len(losses[k]) for k in order}
    spread = {k: max(losses[k]) - min(losses[k]) for k in order}

    def resolved(a: str, b: str) -> bool:
        return abs(mean[b] - mean[a]) > max(spread[a], spread[b])

    pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
    against = [(a, b) for a, b in pairs if resolved(a, b) and mean[b] < mean[a]]
    if against:
        return "not reproduced", "; ".join(
            f"{b} {mean[b]:.4f} < {a} {mean[a]:.4f}: gap {mean[a] - mean[b]:.4f} > seed spread "
            f"{max(spread[a], spread[b]):.4f}, against the paper's order" for a, b in against)
    open_links = [(a, b) for a, b in zip(order, order[1:]) if not resolved(a, b)]
    if open_links:
        return TOO_FEW, "; ".join(f"gap {a}-{b} {abs(mean[b] - mean[a]):.4f} <= seed spread "
                                  f"{max(spread[a], spread[b]):.4f}" for a, b in open_links) + \
            ": unresolved with these seeds, and no resolved link against the paper's order"
    return "reproduced", "every link resolved, in the paper's order"



def _judge_edge(c: Claim, edges: Mapping[str, int]) -> tuple[str, str]:
    """``edges``: assignment -> its stability edge as a rank (how many of the sweep's rates, from the
    smallest, are stable; all of them: stable throughout, an edge at or above the largest rate)."""
    low, high = c.value
    missing = [a for a in (*low, *high) if a not in edges]
    if missing:
        return NC, f"no sweep of {', '.join(missing)}"
    lo_max, lo_min = max(edges[a] for a in low), min(edges[a] for a in low)
    hi_max, hi_min = max(edges[a] for a in high), min(edges[a] for a in high)
    shown = ", ".join(f"{a} {edges[a]}" for a in (*low, *high))
    if lo_max < hi_min:
        return "reproduced", f"stable rates counted from the smallest: {shown}; every {'/'.join(low)} edge below"
    if hi_max < lo_min:
        return "not reproduced", f"stable rates counted from the smallest: {shown}; every {'/'.join(low)} edge above"
    return UNRESOLVED, f"stable rates counted from the smallest: {shown}; the edges overlap or tie"



#: How each general kind of rule judges a rebuilt value: ``(claim, value) -> (verdict, why)``.
JUDGES = {"window": _judge_window, "audit": _judge_audit, "order": _judge_order, "edge": _judge_edge,
          "test": _judge_test}
