"""mwm.plan.variants: a learning-rate sweep expands into one variant per (assignment, rate), each trained
with its assignment's settings and its rate; the intervention pairs are checked before any job."""

import copy
from pathlib import Path

import pytest

from mwm.plan.checks import check_config
from mwm.config import ConfigError, load_config, validate
from mwm.plan.runs import config_run_identity, grid_variants, run_config
from mwm.plan.variants import assignment_spec
from mwm.plan.variants import (intervention_keys, intervention_label, rate_label, sweep_overrides, sweep_points,
                                   sweep_variant)

ROOT = Path(__file__).resolve().parents[2]


def sweep_cfg(**grid):
    cfg = {"name": "t", "train": {"muon_lr": 0.02, "learning_rate": 1e-3, "min_lr": 1e-4},
           "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16},
           "workflow": {"report": "sweep"},
           "grid": {"assignments": ["stiefel", "dgram", "dgram-capped"],
                    "custom": {"dgram-capped": {"*.attn.*": "dgram", "*.mlp.*": "dgram"}},
                    "train_overrides": {"dgram-capped": {"attn_sigma_cap": 1.0}},
                    "intervention": {"dgram-capped": "dgram"},
                    "sweep": {"muon_lr": [0.01, 0.02, 0.64]}, **grid}}
    return validate(cfg)


def test_rate_labels_have_no_sign_or_exponent_over_the_schema_range():
    for r in (1e-4, 0.005, 0.02, 0.64, 1.28, 1000):
        label = rate_label(r)
        assert float(label) == r and not set(label) & set("e+-")
    assert sweep_variant("hetero-inv", 0.04) == "hetero-inv-eta0.04"
    for bad in (5e-5, 2000):
        with pytest.raises(ConfigError, match="muon_lr"):
            sweep_cfg(sweep={"muon_lr": [0.02, bad]})


def test_sweep_expands_to_one_variant_per_assignment_and_rate():
    cfg = sweep_cfg()
    v = grid_variants(cfg["grid"])
    assert v == [f"{a}-eta{r}" for a in ("stiefel", "dgram", "dgram-capped") for r in ("0.01", "0.02", "0.64")]
    assert sweep_points(cfg["grid"])["dgram-capped-eta0.64"] == ("dgram-capped", 0.64)
    assert assignment_spec(cfg["grid"], "stiefel-eta0.64") == "stiefel"
    assert assignment_spec(cfg["grid"], "dgram-capped-eta0.01") == {"*.attn.*": "dgram", "*.mlp.*": "dgram"}
    # without a sweep, nothing changes
    plain = copy.deepcopy(cfg["grid"])
    plain["sweep"] = None
    assert grid_variants(plain) == ["stiefel", "dgram", "dgram-capped"]
    assert sweep_points(plain) == {}


def test_a_sweep_variant_trains_its_assignment_at_its_rate():
    cfg = sweep_cfg()
    tc = run_config(cfg, "dgram-capped-eta0.64")["train"]
    assert tc["muon_lr"] == 0.64 and tc["attn_sigma_cap"] == 1.0  # the assignment's overrides, then the rate
    assert tc["learning_rate"] == 1e-3 and tc["min_lr"] == 1e-4  # adamw: fixed (the default)
    assert "attn_sigma_cap" not in run_config(cfg, "dgram-eta0.64")["train"]
    # the shared rate's variant trains the config's own settings
    assert run_config(cfg, "stiefel-eta0.02")["train"] == cfg["train"]
    scaled = sweep_cfg(sweep={"muon_lr": [0.02, 0.08], "adamw": "scaled"})
    tc = run_config(scaled, "stiefel-eta0.08")["train"]
    assert tc["learning_rate"] == pytest.approx(4e-3) and tc["min_lr"] == pytest.approx(4e-4)
    assert sweep_overrides(cfg["train"], {"adamw": "fixed"}, 0.16) == {"muon_lr": 0.16}
    # the rate is part of a run's identity: two rates are two runs
    assert config_run_identity(cfg, "stiefel-eta0.01", 0) != config_run_identity(cfg, "stiefel-eta0.02", 0)


