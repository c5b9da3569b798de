"""mwm.paper.rules through mwm.paper.judge: a rule decides comparability and seeds before it reads the value,
and each general kind (window, audit, test, order, edge) falls either way on made-up values."""

import pytest

from mwm import paper


def test_rules_decide_comparability_before_the_data():
    c = paper.claim("loss.hetero")  # needs paper scale
    for x in (c.value, c.value + 1.0):  # in and out of the window alike
        assert paper.judge(c, x, caps={"any"}, seeds=3)[0] == paper.NC
    assert paper.judge(c, c.value, caps={"any", "paper"}, seeds=1)[0] == "reproduced"
    assert paper.judge(c, c.value + 1.0, caps={"any", "paper"}, seeds=1)[0] == "not reproduced"
    assert paper.judge(c, None, caps={"any", "paper"})[0] == paper.NC


def test_loss_ordering_needs_three_seeds_and_a_gap_above_the_spread():
    c = paper.claim("loss.order")
    ok = {"hetero": [3.30, 3.31, 3.30], "stiefel": [3.40, 3.41, 3.40], "none": [3.50, 3.51, 3.50]}
    assert paper.judge(c, ok)[0] == "reproduced"
    rev = {"hetero": ok["none"], "stiefel": ok["stiefel"], "none": ok["hetero"]}
    assert paper.judge(c, rev)[0] == "not reproduced"  # symmetric: a resolved wrong order is a finding
    two = {k: v[:2] for k, v in ok.items()}
    assert paper.judge(c, two)[0] == paper.TOO_FEW
    noisy = {"hetero": [3.30, 3.45, 3.38], "stiefel": [3.40, 3.41, 3.40], "none": [3.50, 3.51, 3.50]}
    verdict, why = paper.judge(c, noisy)
    assert verdict == paper.TOO_FEW and "spread" in why


def test_loss_ordering_sees_a_resolved_reversal_behind_an_unresolved_link():
    c = paper.claim("loss.order")
    # the default DAG's pattern: hetero-stiefel unresolved, stiefel-none resolved the other way
    behind = {"hetero": [4.53, 4.54, 4.545], "stiefel": [4.52, 4.53, 4.523], "none": [4.37, 4.38, 4.381]}
    verdict, why = paper.judge(c, behind)
    assert verdict == "not reproduced" and "none" in why and "stiefel" in why
    # the same reversal in the first link, the second unresolved
    first = {"hetero": [3.50, 3.51, 3.50], "stiefel": [3.40, 3.41, 3.40], "none": [3.405, 3.40, 3.41]}
    assert paper.judge(c, first)[0] == "not reproduced"
    # neighbours unresolved both, the outer pair resolved against the order: a reversal all the same
    outer = {"hetero": [3.50, 3.40, 3.46], "stiefel": [3.40, 3.50, 3.45], "none": [3.30, 3.40, 3.35]}
    assert paper.judge(c, outer)[0] == "not reproduced"
    # in order where resolved, one link open: too few seeds, never reproduced
    partly = {"hetero": [3.30, 3.31, 3.30], "stiefel": [3.40, 3.41, 3.40], "none": [3.405, 3.40, 3.41]}
    assert paper.judge(c, partly)[0] == paper.TOO_FEW
    # symmetric: mirrored data gives the mirrored verdict
    mirrored = {"hetero": behind["none"], "stiefel": behind["stiefel"], "none": behind["hetero"]}
    assert paper.judge(c, mirrored)[0] == paper.TOO_FEW
    tuned = paper.claim("sweep.order_tuned")
    assert paper.judge(tuned, behind, caps={"any", "sweep"}, seeds=3)[0] == "not reproduced"


def test_stability_edge_rule_gives_each_verdict_on_made_up_edges():
    c = paper.claim("sweep.stability_edge")
    caps = {"any", "sweep"}
    below = {"dgram": 3, "hetero-inv": 4, "stiefel": 6, "hetero": 5}
    assert paper.judge(c, below, caps=caps, seeds=3)[0] == "reproduced"
    above = {"dgram": 6, "hetero-inv": 5, "stiefel": 3, "hetero": 4}
    assert paper.judge(c, above, caps=caps, seeds=3)[0] == "not reproduced"  # reversed: a finding
    overlap = {"dgram": 3, "hetero-inv": 5, "stiefel": 4, "hetero": 6}
    assert paper.judge(c, overlap, caps=caps, seeds=3)[0] == paper.UNRESOLVED
    tie = {a: 8 for a in below}  # every assignment stable at every rate: no edge inside the sweep
    assert paper.judge(c, tie, caps=caps, seeds=3)[0] == paper.UNRESOLVED
    assert paper.judge(c, below, caps=caps, seeds=1)[0] == paper.TOO_FEW
    assert paper.judge(c, below, caps={"any"}, seeds=3)[0] == paper.NC  # the default config has no sweep
    assert paper.judge(c, {"dgram": 1}, caps=caps, seeds=3)[0] == paper.NC


def test_intervention_and_tuned_order_rules():
    caps = {"any", "sweep"}
    c = paper.claim("sweep.cap_restores")
    assert paper.judge(c, True, caps=caps, seeds=3)[0] == "reproduced"
    assert paper.judge(c, False, caps=caps, seeds=3)[0] == "not reproduced"  # a negative result is a finding
    assert paper.judge(c, True, caps=caps, seeds=2)[0] == paper.TOO_FEW
    assert paper.judge(c, None, caps=caps, seeds=3, reason="nothing to intervene on")[0] == paper.NC
    o = paper.claim("sweep.order_tuned")
    ok = {"hetero": [3.30, 3.31, 3.30], "stiefel": [3.40, 3.41, 3.40], "none": [3.50, 3.51, 3.50]}
    assert paper.judge(o, ok, caps=caps, seeds=3)[0] == "reproduced"
    assert paper.judge(o, {"hetero": ok["none"], "stiefel": ok["stiefel"], "none": ok["hetero"]}, caps=caps,
                       seeds=3)[0] == "not reproduced"
    s = paper.claim("sweep.shared_rate")
    assert paper.judge(s, 2.0, caps=caps, seeds=3)[0] == "reproduced"
    assert paper.judge(s, 4.0, caps=caps, seeds=3)[0] == "not reproduced"


def test_every_claim_is_judged_by_its_rule_kind_and_an_unknown_kind_is_refused():
    assert {c.rule.kind for c in paper.CLAIMS} <= set(paper.JUDGES)
    odd = paper.Claim("x.odd", "a claim", "0", "1.0", paper.Rule("median"))
    with pytest.raises(ValueError, match="claim x.odd: unknown rule kind 'median'"):
        paper.judge(odd, 1.0)
