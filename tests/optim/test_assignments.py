"""mwm.optim.assignments: named assignments and ``grid.custom`` patterns mapped onto the model's
parameters (attention and MLP matrices to their manifolds, everything else to AdamW)."""

import pytest

from mwm.optim.assignments import resolve_assignment
from mwm.train.model import GPT, GPTConfig
from mwm.optim.vocab import PAPER_TRAIN


def tiny_gpt():
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8))


def test_named_assignments_map_attention_and_mlp():
    model = tiny_gpt()
    plan = resolve_assignment(dict(model.named_parameters()), "hetero")
    assert plan["transformer.h.0.attn.c_attn.weight"] == "stiefel"
    assert plan["transformer.h.1.mlp.c_proj.weight"] == "dgram"
    assert plan["transformer.wte.weight"] == "adamw"
    assert plan["transformer.h.0.ln_1.weight"] == "adamw"
    inv = resolve_assignment(dict(model.named_parameters()), "hetero-inv")
    assert inv["transformer.h.0.attn.c_proj.weight"] == "dgram"
    assert all(v == "adamw" for v in resolve_assignment(dict(model.named_parameters()), "adamw").values())


def test_pattern_mapping_per_layer():
    model = tiny_gpt()
    plan = resolve_assignment(
        dict(model.named_parameters()),
        {"transformer.h.0.attn.*": "stiefel", "*.mlp.c_fc.*": "oblique"},
    )
    assert plan["transformer.h.0.attn.c_attn.weight"] == "stiefel"
    assert plan["transformer.h.1.attn.c_attn.weight"] == "none"
    assert plan["transformer.h.1.mlp.c_fc.weight"] == "oblique"


def test_unknown_assignment_and_dead_pattern_are_errors():
    params = dict(tiny_gpt().named_parameters())
    with pytest.raises(ValueError, match="unknown assignment 'heter'.*hetero-inv"):
        resolve_assignment(params, "heter")
    with pytest.raises(ValueError, match=r"match no hidden matrix"):
        resolve_assignment(params, {"*.attn.q_proj.*": "stiefel"})
    with pytest.raises(ValueError, match="unknown manifold 'spd'"):
        resolve_assignment(params, {"*.attn.*": "spd"})


def test_attn_sigma_cap_puts_dgram_attention_in_a_capped_group_and_bounds_its_singular_values():
    import torch

    from mwm.optim.assignments import OptimizerSettings, build_optimizers
    from mwm.optim.solvers import SolverSettings

    torch.manual_seed(0)
    model = tiny_gpt()
    solver = SolverSettings.defaults()
    opts = build_optimizers(model, "dgram", OptimizerSettings.defaults(attn_sigma_cap=1.0, solver=solver))
    opts.set_lr(PAPER_TRAIN["learning_rate"], 2.0)
    capped = [g for g in opts.muon.param_groups if g.get("sigma_cap") is not None]
    assert len(capped) == 1 and capped[0]["manifold"] == "dgram" and capped[0]["sigma_cap"] == 1.0
    assert sorted(capped[0]["names"]) == sorted(n for n in dict(model.named_parameters()) if ".attn.c_" in n)
    for _ in range(5):  # eta 2: uncapped, DGram column norms would grow far past 1
        x = torch.randint(0, 16, (4, 8))
        opts.zero_grad()
        model(x, x)[1].backward()
        opts.step()
    named = dict(model.named_parameters())
    attn = [named[n] for n in capped[0]["names"]]
    mlp = [p for n, p in named.items() if ".mlp.c_" in n]
    assert max(float(torch.linalg.matrix_norm(p.detach(), ord=2)) for p in attn) <= 1.0 + 1e-2
    assert max(float(torch.linalg.matrix_norm(p.detach(), ord=2)) for p in mlp) > 1.5  # the MLP is not capped
    # without the cap the groups are what they were: one per manifold, no sigma_cap key
    plain = build_optimizers(tiny_gpt(), "dgram", OptimizerSettings.defaults(solver=solver))
    assert [g["manifold"] for g in plain.muon.param_groups] == ["dgram"]
    assert all("sigma_cap" not in g for g in plain.muon.param_groups)
    with pytest.raises(ValueError, match="attn_sigma_cap"):
        build_optimizers(tiny_gpt(), "dgram", OptimizerSettings.defaults(attn_sigma_cap=0.0, solver=solver))


