"""benchmarks/bench_gpu.py runs on CPU with a tiny model (no GPU in CI): every
assignment is timed through mwm.train.Run, ratios to none and the paper's H100
figures are printed, and the one-update precision check gives finite numbers."""

import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_runs_on_cpu_tiny(tmp_path, capsys):
    import mwm.train

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    resolve = mwm.train.resolve_data
    out = tmp_path / "r.json"
    assert bench.main(["--device", "cpu", "--layers", "2", "--embd", "32", "--heads", "2", "--block", "32",
                       "--vocab", "320", "--batch", "2", "--steps", "3", "--warmup", "2", "--dual-steps", "3",
                       "--threads", "1", "--json", str(out)]) == 0
    assert mwm.train.resolve_data is resolve
    text = capsys.readouterr().out
    import json

    results = {r["assignment"]: r for r in json.loads(out.read_text())}
    assert list(results) == bench.ASSIGNMENTS
    for name, r in results.items():
        assert r["timed_steps"] == 3 and r["ms_per_step"] > 0 and 0 < r["opt_share"] < 1
        assert r["params"] == results["none"]["params"] and r["tokens_per_step"] == 64
        ag = r["agreement"]
        assert ag["low"] == "bfloat16" and ag["matrices"] == 8  # 4 Muon matrices per layer
        # bf16 rounding moves the update (how far is the measurement: square matrices on a
        # manifold are ill-conditioned at this tiny size, so no bound is asserted here)
        assert 0 < ag["median_rel_diff"] <= ag["max_rel_diff"] and math.isfinite(ag["max_rel_diff"])
    for name, paper in (("stiefel", "5.8x"), ("hetero", "8.3x"), ("dgram", "13.6x")):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        assert paper in line and f"{results[name]['ms_per_step'] / results['none']['ms_per_step']:.2f}x" in line
