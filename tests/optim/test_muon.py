import copy

import pytest
import torch
from torch import nn

from mwm.optim.assignments import OptimizerSettings, build_optimizers
from mwm.optim.dual_ascent import manifold_muon_update
from mwm.optim.manifolds import get_manifold
from mwm.optim.msign import msign
from mwm.config.names import NAMED_ASSIGNMENTS
from mwm.optim import muon as optim_mod
from mwm.optim.muon import ManifoldMuon
from mwm.optim.solvers import SolverSettings
from mwm.optim.vocab import PAPER_TRAIN


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.attn.c_proj = nn.Linear(d, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp.c_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        x = self.ln_1(x)
        x = x + self.attn.c_proj(self.attn.c_attn(x)[..., : x.shape[-1]])
        return x + self.mlp.c_proj(torch.relu(self.mlp.c_fc(x)))


class Tiny(nn.Module):
    def __init__(self, d=8, layers=2, vocab=11):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, d)
        self.transformer.h = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for b in self.transformer.h:
            x = b(x)
        return self.head(x)


def loss_of(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 11, (4, 5), generator=g)
    return nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())


def train(model, opts, steps=3):
    opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
    for s in range(steps):
        opts.zero_grad()
        loss_of(model, s).backward()
        opts.step()


@pytest.mark.parametrize("assignment", [a for a in NAMED_ASSIGNMENTS if a != "adamw"])
def test_constrained_weights_start_and_stay_on_manifold(assignment):
    torch.manual_seed(0)
    model = Tiny()
    opts = build_optimizers(model, assignment, OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=5)))
    train(model, opts)
    for name, p in model.named_parameters():
        mf = opts.assignment[name]
        if mf in ("stiefel", "dgram", "oblique"):
            assert get_manifold(mf).constraint_residual(p.detach()) < 5e-4, name


def test_optimizer_matches_reference_math_for_one_step():
    torch.manual_seed(1)
    W0 = torch.randn(24, 8)
    G = torch.randn(24, 8)
    for mf in ["none", "stiefel", "dgram"]:
        p = nn.Parameter(W0.clone())
        opt = ManifoldMuon([{"params": [p], "manifold": mf}], lr=0.05, weight_decay=0.1,
                           solver=SolverSettings.defaults(steps=7))
        start = p.detach().clone()
        p.grad = G.clone()
        opt.step()
        u = G + 0.95 * G  # Nesterov on a fresh buffer: buf = g, u = g + mu buf
        if mf == "none":
            ref = start * (1 - 0.05 * 0.1) - 0.05 * msign(u)
        else:
            ref = manifold_muon_update(start, u, mf, eta=0.05, alpha=0.1, steps=7)
        assert torch.allclose(p.detach(), ref, atol=1e-5), mf


@pytest.mark.parametrize("mf", ["none", "stiefel", "dgram"])
def test_banks_equal_unbatched_updates(mf):
    # a wide matrix joins the bank of its transposed shape; small matrices of equal width
    # share a zero-padded bank (no square ones here: their updates are chaotic in float32)
    torch.manual_seed(2)
    shapes = [(16, 6), (16, 6), (6, 16), (10, 6), (6, 12)]
    ws = [torch.randn(*s) for s in shapes]
    gs = [torch.randn(*s) for s in shapes]
    ps = [nn.Parameter(w.clone()) for w in ws]
    opt = ManifoldMuon([{"params": ps, "manifold": mf}], solver=SolverSettings.defaults(steps=6))
    singles = [nn.Parameter(w.clone()) for w in ws]
    opts1 = [ManifoldMuon([{"params": [q], "manifold": mf}], solver=SolverSettings.defaults(steps=6)) for q in singles]
    for _ in range(2):
        for p, q, g in zip(ps, singles, gs):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        for o in opts1:
            o.step()
    for p, q in zip(ps, singles):
        assert p.shape == q.shape
        assert torch.allclose(p, q, atol=1e-5)
    for p, q, o in zip(ps, singles, opts1):  # momentum kept in the parameter's own orientation
        assert torch.allclose(opt.state[p]["momentum_buffer"], o.state[q]["momentum_buffer"])
    assert len(optim_mod._banks(ps)) == 1 and len(optim_mod._banks(ps, pad=False)) == 3