def test_attn_sigma_cap_has_no_default_so_existing_runs_keep_their_identity():
    cfg = load_config(ROOT / "config" / "config.yaml")
    assert "attn_sigma_cap" not in cfg["train"]


@pytest.mark.parametrize("change,match", [
    (lambda c: c["train"].update(muon_lr=0.03), "does not include train.muon_lr"),
    (lambda c: c["grid"].update(retraction_ablation=True), "retraction_ablation"),
    (lambda c: c["workflow"].update(report="full"), "workflow.report"),
    (lambda c: c["grid"]["train_overrides"]["dgram-capped"].update(muon_lr=0.1), "nothing else"),
    (lambda c: c["grid"]["custom"]["dgram-capped"].update({"*.mlp.*": "stiefel"}), "baseline's manifolds"),
    (lambda c: c["grid"]["intervention"].update({"dgram-capped": "hetero"}), "not in grid.assignments"),
    (lambda c: c["grid"].update(sweep=None), "grid.sweep"),
    (lambda c: (c["grid"]["custom"]["dgram-capped"].update({"*.attn.*": "stiefel"}),
                c["grid"]["intervention"].update({"dgram-capped": "hetero"}),
                c["grid"]["assignments"].append("hetero")), "no attention matrix on DGram"),
])
def test_check_config_refuses_a_sweep_the_rest_of_the_config_contradicts(change, match):
    cfg = sweep_cfg()
    check_config(cfg, "sweep.yaml")  # the unchanged one passes
    change(cfg)
    with pytest.raises(ConfigError, match=match) as exc:
        check_config(cfg, "sweep.yaml")
    assert "sweep.yaml" in str(exc.value)


def test_the_sweep_configs_expand_as_documented():
    cfg = load_config(ROOT / "config" / "sweep.yaml")
    check_config(cfg, "config/sweep.yaml")
    rates = cfg["grid"]["sweep"]["muon_lr"]
    assert len(rates) >= 5 and all(b == pytest.approx(2 * a) for a, b in zip(rates, rates[1:]))  # spaced 2x
    assert min(rates) < cfg["train"]["muon_lr"] < max(rates)  # bracketing the shared rate
    assert len(cfg["grid"]["seeds"]) >= 3
    assert len(grid_variants(cfg["grid"])) == len(cfg["grid"]["assignments"]) * len(rates)
    for name in ("ci-sweep", "sweep-gpt2"):
        other = load_config(ROOT / "config" / f"{name}.yaml")
        check_config(other, f"config/{name}.yaml")
        assert other["workflow"]["report"] == "sweep"


@pytest.mark.parametrize("over,match", [
    ({"mlp_sigma_cap": 4.0}, None),
    ({"solver_normalize": "all"}, None),
    ({"solver_normalize": "attn", "attn_sigma_cap": 4.0}, None),
    ({"attn_qk_scale": 4.0}, None),
    ({"attn_qk_scale": None}, "one or more of"),
    ({}, "one or more of"),
    ({"solver_normalize": None}, "one or more of"),
    ({"solver": "admm"}, "need solver_normalize: all"),
    ({"solver_normalize": "attn", "admm_rho": 1.0}, "need solver_normalize: all"),
    ({"solver_normalize": "all", "solver": "admm", "admm_rho": 1.0, "dual_ascent_steps": 10}, None),
    ({"solver_normalize": "all", "warm_start": True}, "nothing else"),
])
def test_interventions_may_cap_either_module_or_normalize_the_solve(over, match):
    cfg = sweep_cfg()
    cfg["grid"]["train_overrides"]["dgram-capped"] = over
    if match is None:
        check_config(cfg, "sweep.yaml")
        assert intervention_keys(cfg["grid"], "dgram-capped") == over
        assert intervention_label(cfg["grid"], "dgram-capped")
    else:
        with pytest.raises(ConfigError, match=match):
            check_config(cfg, "sweep.yaml")


