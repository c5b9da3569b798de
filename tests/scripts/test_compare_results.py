"""scripts/compare_results.py: a refactor's before/after comparison ignores wall-clock
fields and the checkout's own path, and nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("compare_results",
                                               Path(__file__).parents[2] / "scripts" / "compare_results.py")
compare = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(compare)


def _checkout(root: Path, step_time: float, val: float) -> Path:
    run = root / "results/runs/ci/hetero/seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_val_loss": val, "mean_step_time": step_time}))
    (run / "eval.csv").write_text(f"step,val_loss\n0,{val}\n")
    (run / "metrics.csv").write_text(f"step,train_loss,step_time\n0,5.0,{step_time}\n")
    study = root / "results/studies/ci"
    study.mkdir(parents=True)
    (study / "alpha.json").write_text(json.dumps({"meta": {"config": str(root.resolve() / "config/ci.yaml")},
                                                  "wall_s": step_time, "best": 0.0025}))
    return root


def test_timing_and_checkout_path_are_ignored(tmp_path, capsys):
    a = _checkout(tmp_path / "a", 0.25, 4.5)
    b = _checkout(tmp_path / "b", 0.31, 4.5)
    assert compare.main([str(a), str(b)]) == 0
    assert "4 of 4 files identical" in capsys.readouterr().out


@pytest.mark.parametrize("edit", ["eval", "study"])
def test_a_changed_number_is_reported(tmp_path, capsys, edit):
    a = _checkout(tmp_path / "a", 0.25, 4.5)
    b = _checkout(tmp_path / "b", 0.25, 4.5)
    if edit == "eval":
        (b / "results/runs/ci/hetero/seed0/eval.csv").write_text("step,val_loss\n0,4.5000001\n")
    else:
        p = b / "results/studies/ci/alpha.json"
        p.write_text(p.read_text().replace("0.0025", "0.0026"))
    assert compare.main([str(a), str(b)]) == 1
    assert "differs:" in capsys.readouterr().out
