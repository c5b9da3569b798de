"""benchmarks/bench_gpu.py runs on CPU with a tiny model (no GPU in CI): every
assignment and the ADMM row are timed through mwm.train.loop.Run, ratios to none and the
paper's H100 figures are printed with the settings, syncs and FLOPs; the results are
written after every assignment; one row exercises evaluate, checkpoint and resume; and
the one-update precision check gives finite numbers."""

import gc
import json
import math
import weakref

import pytest

from conftest import load_benchmark

TINY = ["--device", "cpu", "--layers", "2", "--embd", "32", "--heads", "2", "--block", "32", "--vocab", "320",
        "--batch", "2", "--steps", "3", "--warmup", "2", "--dual-steps", "3", "--threads", "1", "--no-compile"]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu")


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu_tiny(tmp_path, capsys, bench):
    import mwm.train.loop

    resolve = mwm.train.loop.resolve_data
    out = tmp_path / "r.json"
    assert bench.main(TINY + ["--json", str(out)]) == 0
    assert mwm.train.loop.resolve_data is resolve
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    st = doc["settings"]
    assert st["compile"] is False and st["dtype"] == "float32" and st["msign_precision"] == "bfloat16"
    assert st["tf32"] is True  # paper.yaml: as the released train.py
    assert "compile False, tf32 True (no effect on CPU)" in text
    results = {r["assignment"]: r for r in doc["results"]}
    assert list(results) == bench.ASSIGNMENTS
    for name, r in results.items():
        assert r["timed_steps"] == 3 and r["ms_per_step"] > 0 and 0 < r["opt_share"] < 1
        assert r["params"] == results["none"]["params"] and r["tokens_per_step"] == 64
        assert 0 < r["syncs_per_step"] < 20 and r["optimizer_gflop_per_step"] > 0
        ag = r["agreement"]
        assert ag["low"] == "bfloat16" and ag["matrices"] == 8  # 4 Muon matrices per layer
        # bf16 rounding moves the update (how far is the measurement: square matrices on a
        # manifold are ill-conditioned at this tiny size, so no bound is asserted here)
        assert 0 < ag["median_rel_diff"] <= ag["max_rel_diff"] and math.isfinite(ag["max_rel_diff"])
    admm = results["hetero-admm"]
    assert admm["trains"] == "hetero" and admm["overrides"]["train.solver"] == "admm"
    # 2 ADMM iterations at 2 msign-equivalents each against --dual-steps 3 of dual ascent
    # (the paper's 20 cost 5x more: test_flop_count_follows_the_shapes_and_iterations)
    assert admm["optimizer_gflop_per_step"] > results["hetero"]["optimizer_gflop_per_step"]
    ex = results["hetero"]["exercise"]
    assert ex["resumed_equal"] and ex["resumed_at"] > 0 and math.isfinite(ex["loss_after_resume"])
    assert all("exercise" not in r for n, r in results.items() if n != "hetero")
    rr = st["retraction"]  # the DGram retraction of the model's banks against the released float32 SVD
    assert rr["bank"] == 2 and rr["shapes"] == [[96, 32], [32, 32], [128, 32], [32, 128]]
    assert rr["s"]["released"] > 0 and rr["s"]["paper"] > 0
    assert 0 <= rr["err"]["paper"] < rr["err"]["released"] < 1e-4  # float64 against float32 SVD
    assert "DGram retraction of 2-matrix banks" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(tuple(n + " " for n in bench.ASSIGNMENTS))]
    assert len(rows) == 2 * len(bench.ASSIGNMENTS)  # each printed as it finished, then in the table
    for name, paper in (("stiefel", "5.8x"), ("hetero", "8.3x"), ("dgram", "13.6x")):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        assert paper in line and f"{results[name]['ms_per_step'] / results['none']['ms_per_step']:.2f}x" in line


def test_results_are_written_after_each_assignment(tmp_path, bench, monkeypatch):
    """A run cut short keeps what it measured: the JSON holds every finished row."""
    out = tmp_path / "r.json"
    seen = []
    real = bench.bench_assignment

    def second_fails(args, name, *a, **k):
        if seen:
            raise KeyboardInterrupt  # the time-out, during the second assignment
        seen.append(name)
        return real(args, name, *a, **k)

    monkeypatch.setattr(bench, "bench_assignment", second_fails)
    with pytest.raises(KeyboardInterrupt):
        bench.main(TINY + ["--assignments", "none", "stiefel", "--json", str(out)])
    assert [r["assignment"] for r in json.loads(out.read_text())["results"]] == ["none"]