def test_mlp_cap_and_normalized_solve_get_groups_of_their_own():
    import torch

    from mwm.optim.assignments import OptimizerSettings, build_optimizers
    from mwm.optim.solvers import SolverSettings

    torch.manual_seed(0)
    model = tiny_gpt()
    solver = SolverSettings.defaults()
    opts = build_optimizers(model, "dgram", OptimizerSettings.defaults(mlp_sigma_cap=1.5, solver_normalize="attn",
                                                                       solver=solver))
    opts.set_lr(PAPER_TRAIN["learning_rate"], 2.0)
    groups = {(g.get("sigma_cap"), g.get("solver_normalize", False)): g for g in opts.muon.param_groups}
    assert set(groups) == {(1.5, False), (None, True)}
    assert all(".mlp.c_" in n for n in groups[1.5, False]["names"])
    assert all(".attn.c_" in n for n in groups[None, True]["names"])
    assert SolverSettings.of_group(groups[None, True]).normalize
    assert not SolverSettings.of_group(groups[1.5, False]).normalize
    for _ in range(5):
        x = torch.randint(0, 16, (4, 8))
        opts.zero_grad()
        model(x, x)[1].backward()
        opts.step()
    for n in groups[1.5, False]["names"]:  # capped, and still on DGram
        W = dict(model.named_parameters())[n].detach().double()
        T = W if W.shape[0] >= W.shape[1] else W.T
        gram = T.T @ T
        assert float(torch.linalg.matrix_norm(W, ord=2)) <= 1.5 * (1 + 1e-5)
        assert float((gram - torch.diag(gram.diagonal())).norm() / gram.diagonal().norm()) < 1e-4
    # a Stiefel weight in scope gets the normalized solve too, which is the paper's there (its scale is 1)
    both = build_optimizers(tiny_gpt(), "hetero-inv", OptimizerSettings.defaults(solver_normalize="all", solver=solver))
    assert all(g.get("solver_normalize") for g in both.muon.param_groups)
    with pytest.raises(ValueError, match="solver_normalize"):
        build_optimizers(tiny_gpt(), "dgram", OptimizerSettings.defaults(solver_normalize="heads", solver=solver))
    with pytest.raises(ValueError, match="mlp_sigma_cap"):
        build_optimizers(tiny_gpt(), "dgram", OptimizerSettings.defaults(mlp_sigma_cap=-1.0, solver=solver))


def test_layer_of_reads_the_block_index_of_nanogpts_names():
    from mwm.optim.assignments import layer_of

    assert layer_of("transformer.h.0.attn.c_attn.weight") == 0
    assert layer_of("_orig_mod.transformer.h.11.mlp.c_proj.weight") == 11
    assert layer_of("transformer.wte.weight") == -1 and layer_of("lm_head.h.weight") == -1


def test_the_rates_have_one_route_and_a_step_before_it_is_refused():
    """build_optimizers takes no rate: the schedule's set_lr is where one enters, and a step before it is
    refused with the weights untouched, not taken at a rate nobody chose."""
    import torch

    from mwm.optim.assignments import build_optimizers

    torch.manual_seed(0)
    model = tiny_gpt()
    opts = build_optimizers(model, "hetero")
    x = torch.randint(0, 16, (4, 8))
    model(x, x)[1].backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="set_lr"):
        opts.step()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    opts.set_lr(1e-3, 0.5)
    assert {g["lr"] for g in opts.adamw.param_groups} == {1e-3} and {g["lr"] for g in opts.muon.param_groups} == {0.5}
    opts.step()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