def test_an_intervention_on_a_module_with_no_dgram_matrix_is_refused():
    cfg = sweep_cfg()
    cfg["grid"]["assignments"].append("hetero-inv-mlpcap")
    cfg["grid"]["custom"]["hetero-inv-mlpcap"] = {"*.attn.*": "dgram", "*.mlp.*": "stiefel"}
    cfg["grid"]["train_overrides"]["hetero-inv-mlpcap"] = {"mlp_sigma_cap": 4.0}
    cfg["grid"]["assignments"].append("hetero-inv")
    cfg["grid"]["intervention"]["hetero-inv-mlpcap"] = "hetero-inv"
    with pytest.raises(ConfigError, match="no MLP matrix on DGram"):
        check_config(cfg, "sweep.yaml")


def test_attn_qk_scale_has_no_default_accepts_null_or_a_positive_number_and_is_labelled():
    cfg = load_config(ROOT / "config" / "config.yaml")
    assert "attn_qk_scale" not in cfg["train"]  # existing runs keep their identity
    for ok in (None, 4, 8.0, 0.5):
        assert validate({"name": "t", "train": {"attn_qk_scale": ok}})["train"]["attn_qk_scale"] == ok
    for bad in (0, 0.0, -4.0, "4"):
        with pytest.raises(ConfigError, match="train.attn_qk_scale"):
            validate({"name": "t", "train": {"attn_qk_scale": bad}})
    cfg = sweep_cfg()
    cfg["grid"]["train_overrides"]["dgram-capped"] = {"attn_qk_scale": 4.0}
    check_config(cfg, "sweep.yaml")
    assert run_config(cfg, "dgram-capped-eta0.64")["train"]["attn_qk_scale"] == 4.0
    assert "attn_qk_scale" not in run_config(cfg, "dgram-eta0.64")["train"]
    assert intervention_label(cfg["grid"], "dgram-capped") == "attention logits on unit queries and keys at scale 4"
    cfg["grid"]["train_overrides"]["dgram-capped"] = {"attn_qk_scale": -1.0}
    with pytest.raises(ConfigError, match="grid.train_overrides.dgram-capped -> train.attn_qk_scale"):
        run_config(cfg, "dgram-capped-eta0.64")  # refused where the overrides merge too


def test_attn_qk_scale_changes_the_model_so_it_needs_no_dgram_attention():
    """The other keys act through the DGram update; the logit scale acts on every model."""
    cfg = sweep_cfg()
    cfg["grid"]["assignments"] += ["hetero", "hetero-qk"]
    cfg["grid"]["custom"]["hetero-qk"] = {"*.attn.*": "stiefel", "*.mlp.*": "dgram"}
    cfg["grid"]["train_overrides"]["hetero-qk"] = {"attn_qk_scale": 4.0}
    cfg["grid"]["intervention"]["hetero-qk"] = "hetero"
    check_config(cfg, "sweep.yaml")
    cfg["grid"]["train_overrides"]["hetero-qk"] = {"attn_sigma_cap": 4.0}
    with pytest.raises(ConfigError, match="no attention matrix on DGram"):
        check_config(cfg, "sweep.yaml")


def test_arm_kind_is_the_one_kind_all_of_an_arms_settings_make():
    """One classifier for every causal experiment, each with its own table of kinds."""
    from mwm.plan.variants import arm_kind

    kinds = {("attn_sigma_cap", None): "cap", ("solver_normalize", "all"): "solver", ("solver", "admm"): "solver"}
    over = {"a": {"attn_sigma_cap": 2.0}, "b": {"attn_sigma_cap": 2.0, "solver_normalize": "all"},
            "c": {"solver_normalize": "all", "solver": "admm"}, "d": {"solver": "admm"},
            "e": {"solver_normalize": "attn"}, "f": {"attn_sigma_cap": 2.0}}
    grid = {"train_overrides": over, "intervention": {k: "dgram" for k in "abcde"}}
    assert arm_kind(grid, "a", kinds) == "cap" and arm_kind(grid, "c", kinds) == "solver"
    assert arm_kind(grid, "b", kinds) is None  # two kinds at once: no single contrast
    assert arm_kind(grid, "d", kinds) is None  # a solve setting without the scope it acts on
    assert arm_kind(grid, "e", kinds) is None  # a value the table has no kind for
    assert arm_kind(grid, "f", kinds) is None and arm_kind(grid, "dgram", kinds) is None  # not intervention arms
