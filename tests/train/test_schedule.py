"""mwm.train.schedule: the released code's learning-rate schedule (nanoGPT's warmup and cosine decay),
with the Muon rate proportional to the AdamW one."""

import math

import pytest

from mwm.train.schedule import adamw_lr, learning_rates, muon_lr, muon_lr_series

TRAIN = {"learning_rate": 6e-4, "min_lr": 6e-5, "warmup_iters": 10, "lr_decay_iters": 100, "max_iters": 120,
         "muon_lr": 0.02}


def test_linear_warmup_then_cosine_to_the_floor_then_flat():
    lr = [adamw_lr(t, 6e-4, 6e-5, 10, 100) for t in range(120)]
    assert lr[0] == pytest.approx(6e-4 / 11) and lr[9] == pytest.approx(6e-4 * 10 / 11)
    assert all(a < b for a, b in zip(lr[:10], lr[1:11]))  # warmup rises
    assert lr[10] == pytest.approx(6e-4)  # cos(0): the peak right after warmup
    assert lr[55] == pytest.approx(6e-5 + 0.5 * (6e-4 - 6e-5))  # halfway through the decay
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))  # then never rises
    assert lr[100] == pytest.approx(6e-5) and set(lr[101:]) == {6e-5}


def test_without_decay_the_rate_is_constant():
    assert {adamw_lr(t, 1e-3, 1e-4, 10, 100, decay_lr=False) for t in range(0, 200, 7)} == {1e-3}


def test_muon_rate_follows_the_adamw_rate_proportionally():
    for t in (0, 5, 10, 50, 100, 110):
        adamw, muon = learning_rates(t, TRAIN)
        assert muon == pytest.approx(0.02 * adamw / 6e-4, rel=1e-12)
        assert muon_lr(t, TRAIN) == muon
    assert math.isclose(muon_lr(10, TRAIN), 0.02)


def test_series_has_one_rate_per_step():
    series = muon_lr_series(TRAIN)
    assert len(series) == 120 and series[:30] == muon_lr_series(TRAIN, 30)
    assert series == [muon_lr(t, TRAIN) for t in range(120)]
