"""Divergence is caught where it first shows, on every optimizer path, by construction.

Each test plants the bad value itself (no dependence on when float rounding would
produce it): a FloatingPointError names what went wrong, before any LAPACK call
(eigh, svdvals) sees the values, and the weights are left as they were.
"""

from __future__ import annotations

import json

import pytest
import torch

import fakedata
from mwm.optim.assignments import build_optimizers
from mwm.optim.manifolds import get_manifold
from mwm.train.model import GPT, GPTConfig
from mwm.optim.solvers import SolverSettings
from mwm.optim.muon import ManifoldMuon
from mwm.train.cli import main
from mwm.optim.vocab import PAPER_TRAIN

BIG = 1e20  # finite, but its squares overflow float32: a Gram matrix of it is Inf


def muon(manifold, retraction="paper", shape=(24, 8), lr=0.02):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(*shape))
    opt = ManifoldMuon([{"params": [p], "names": ["w"], "manifold": manifold}], lr=lr,
                       dgram_retraction=retraction, solver=SolverSettings.defaults(steps=3))
    p.grad = torch.randn(*shape)
    return p, opt


CASES = [("none", "paper"), ("stiefel", "paper"), ("dgram", "paper"), ("dgram", "colnorm"), ("oblique", "paper")]


@pytest.mark.parametrize("manifold,retraction", CASES)
@pytest.mark.parametrize("plant", ["grad_nan", "grad_big", "momentum_inf", "weight_big", "weight_nan", "lr_huge"])
def test_muon_refuses_every_bad_value_and_leaves_weights(manifold, retraction, plant):
    p, opt = muon(manifold, retraction)
    if plant == "grad_nan":
        p.grad[0, 0] = float("nan")
    elif plant == "grad_big":
        p.grad.fill_(BIG)
    elif plant == "momentum_inf":
        opt.state[p]["momentum_buffer"] = torch.full_like(p, float("inf"))
    elif plant == "weight_big":
        with torch.no_grad():
            p.mul_(BIG)
    elif plant == "weight_nan":
        with torch.no_grad():
            p[3, 2] = float("nan")
    elif plant == "lr_huge":
        opt.param_groups[0]["lr"] = 1e38
    before = p.detach().clone()
    buf_before = opt.state[p].get("momentum_buffer")
    buf_before = None if buf_before is None else buf_before.clone()
    with pytest.raises(FloatingPointError, match=r"\[w\]|gradient"):
        opt.step()
    assert torch.equal(p.detach(), before) or (plant == "weight_nan" and torch.equal(p.isnan(), before.isnan()))
    if buf_before is not None and plant != "momentum_inf":
        assert torch.equal(opt.state[p]["momentum_buffer"], buf_before)


@pytest.mark.parametrize("retraction", ["paper", "colnorm"])
def test_dgram_retraction_refuses_a_non_finite_gram_before_eigh(retraction):
    mf = get_manifold("dgram", retraction)
    W = torch.randn(2, 16, 8)
    W[1, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="Gram"):
        mf.retract(W)
    with pytest.raises(FloatingPointError, match="Gram"):
        mf.retract(torch.randn(16, 8, dtype=torch.float64) * 1e160)  # its Gram overflows even float64
    # a float32 weight whose Gram overflows float32 is retracted in float64 (mwm.optim.manifolds): finite
    assert torch.isfinite(mf.retract(torch.randn(16, 8) * BIG)).all()


def tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16, bias=True))


@pytest.mark.parametrize("assignment", ["adamw", "dgram"])
def test_adamw_weights_and_gradients_are_checked(assignment):
    model = tiny_model()
    opts = build_optimizers(model, assignment)
    opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
    x = torch.randint(0, 32, (2, 8))
    model(x, x)[1].backward()
    wte = model.transformer.wte.weight
    wte.grad[0, 0] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(FloatingPointError, match="wte"):
        opts.step()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # refused before any write
    wte.grad.zero_()
    with torch.no_grad():
        wte.fill_(1e18)  # finite; the step leaves it so (its squared norm overflows)
    with pytest.raises(FloatingPointError, match="AdamW weight of \\[transformer.wte.weight"):
        opts.step()


@pytest.mark.parametrize("assignment", ["dgram", "adamw"])
def test_planted_overflow_ends_the_run_unstable_at_that_step(tmp_path, monkeypatch, assignment):
    """Whatever the site, the run is a completed job: unstable, onset at the planted step,
    pairs file 'not captured' with its reason, every other output present."""
    import mwm.train.loop as T

    orig = T.Run.train_step

    def train_step(self):
        if self.step == 3:
            with torch.no_grad():
                self.model.transformer.h[0].mlp.c_fc.weight.mul_(BIG)
        return orig(self)

    monkeypatch.setattr(T.Run, "train_step", train_step)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__capture_pairs_step=6)
    assert main(["--config", str(cfg), "--assignment", assignment, "--seed", "0", "--out", str(tmp_path / "o")],
                data=fakedata.TOKENS) == 0
    d = tmp_path / "o" / "runs" / "tiny" / assignment / "seed0"
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "unstable" and s["onset_step"] == 3 and s["steps_done"] == 3
    import numpy as np

    with np.load(d / "pairs.npz") as z:
        assert not bool(z["captured"]) and str(z["reason"])
    for f in ("metrics.csv", "eval.csv", "spectral.csv", "attention.csv", "final.pt"):
        assert (d / f).is_file()
