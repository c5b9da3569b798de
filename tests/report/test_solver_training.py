"""grid.solver_comparison: a candidate solver trained beside the paper's, and its verdict."""

import json

import pandas as pd
import pytest

import fakedata
from mwm.config import ConfigError, load_config
from mwm.report.load import load_runs
from mwm.report.solver_training import MIN_SEEDS, solver_training_report, verdict
from mwm.plan.runs import check_grid
from mwm.train.cli import train

GRID = {
    "assignments": ["hetero", "hetero-admm"],
    "custom": {"hetero-admm": {"*.attn.*": "stiefel", "*.mlp.*": "dgram"}},
    "train_overrides": {"hetero-admm": {"solver": "admm", "warm_start": True, "solver_max_steps": 1,
                                        "admm_rho": 2.0}},
    "solver_comparison": {"hetero-admm": "hetero"},
    "seeds": [0, 1, 2],
}


def _config(tiny_config, grid):
    return load_config(tiny_config(train={"max_iters": 4, "lr_decay_iters": 4, "eval_interval": 2}, grid=grid))


def test_verdict_rule_is_the_same_whichever_way_the_difference_falls():
    base = [3.00, 3.02, 3.04]  # spread 0.04
    assert verdict(base, [b + 0.03 for b in base], ["completed"] * 6)[0] == "equal within seed noise"
    assert verdict(base, [b - 0.03 for b in base], ["completed"] * 6)[0] == "equal within seed noise"
    assert verdict(base, [b + 0.05 for b in base], ["completed"] * 6)[0] == "candidate higher"
    assert verdict(base, [b - 0.05 for b in base], ["completed"] * 6)[0] == "candidate lower"
    v, diff, spread = verdict(base, [b + 0.05 for b in base], ["completed"] * 6)
    assert diff == pytest.approx(0.05) and spread == pytest.approx(0.04)


def test_verdict_needs_seeds_and_completed_runs():
    assert verdict([3.0] * (MIN_SEEDS - 1), [3.0] * (MIN_SEEDS - 1), ["completed"] * 4)[0] == "too few seeds"
    statuses = ["completed"] * 5 + ["unstable"]
    assert verdict([3.0, 3.1, 3.2], [3.0, 3.1, 3.2], statuses)[0].startswith("not comparable")


@pytest.mark.parametrize("change, message", [
    (lambda g: g["solver_comparison"].update({"hetero-admm": "stiefel"}), "not in grid.assignments"),
    (lambda g: g["solver_comparison"].update({"hetero-admm": "hetero-admm"}), "its own baseline"),
    (lambda g: g["train_overrides"]["hetero-admm"].update({"learning_rate": 1.0}), "inner solver only"),
])
def test_a_comparison_that_is_not_about_the_solver_is_refused(change, message):
    grid = json.loads(json.dumps(GRID))
    change(grid)
    with pytest.raises(ConfigError, match=message):
        check_grid(grid)


@pytest.mark.slow
def test_report_pairs_seeds_and_reads_the_candidate_solver(tiny_config, tmp_path):
    cfg = _config(tiny_config, GRID)
    for variant in GRID["assignments"]:
        for seed in GRID["seeds"]:
            assert train(cfg, variant, seed, None, tmp_path / "results", data=fakedata.TOKENS) == 0
    runs = load_runs(cfg, tmp_path / "results")
    # the candidate trained with ADMM: its runs differ from the baseline's
    assert not runs["hetero-admm", 0].eval["val_loss"].equals(runs["hetero", 0].eval["val_loss"])
    out = tmp_path / "figs"
    df = solver_training_report(cfg, runs, {}, out)
    assert (out / "fig_solver_training.png").stat().st_size > 0
    table = pd.read_csv(out / "table_solver_training.csv")
    assert len(df) == len(table) == 1
    row = table.iloc[0]
    assert row["candidate solver"] == "admm, 1 it., warm, rho 2"
    assert row["baseline solver"].startswith("dual_ascent, 3 it., cold")
    finals = {v: [json.loads((tmp_path / "results" / "runs" / "tiny" / v / f"seed{s}" / "summary.json")
                             .read_text())["final_val_loss"] for s in GRID["seeds"]] for v in GRID["assignments"]}
    expect = verdict(finals["hetero"], finals["hetero-admm"], ["completed"] * 6)
    assert row["verdict"] == expect[0]
    assert row["mean paired diff"] == pytest.approx(expect[1])
    assert row["seeds"] == 3


def test_no_comparison_no_files(tiny_config, tmp_path):
    cfg = _config(tiny_config, {"assignments": ["hetero"], "seeds": [0]})
    assert solver_training_report(cfg, {}, {}, tmp_path / "figs") is None
    assert not (tmp_path / "figs").exists()