@pytest.mark.slow
def test_state_dict_round_trip_is_exact():
    torch.manual_seed(3)
    model = Tiny()
    opts = build_optimizers(model, "hetero", OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)))
    train(model, opts, steps=2)
    clone = copy.deepcopy(model)
    opts2 = build_optimizers(clone, "hetero", OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)),
                             init_on_manifold=False)
    opts2.load_state_dict(copy.deepcopy(opts.state_dict()))
    train(model, opts, steps=2)
    train(clone, opts2, steps=2)
    for (n, a), (_, b) in zip(model.named_parameters(), clone.named_parameters()):
        assert torch.equal(a, b), n
    sd1, sd2 = opts.state_dict(), opts2.state_dict()
    for k, v in sd1["muon"]["state"].items():
        assert torch.equal(v["momentum_buffer"], sd2["muon"]["state"][k]["momentum_buffer"])


def test_nan_gradient_raises_and_writes_nothing():
    torch.manual_seed(4)
    model = Tiny()
    opts = build_optimizers(model, "stiefel", OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=3)))
    train(model, opts, steps=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {k: v["momentum_buffer"].clone() for k, v in opts.muon.state_dict()["state"].items()}
    opts.zero_grad()
    loss_of(model).backward()
    model.transformer.h[1].mlp.c_fc.weight.grad[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"transformer\.h\.1\.mlp\.c_fc\.weight.*no parameter was updated"):
        opts.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    for k, v in opts.muon.state_dict()["state"].items():
        assert torch.equal(v["momentum_buffer"], buffers[k])


def test_non_matrix_and_bad_manifold_rejected():
    with pytest.raises(ValueError, match="2-D weight matrices only"):
        ManifoldMuon([{"params": [nn.Parameter(torch.ones(4))], "manifold": "stiefel", "names": ["ln.weight"]}])
    with pytest.raises(ValueError, match="unknown manifold 'grassmann'"):
        ManifoldMuon([{"params": [nn.Parameter(torch.ones(4, 4))], "manifold": "grassmann"}])


def test_the_newton_schulz_polar_trains_as_eigh_does_and_is_read_from_the_train_section():
    """``train.dgram_polar`` reaches every DGram retraction of the optimizer (through
    OptimizerSettings), and the batched solve trains All DGram to eigh's weights within float32's
    rounding; an optimizer whose groups predate the key (an older checkpoint's) retracts by eigh."""
    from mwm.config.names import PAPER_TRAIN

    settings = OptimizerSettings.from_train({**PAPER_TRAIN, "dual_ascent_steps": 4, "dgram_polar": "newton-schulz"})
    assert settings.dgram_polar == "newton-schulz"
    assert OptimizerSettings.from_train({**PAPER_TRAIN}).dgram_polar is None
    models = {}
    for polar in ("eigh", "newton-schulz"):
        torch.manual_seed(5)
        model = Tiny(d=16)
        opts = build_optimizers(model, "dgram", OptimizerSettings.defaults(
            solver=SolverSettings.defaults(steps=4), dgram_polar=polar))
        assert {g["dgram_polar"] for g in opts.muon.param_groups if g["manifold"] == "dgram"} == {polar}
        train(model, opts, steps=3)
        models[polar] = model
    for (n, a), (_, b) in zip(models["eigh"].named_parameters(), models["newton-schulz"].named_parameters()):
        assert float((a - b).detach().norm()) <= 1e-5 * float(a.detach().norm()), n
    torch.manual_seed(5)
    model = Tiny(d=16)
    opts = build_optimizers(model, "dgram", OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)))
    for g in opts.muon.param_groups:
        del g["dgram_polar"]
    train(model, opts, steps=3)
    for (n, a), (_, b) in zip(models["eigh"].named_parameters(), model.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(ValueError, match="unknown dgram_polar 'qr'"):
        ManifoldMuon([{"params": [nn.Parameter(torch.ones(4, 4))], "manifold": "dgram"}], dgram_polar="qr")
