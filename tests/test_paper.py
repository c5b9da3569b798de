"""mwm.paper: the paper's claims and their verdict rules, fixed before the data, judged by one pure
function (``judge``) the same way whichever way a result falls."""

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


def test_every_claim_has_a_section_a_paper_value_and_a_stated_rule():
    ids = [c.id for c in paper.CLAIMS]
    assert len(ids) == len(set(ids))
    for c in paper.CLAIMS:
        assert c.section and c.paper and c.rule.describe(), c.id
        if c.rule.kind == "window":
            assert c.rule.lo <= c.rule.hi, c.id
        if c.rule.needs != "any":
            assert c.rebuild, c.id  # a row that cannot be rebuilt here names the config that can


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


def test_restore_rule_falls_either_way_and_needs_failures_to_restore():
    caps = {"any", "mechanism"}
    cap, control = paper.claim("mech.cap_restores"), paper.claim("mech.mlp_cap_control")
    assert paper.judge(cap, (8, 10), caps=caps, seeds=6)[0] == "reproduced"
    assert paper.judge(cap, (2, 10), caps=caps, seeds=6)[0] == "not reproduced"
    assert paper.judge(cap, (5, 10), caps=caps, seeds=6)[0] == paper.UNRESOLVED
    assert paper.judge(cap, (3, 3), caps=caps, seeds=6)[0] == paper.UNRESOLVED  # too few failed cells
    # the negative control is judged the other way round on the same numbers
    assert paper.judge(control, (2, 10), caps=caps, seeds=6)[0] == "reproduced"
    assert paper.judge(control, (8, 10), caps=caps, seeds=6)[0] == "not reproduced"
    assert paper.judge(cap, (8, 10), caps=caps, seeds=3)[0] == paper.TOO_FEW
    assert paper.judge(cap, (8, 10), caps={"any"}, seeds=6)[0] == paper.NC


def test_cause_rule_gives_every_verdict():
    caps = {"any", "mechanism"}
    c = paper.claim("mech.cause")

    def v(cap, normalized, control):
        return paper.judge(c, {"cap": cap, "normalized": normalized, "mlp_control": control}, caps=caps, seeds=6)[0]

    assert v(True, False, True) == "saturation supported"
    assert v(True, True, False) == "solver supported"  # the MLP cap restores too: not attention-specific
    assert v(False, True, True) == "solver supported"
    assert v(True, True, True) == "both supported"
    assert v(False, False, True) == "neither supported"
    assert v(True, False, False) == "neither supported"
    assert v(None, True, True) == paper.UNRESOLVED
    assert v(True, None, True) == paper.UNRESOLVED
    assert v(True, False, None) == paper.UNRESOLVED
    assert v(False, False, None) == "neither supported"  # the control does not matter without the cap
    assert set(paper.CAUSE_VERDICTS) <= set(paper.VERDICTS)


def test_mechanism_failure_margin_is_the_divergence_rules_threshold():
    from mwm.config import defaults

    assert paper.FAIL_MARGIN == defaults("train")["divergence"]["threshold"]
    c = paper.claim("mech.fails")
    caps = {"any", "mechanism"}
    assert paper.judge(c, 0.75, caps=caps, seeds=6)[0] == "reproduced"
    assert paper.judge(c, 0.25, caps=caps, seeds=6)[0] == "not reproduced"
