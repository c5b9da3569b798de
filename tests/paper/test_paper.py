"""mwm.paper: the paper's claims, each with its section, its stated value and the rule fixed before the data."""

from mwm import paper


def test_every_claim_has_a_section_a_paper_value_and_a_stated_rule():
    ids = [c.id for c in paper.CLAIMS]
    assert len(ids) == len(set(ids))
    for c in paper.CLAIMS:
        assert c.section and c.paper and c.rule.describe(), c.id
        if c.rule.kind == "window":
            assert c.rule.lo <= c.rule.hi, c.id
        if c.rule.needs != "any":
            assert c.rebuild, c.id  # a row that cannot be rebuilt here names the config that can