def test_rows_that_cannot_finish_their_fixed_part_do_not_start(tmp_path, bench, monkeypatch, capsys):
    """Once the budget left is below a row's fixed cost (build, warm-up, checks), the remaining
    rows and the retraction row's shapes are listed as cut, and the table still prints."""
    import time

    out = tmp_path / "r.json"
    real = bench.bench_assignment

    def slow_fixed(args, name, *a, **k):
        r = real(args, name, *a, **k)
        r["wall_s"] += 100.0  # as if building this row took 100 s more
        return r

    monkeypatch.setattr(bench, "bench_assignment", slow_fixed)
    t = time.perf_counter()
    assert bench.main(TINY + ["--assignments", "none", "stiefel", "dgram", "--exercise", "none-of-them",
                              "--budget-s", "60", "--json", str(out)]) == 0
    assert time.perf_counter() - t < 60
    doc = json.loads(out.read_text())
    assert [r["assignment"] for r in doc["results"]] == ["none"]
    assert doc["settings"]["cut"] == ["stiefel", "dgram"]
    text = capsys.readouterr().out
    assert "cut by --budget-s before they started: stiefel dgram" in text
    assert doc["results"][0]["setup_s"] > 0 and "build + manifold init" in text


def test_the_retraction_row_stops_at_its_deadline(bench):
    import time

    cfg = bench.make_config(bench.parse(TINY), 1, 1)
    done = bench.retraction_row(bench.parse(TINY), cfg, deadline=time.perf_counter() - 1)
    assert done["shapes"] == [] and len(done["cut"]) == 4
    assert "no shape timed; cut by the budget" in bench.retraction_line(done)
    full = bench.retraction_row(bench.parse(TINY), cfg)
    assert len(full["shapes"]) == 4 and full["cut"] == [] and "per matrix" in bench.retraction_line(full)


def test_the_exercise_row_runs_the_spectral_svds_once(tmp_path, bench, monkeypatch):
    """evaluate's float64 spectral pass is the one timed: no second call just to measure it."""
    import mwm.train.loop as T

    calls = []
    real = T.spectral_stats
    monkeypatch.setattr(T, "spectral_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "r.json"
    assert bench.main(TINY + ["--assignments", "hetero", "--no-retraction", "--json", str(out)]) == 0
    ex = json.loads(out.read_text())["results"][0]["exercise"]
    assert ex["spectral_cpu64_s"] > 0 and ex["spectral_device32_s"] > 0
    # one in the timed evaluate and none elsewhere in the bench (the resumed run trains, never evaluates)
    assert len(calls) == 1


def test_a_finished_run_is_freed(tmp_path, bench, monkeypatch):
    """No reference cycle keeps a measured Run (and its model) alive into the next row."""
    import mwm.train.loop

    refs = []
    real_init = mwm.train.loop.Run.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        refs.append(weakref.ref(self.model))

    import torch._dynamo  # noqa: F401 - imported lazily by the first optimizer, whose frames its import keeps

    monkeypatch.setattr(mwm.train.loop.Run, "__init__", init)
    monkeypatch.setattr(bench, "_free", lambda: None)  # its gc.collect() would hide a cycle
    gc.disable()  # freed by reference counting alone, not by a later collection
    try:
        assert bench.main(TINY + ["--assignments", "stiefel", "--exercise", "none-of-them"]) == 0
        assert refs and all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("text,oom", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED", True),
    ("shape mismatch", False),
])
def test_allocation_failures_of_every_library_count_as_out_of_memory(bench, text, oom):
    assert bench.is_oom(RuntimeError(text)) is oom
    assert bench.is_oom(ValueError(text)) is False


def test_flop_count_follows_the_shapes_and_iterations(bench):
    m, n = 3072, 768
    ms = bench.msign_flops(m, n, 10)
    assert ms == 10 * (4 * m * n * n + 2 * n ** 3)
    assert bench.update_flops(m, n, "none", "dual_ascent", 20, 10) == ms
    stiefel = bench.update_flops(m, n, "stiefel", "dual_ascent", 20, 10)
    assert stiefel == 20 * (ms + 4 * m * n * n) + ms
    # ADMM: two msigns an iteration, so 2 iterations cost about 4 of dual ascent's msigns
    admm = bench.update_flops(m, n, "dgram", "admm", 2, 10)
    assert 4 * ms < admm < stiefel / 4
