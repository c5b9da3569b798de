"""mwm.report.mechanism2: runs -> the failure rule and both manipulation checks -> one contrast per baseline
and intervention -> the mech2.* values and verdicts, on made-up runs whose answers are known
(config/mechanism2.yaml's arms, rates and seeds)."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from mwm import paper
from mwm.config import load_config
from mwm.report.ledger import build_mechanism2_ledger
from mwm.report.mechanism2 import (arm_kind, contrast_rows, mechanism2_contrasts, mechanism2_ledger_values,
                                   mechanism2_results, mechanism2_tables)
from mwm.train import manipulation
from mwm.plan.variants import sweep_points

#: The second round, whose arms and rates these tests build.
ROUND2 = paper.ROUNDS["mechanism2"]

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(ROOT / "config" / "mechanism2.yaml")
SEEDS = CFG["grid"]["seeds"]
STEPS = (0, 50, 100, 150, 200)


def _logs(solver_ok: bool, saturated: bool):
    """solver.csv and attention.csv rows of a run whose solve follows the momentum or not and whose softmax
    is saturated or not, at every evaluation."""
    align = 0.95 if solver_ok else 0.3
    sol = pd.DataFrame([{"step": s, "module": m, "alignment": align, "alignment_converged": 1.0,
                         "violation": 0.01 if solver_ok else 0.2} for s in STEPS for m in ("attn", "mlp")])
    ent = 0.02 if saturated else 2.0
    att = pd.DataFrame([{"step": s, "layer": layer, "entropy_mean": ent} for s in STEPS for layer in range(4)])
    return sol, att


def runs(loss, solver_ok=lambda arm: True, saturated=lambda arm: False):
    """Made-up runs of every sweep point: ``loss(arm, rate, seed)`` -> final val loss, or None for a run that did
    not complete; ``solver_ok`` / ``saturated`` (per arm) shape its logs."""
    out = {}
    for variant, (arm, rate) in sweep_points(CFG["grid"]).items():
        sol, att = _logs(solver_ok(arm), saturated(arm))
        for seed in SEEDS:
            x = loss(arm, rate, seed)
            out[variant, seed] = SimpleNamespace(
                summary={"status": "completed" if x is not None else "unstable"},
                eval=pd.DataFrame({"val_loss": [7.6, 7.6 if x is None else x]}), solver=sol, attention=att)
    return out


def kind(arm):
    return arm_kind(CFG["grid"], arm)


def base(arm):
    return CFG["grid"]["intervention"].get(arm, arm)


def world(restores=(), fails=lambda rate: True, harm=(), **logs):
    """Stiefel 5.0, Hetero 5.1 (the failure threshold is 5.6); a plain DGram-attention arm fails where
    ``fails(rate)`` (half of it by divergence, half by stalling at 6.5), else 5.05; an intervention whose
    (baseline, kind) is in ``restores`` trains (5.05), one in ``harm`` fails where its plain arm trained."""
    def loss(arm, rate, seed):
        if arm in ("stiefel", "hetero"):
            return 5.0 if arm == "stiefel" else 5.1
        key = (base(arm), kind(arm))
        failing = fails(rate) and key not in restores or not fails(rate) and key in harm
        if not failing:
            return 5.05
        return None if seed % 2 else 6.5
    return mechanism2_results(CFG, runs(loss, **logs))


def verdicts(res, cfg=CFG):
    ledger = build_mechanism2_ledger(cfg, res).set_index("id")
    return {cid: ledger.loc[cid, "verdict"] for cid in ledger.index if cid.startswith("mech2.")}


def test_the_arms_of_the_config_are_the_kinds_the_rules_name():
    kinds = {(base(c), kind(c)) for c in CFG["grid"]["intervention"]}
    assert kinds == {(b, k) for b in paper.MECH2_BASELINES for k in ROUND2.kinds}
    assert kind("dgram") is None and kind("stiefel") is None


def test_each_baseline_is_judged_on_its_own():
    res = world(restores={("dgram", "saturation"), ("hetero-inv", "solver"), ("hetero-inv", "solver_attn")})
    v = verdicts(res)
    assert v["mech2.fails.dgram"] == v["mech2.fails.hetero-inv"] == "reproduced"
    assert v["mech2.saturation_restores.dgram"] == "reproduced"
    assert v["mech2.solver_restores.dgram"] == "not reproduced"
    assert v["mech2.solver_attn_restores.dgram"] == "not reproduced"
    assert v["mech2.cause.dgram"] == "saturation supported"
    assert v["mech2.saturation_restores.hetero-inv"] == "not reproduced"
    assert v["mech2.solver_restores.hetero-inv"] == "reproduced"
    assert v["mech2.solver_attn_restores.hetero-inv"] == "reproduced"
    assert v["mech2.cause.hetero-inv"] == "solver supported"
    both = verdicts(world(restores={("dgram", "saturation"), ("dgram", "solver")}))
    assert both["mech2.cause.dgram"] == "both supported" and both["mech2.cause.hetero-inv"] == "neither supported"


def test_the_contrast_pairs_rate_and_seed_cells_of_one_arm_with_its_baseline():
    res = world(restores={("dgram", "solver")})
    con = mechanism2_contrasts(CFG, res)
    cells = len(SEEDS) * len(CFG["grid"]["sweep"]["muon_lr"])
    x = con["dgram", "solver"]
    assert (x["cells"], x["failed"], x["tested"], x["restored"], x["harm_of"]) == (cells, cells, cells, cells, 0)
    assert con["hetero-inv", "solver"]["restored"] == 0  # the dgram arm's result does not leak into hetero-inv
    values = mechanism2_ledger_values(CFG, res)
    assert values["mech2.fails.dgram"][0] == (len(SEEDS), len(SEEDS))  # at the largest rate only


def test_a_failed_manipulation_check_makes_its_cells_untested_whichever_way_they_fell():
    # the solver twins train but their solves do not follow the momentum: not evidence for the solver
    res = world(restores={("dgram", "solver"), ("hetero-inv", "solver")},
                solver_ok=lambda arm: kind(arm) not in ("solver", "solver_attn"))
    assert set(res[res.kind == "solver"].check) == {False}
    v = verdicts(res)
    assert v["mech2.solver_restores.dgram"] == v["mech2.solver_restores.hetero-inv"] == paper.NOT_TESTED
    assert v["mech2.cause.dgram"] == paper.NOT_TESTED
    # ... nor against it when they fail
    res = world(solver_ok=lambda arm: kind(arm) not in ("solver", "solver_attn"))
    assert verdicts(res)["mech2.solver_restores.dgram"] == paper.NOT_TESTED
    # the unit-q/k arm still saturated: its check fails, its cells are untested
    res = world(restores={("dgram", "saturation")}, saturated=lambda arm: True)
    assert verdicts(res)["mech2.saturation_restores.dgram"] == paper.NOT_TESTED


def test_harm_is_counted_where_the_plain_arm_trained_and_does_not_decide_the_verdict():
    top = max(CFG["grid"]["sweep"]["muon_lr"])
    res = world(restores={("dgram", "saturation")}, fails=lambda rate: rate == top, harm={("dgram", "saturation")})
    x = mechanism2_ledger_values(CFG, res)["mech2.saturation_restores.dgram"][0]
    assert (x["harm"], x["harm_of"]) == (len(SEEDS), len(SEEDS))
    assert verdicts(res)["mech2.saturation_restores.dgram"] == "reproduced"
    rows = {(r["baseline"], r["kind"]): r for r in contrast_rows(CFG, res, paper.FAIL_MARGIN)}
    assert rows["dgram", "saturation"]["harm"] == f"{len(SEEDS)}/{len(SEEDS)}"


def test_nothing_failing_leaves_every_contrast_unresolved():
    v = verdicts(world(fails=lambda rate: False))
    assert v["mech2.fails.dgram"] == "not reproduced"
    assert {v[f"mech2.{k}_restores.{b}"] for b in paper.MECH2_BASELINES for k in ROUND2.kinds} == {
        paper.UNRESOLVED}
    assert {v[f"mech2.cause.{b}"] for b in paper.MECH2_BASELINES} == {paper.UNRESOLVED}


def test_a_config_without_an_arm_says_so_in_its_rows():
    import copy

    cfg = copy.deepcopy(CFG)
    gone = [c for c in cfg["grid"]["intervention"] if base(c) == "hetero-inv"] + ["hetero-inv"]
    cfg["grid"]["assignments"] = [a for a in cfg["grid"]["assignments"] if a not in gone]
    for key in ("intervention", "custom", "train_overrides"):
        cfg["grid"][key] = {k: v for k, v in cfg["grid"][key].items() if k not in gone}
    full = world(restores={("dgram", "saturation")})
    res = full[~full.arm.isin(gone)].reset_index(drop=True)
    values = mechanism2_ledger_values(cfg, res)
    assert values["mech2.fails.hetero-inv"][:2] == (None, "--")
    assert "no hetero-inv arm" in values["mech2.fails.hetero-inv"][2]
    assert values["mech2.cause.hetero-inv"][:2] == (None, "--")
    v = verdicts(res, cfg)
    assert v["mech2.cause.dgram"] == "saturation supported"


def test_the_checks_are_the_ones_each_run_records():
    res = world()
    sol, att = _logs(True, False)
    for row in res.itertuples():
        train = {"solver_normalize": CFG["grid"]["train_overrides"].get(row.arm, {}).get("solver_normalize")}
        got = manipulation.run_checks(train, sol.to_dict("records"), att.to_dict("records"))
        assert row.solver_check is got["solver"]["passed"] and row.saturation_check is got["saturation"]["passed"]


def test_the_tables_show_every_margin_and_every_cell(tmp_path):
    res = world(restores={("dgram", "saturation")})
    run_set = runs(lambda arm, rate, seed: 5.05)
    mechanism2_tables(CFG, run_set, res, tmp_path)
    margins = pd.read_csv(tmp_path / "table_mechanism2_margins.csv")
    assert sorted(set(margins.margin)) == sorted(paper.FAIL_MARGINS_SENSITIVITY)
    assert len(margins) == len(paper.FAIL_MARGINS_SENSITIVITY) * len(paper.MECH2_BASELINES) * len(ROUND2.kinds)
    table = pd.read_csv(tmp_path / "table_mechanism2.csv")
    assert len(table) == len(sweep_points(CFG["grid"])) and {f"seed {s}" for s in SEEDS} <= set(table.columns)
    contrasts = pd.read_csv(tmp_path / "table_mechanism2_contrasts.csv")
    assert set(contrasts.outcome) <= set(paper.MECH2_OUTCOMES)


@pytest.mark.parametrize("name", ["mechanism2", "mechanism2-gpt2", "ci-mechanism2"])
def test_the_mechanism2_configs_use_fresh_seeds_and_the_rules_rates(name):
    from mwm.plan.checks import check_config

    cfg = load_config(ROOT / "config" / f"{name}.yaml")
    check_config(cfg, f"config/{name}.yaml")
    assert cfg["workflow"]["report"] == "mechanism2"
    if name == "ci-mechanism2":
        return
    others = set()
    for path in (ROOT / "config").glob("*.yaml"):
        if "mechanism2" not in path.stem:
            others |= set(load_config(path)["grid"]["seeds"])
    assert len(cfg["grid"]["seeds"]) >= 12 and not set(cfg["grid"]["seeds"]) & others
    assert {"stiefel", "hetero", *paper.MECH2_BASELINES} <= set(cfg["grid"]["assignments"])
    present = {(cfg["grid"]["intervention"][c], arm_kind(cfg["grid"], c)) for c in cfg["grid"]["intervention"]}
    assert present == {(b, k) for b in paper.MECH2_BASELINES for k in ROUND2.kinds}
    if name == "mechanism2":
        assert tuple(cfg["grid"]["sweep"]["muon_lr"]) == ROUND2.rates


def test_a_solver_arm_may_change_the_solve_beside_its_normalization():
    from mwm.report.mechanism2 import arm_kind
    grid = {"intervention": {"a": "dgram", "b": "dgram", "c": "dgram"},
            "train_overrides": {"a": {"solver_normalize": "all", "solver": "admm", "admm_rho": 1.0,
                                      "dual_ascent_steps": 10},
                                "b": {"solver_normalize": "all", "attn_qk_scale": 4.0},
                                "c": {"attn_qk_scale": 4.0}}}
    assert arm_kind(grid, "a") == "solver" and arm_kind(grid, "c") == "saturation"
    assert arm_kind(grid, "b") is None  # two kinds at once: no single contrast
