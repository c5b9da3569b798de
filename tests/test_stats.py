"""mwm.stats: the exact binomial interval and test, and Holm's step-down, against textbook values."""

import itertools

import pytest

from mwm.stats import binomial_p, clopper_pearson, holm, holm_adjusted


def test_clopper_pearson_matches_known_values():
    assert clopper_pearson(0, 12)[0] == 0.0
    assert clopper_pearson(0, 12)[1] == pytest.approx(0.2646, abs=5e-4)
    assert clopper_pearson(12, 12) == (pytest.approx(0.7354, abs=5e-4), 1.0)
    lo, hi = clopper_pearson(6, 12)
    assert (round(lo, 3), round(hi, 3)) == (0.211, 0.789)
    lo, hi = clopper_pearson(5, 10)  # the textbook 5 of 10: 0.187-0.813
    assert (round(lo, 3), round(hi, 3)) == (0.187, 0.813)
    # k = 0: the upper bound solves (1 - p)^n = alpha / 2 in closed form
    assert clopper_pearson(0, 20, 0.9)[1] == pytest.approx(1 - 0.05 ** (1 / 20), abs=1e-12)
    for bad in ((-1, 5), (6, 5), (0, 0)):
        with pytest.raises(ValueError):
            clopper_pearson(*bad)
    with pytest.raises(ValueError):
        binomial_p(3, 2)


def test_binomial_p_is_dual_to_the_interval():
    assert binomial_p(6, 12) == 1.0
    assert binomial_p(12, 12) == pytest.approx(2 / 4096)
    assert binomial_p(0, 12) == binomial_p(12, 12)  # symmetric under p0 = 0.5
    for alpha, p0 in itertools.product((0.05, 0.01, 0.05 / 4, 0.2), (0.5, 0.3)):
        for n in range(1, 21):
            for k in range(n + 1):
                lo, hi = clopper_pearson(k, n, 1 - alpha)
                assert (binomial_p(k, n, p0) < alpha) == (lo > p0 or hi < p0), (alpha, p0, k, n)


def test_holm_on_a_textbook_example():
    # four hypotheses at alpha = 0.05: 0.005 <= 0.0125 and 0.01 <= 0.0167 rejected, 0.03 > 0.025 stops the step-down
    p = {"H1": 0.01, "H2": 0.04, "H3": 0.03, "H4": 0.005}
    assert holm(p, 0.05) == {"H1": True, "H2": False, "H3": False, "H4": True}
    assert holm({"a": 0.04, "b": 0.04}) == {"a": False, "b": False}  # 0.04 > 0.05 / 2
    assert holm({"a": 0.02, "b": 0.024}) == {"a": True, "b": True}  # stepped down to 0.05 / 1
    assert holm({"a": 0.04}) == {"a": True}
    assert holm({}) == {}
    adj = holm_adjusted(p)
    for alpha in (0.01, 0.02, 0.05, 0.1):
        assert {k: v <= alpha for k, v in adj.items()} == holm(p, alpha)
    with pytest.raises(ValueError):
        holm({"a": 1.5})
