"""mwm.report.pilot: a mechanism pilot's tables, on made-up runs, and the power of a round's decision."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from mwm.config import load_config
from mwm.plan.variants import sweep_points
from mwm.report.mechanism import mechanism_results
from mwm.report.pilot import main, min_failed_cells, pilot_rows, restore_power
from mwm.stats import binomial_p

ROOT = Path(__file__).resolve().parents[2]


def test_the_fewest_failed_cells_follow_holm_and_the_interval():
    # 2 * 0.5^k < 0.05 / family and the Clopper-Pearson lower bound of k/k above 0.5
    assert min_failed_cells(4) == 8 and min_failed_cells(1) == 6
    k = min_failed_cells(4)
    assert binomial_p(k - 1, k - 1, 0.5) >= 0.05 / 4


def test_power_is_certain_with_enough_failed_cells_all_restored_and_none_without():
    assert restore_power(12, 1.0, 1.0) == pytest.approx(1.0)
    assert restore_power(min_failed_cells(4) - 1, 1.0, 1.0) == 0.0  # too few cells can never decide
    assert 0 < restore_power(12, 1.0, 0.9) < restore_power(12, 1.0, 1.0)
    assert restore_power(12, 0.75, 1.0) < restore_power(12, 1.0, 1.0)  # fewer failures, fewer cells
    assert restore_power(12, 1.0, 0.5) < 0.05  # a coin-flip intervention rarely "restores"


def test_pilot_rows_count_failures_and_each_kinds_check():
    cfg = load_config(ROOT / "config" / "mechanism3-pilot-arms.yaml")
    steps = (0, 50, 100)

    def run(arm):
        bad_attn = arm == "hetero-inv-admm"  # its attention solve fails the violation bound
        sol = pd.DataFrame([{"step": s, "module": m, "alignment": 0.95, "alignment_converged": 1.0,
                             "violation": 0.05 if (bad_attn and m == "attn") else 0.01, "gap_converged": 1e-3}
                            for s in steps for m in ("attn", "mlp") for _ in range(2)])
        att = pd.DataFrame([{"step": s, "layer": 0, "entropy_mean": 2.0 if "qk" in arm else 0.01}
                            for s in steps])
        loss = {"stiefel": 5.0, "hetero": 5.1, "dgram": 6.5, "hetero-inv": 7.0}.get(arm, 5.05)
        return SimpleNamespace(summary={"status": "completed"}, eval=pd.DataFrame({"val_loss": [7.6, loss]}),
                               solver=sol, attention=att)

    runs = {(v, s): run(arm) for v, (arm, _) in sweep_points(cfg["grid"]).items() for s in cfg["grid"]["seeds"]}
    rows = {r["arm"]: r for r in pilot_rows(cfg, runs, mechanism_results(cfg, runs))}
    n = len(cfg["grid"]["seeds"])
    assert rows["dgram"]["failed"].startswith(f"{n}/{n}") and rows["stiefel"]["failed"].startswith(f"0/{n}")
    assert rows["dgram-admm"]["solver check attn"].startswith(f"{n}/{n}")
    assert rows["hetero-inv-admm"]["solver check attn"].startswith(f"0/{n}")
    assert rows["hetero-inv-admm"]["solver check mlp"].startswith(f"{n}/{n}")
    assert rows["dgram-qk"]["saturation check"].startswith(f"{n}/{n}")


def test_main_names_missing_runs_in_one_line(tmp_path, capsys):
    assert main(["--config", str(ROOT / "config" / "mechanism3-pilot-arms.yaml"), "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: pilot runs missing") and "Traceback" not in err
