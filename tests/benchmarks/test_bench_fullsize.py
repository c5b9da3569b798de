"""The full-size CPU benchmark's code path (benchmarks/bench_fullsize.py), at reduced width.

The benchmark itself runs GPT-2 small's widths (too slow for CI on 2 cores); this runs
the same function, mwm.train.loop.Run through a preemption checkpoint and a resume, with a
narrow model, so the path is known to work.
"""

import math

import pytest

from conftest import load_benchmark


def _bench():
    return load_benchmark("bench_fullsize")


@pytest.mark.parametrize("assignment", ["none", "hetero"])
def test_fullsize_path_at_reduced_width(tmp_path, monkeypatch, assignment):
    import mwm.train.loop

    bench = _bench()
    monkeypatch.chdir(tmp_path)
    args = bench.parse(["--embd", "32", "--heads", "4", "--block", "48", "--vocab", "320", "--steps", "3",
                        "--resume-at", "2", "--dual-steps", "3", "--data", "random", "--threads", "1"])
    resolve = mwm.train.loop.resolve_data
    r = bench.run_one(args, assignment, tmp_path / "results")
    assert mwm.train.loop.resolve_data is resolve  # the benchmark's stand-in data is undone
    assert r["resumed_at"] == 2 and r["steps"] == 3 and len(r["step_ms_all"]) == 3
    assert sorted(map(tuple, r["banks"])) == [(32, 32), (32, 128), (96, 32), (128, 32)]
    # spectra and attention logged at the two evaluations (steps 0 and 3), at T = block
    assert r["spectral_rows"] > 0 and r["attention_rows"] > 0 and r["spectral_s"] > 0 and r["attention_s"] > 0
    assert 0 < r["opt_share"] < 1 and 0 < r["logging_share"] < 1 and r["ckpt_mb"] > 0
    runs = tmp_path / "results" / "runs" / "ci" / assignment / "seed0"
    assert (runs / "summary.json").exists() and (runs / "pairs.npz").exists()
    assert sorted(p.name for p in (runs / "spectra").glob("*.npz")) == ["step_000000.npz", "step_000003.npz"]
    assert math.isfinite(r["final_val"])
