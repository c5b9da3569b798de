"""benchmarks/bench_gpu.py runs on CPU with a tiny model (no GPU in CI): the DGram retraction row
first (both polar solves), then every assignment and the ADMM row, by value, timed through
mwm.train.loop.Run, ratios to none and the paper's H100 figures printed with the settings, syncs
and FLOPs; the results are written after every row; the schedule keeps none and names what it
cuts (rehearsed on a clock with the GPU case's costs); one row exercises evaluate, checkpoint and
resume; and the one-update precision check gives finite numbers."""

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
    rr = st["retraction"]  # the DGram retraction of the model's banks in each form
    assert rr["bank"] == 2 and rr["shapes"] == [[96, 32], [32, 32], [128, 32], [32, 128]]
    assert all(rr["s"][form] > 0 for form in ("released-svd", "eigh", "newton-schulz"))
    assert 0 <= rr["err"]["eigh"] < rr["err"]["released-svd"] < 1e-4  # float64 against float32 SVD
    assert rr["err"]["newton-schulz"] <= rr["err"]["eigh"] + 2 ** -24 and rr["choice"]["meets"]["newton-schulz"]
    assert rr["choice"]["polar"] in ("eigh", "newton-schulz") and rr["choice"]["speedup"] >= 1
    assert "DGram retraction of 2-matrix banks" in text and "faster at the default's accuracy" in text
    assert text.index("DGram retraction of") < text.index("dgram ")  # the retraction row first
    assert all(r["compiled_vs_eager"] is None for r in results.values())  # --no-compile
    rows = [ln for ln in text.splitlines() if ln.startswith(tuple(n + " " for n in bench.ASSIGNMENTS))]
    assert len(rows) == 2 * len(bench.ASSIGNMENTS)  # each printed as it finished, then in the table
    for name, paper in (("stiefel", "5.8x"), ("hetero", "8.3x"), ("dgram", "13.6x")):
        # the table's line (the one printed as the row finished has no ratio yet: none runs last)
        line = [ln for ln in text.splitlines() if ln.startswith(name + " ")][-1]
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
    rows are listed as cut with the reason, and the table still prints, saying it has no ratios."""
    import time

    out = tmp_path / "r.json"
    real = bench.bench_assignment

    def slow_fixed(args, name, *a, **k):
        r = real(args, name, *a, **k)
        r["wall_s"] += 100.0  # as if building this row took 100 s more
        return r

    monkeypatch.setattr(bench, "bench_assignment", slow_fixed)
    t = time.perf_counter()
    assert bench.main(TINY + ["--assignments", "stiefel", "dgram", "none", "--exercise", "none-of-them",
                              "--no-retraction", "--budget-s", "60", "--json", str(out)]) == 0
    assert time.perf_counter() - t < 60
    doc = json.loads(out.read_text())
    assert [r["assignment"] for r in doc["results"]] == ["stiefel"]
    assert doc["settings"]["cut"] == ["dgram", "none"]
    text = capsys.readouterr().out
    assert "cut by --budget-s before they started: dgram none (" in text and "a row's fixed cost about" in text
    assert "no ratios: the none row did not run" in text
    assert doc["results"][0]["setup_s"] > 0 and "build + manifold init" in text


def _row(name, fixed, step, steps, compile_s):
    return {"assignment": name, "wall_s": fixed + steps * step, "timed_steps": steps, "ms_per_step": 1e3 * step,
            "compile_s": compile_s}


def test_the_plan_keeps_none_for_the_ratios_and_cuts_the_middle(bench):
    first = _row("dgram", fixed=100.0, step=1.0, steps=10, compile_s=80.0)
    # before any row: the first starts whatever is left
    assert bench.plan_next(["dgram", "none"], [], 1.0) == ("dgram", [], "")
    # after a cold first row, the next is expected to cost its fixed part less 3/4 of the cold compile
    assert bench.next_fixed([first]) == pytest.approx(100.0 - 0.75 * 80.0)
    assert bench.plan_next(["hetero", "stiefel", "none"], [first], 80.0)[0] == "hetero"
    name, cut, why = bench.plan_next(["hetero", "stiefel", "none"], [first], 60.0)
    assert name == "none" and cut == ["hetero", "stiefel"] and "none's kept" in why
    name, cut, _ = bench.plan_next(["hetero", "none"], [first], 30.0)
    assert name is None and cut == ["hetero", "none"]
    # a warm row measured: its fixed cost is the estimate from then on
    warm = _row("hetero", fixed=12.0, step=0.5, steps=10, compile_s=5.0)
    assert bench.next_fixed([first, warm]) == pytest.approx(12.0)
    assert bench.plan_next(["stiefel", "none"], [first, warm], 25.0)[0] == "stiefel"
    assert bench.plan_next(["none"], [first, warm], 13.0) == ("none", [], "")


#: The GPU case, by reading (estimates, not measurements): GPT-2 small's cold compile 30-75 s and a warm
#: one after dynamo's reset a quarter of it; build and manifold init 10 s; 3 warm-up steps; the
#: optimizer-heavy rows 0.6-1.6 s a step, none 0.15 s; the bench's budget what a 270 s deadline leaves
#: after imports (15 s), the tier (40 s) and the margins (20 s).
GPU_CASE = {"budget": 195.0, "build": 10.0, "warmup": 3, "retraction": 15.0,
            "step": {"dgram": 1.6, "hetero": 1.1, "hetero-admm": 0.6, "stiefel": 0.8, "hetero-inv": 1.1,
                     "none": 0.15}}


@pytest.mark.parametrize("cold", [30.0, 75.0])
def test_on_the_gpu_case_the_retraction_dgram_hetero_and_none_rows_are_reached(bench, monkeypatch, cold):
    """The schedule rehearsed on a clock: with the GPU's fixed costs (:data:`GPU_CASE`), the retraction
    row runs first, then dgram and hetero before any other row, and none is reached; what is cut is named."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench, "settings", lambda args: {"bf16_peak_tflops": None})
    monkeypatch.setattr(bench, "row_line", lambda *a: "")
    monkeypatch.setattr(bench, "make_config", lambda *a: {})
    order = []

    def retraction(args, cfg, deadline):
        order.append("retraction")
        clock[0] += GPU_CASE["retraction"]
        return {"shapes": [[1, 1]], "cut": []}

    def assignment(args, name, budget_s, out, exercise=False):
        order.append(name)
        step = GPU_CASE["step"][name]
        compile_s = cold if len(order) == 2 else cold * bench.WARM_COMPILE_SHARE
        fixed = GPU_CASE["build"] + compile_s + GPU_CASE["warmup"] * step
        steps = max(1, min(10, int((budget_s - fixed - 3 * step) / step)))  # measure()'s rule
        clock[0] += fixed + steps * step
        return _row(name, fixed, step, steps, compile_s)

    monkeypatch.setattr(bench, "retraction_row", retraction)
    monkeypatch.setattr(bench, "bench_assignment", assignment)
    monkeypatch.setattr(bench, "retraction_line", lambda rr: "")
    args = bench.parse(["--device", "cpu", "--steps", "10", "--budget-s", str(GPU_CASE["budget"])])
    st, results = bench.run(args)
    ran = [r["assignment"] for r in results]
    assert order[:3] == ["retraction", "dgram", "hetero"] and "none" in ran
    assert sorted(ran + st["cut"]) == sorted(bench.ASSIGNMENTS)
    assert clock[0] <= GPU_CASE["budget"] + 10 * max(GPU_CASE["step"].values())
    steps = {r["assignment"]: r["timed_steps"] for r in results}
    # the rows that matter most get their steps: DGram all it asks for, hetero and none enough for a median
    assert steps["dgram"] == args.steps and steps["hetero"] >= 3 and steps["none"] >= 3, steps


def test_the_retraction_row_stops_at_its_deadline(bench):
    import time

    cfg = bench.make_config(bench.parse(TINY), 1, 1)
    done = bench.retraction_row(bench.parse(TINY), cfg, deadline=time.perf_counter() - 1)
    assert done["shapes"] == [] and len(done["cut"]) == 4
    assert "no shape timed; cut by the budget" in bench.retraction_line(done)
    full = bench.retraction_row(bench.parse(TINY), cfg)
    assert len(full["shapes"]) == 4 and full["cut"] == [] and "eigh's speed" in bench.retraction_line(full)


def test_a_compiled_forward_that_disagrees_with_eager_fails_the_bench(bench, monkeypatch, capsys):
    row = _row("dgram", 1.0, 0.1, 3, 0.5)
    row["compiled_vs_eager"] = {"compiled": 10.9, "eager": 10.0, "rel_diff": 0.09, "tol": 1e-2, "ok": False}
    monkeypatch.setattr(bench, "run", lambda args: ({}, [row]))
    monkeypatch.setattr(bench, "table", lambda results, st: "table")
    assert bench.main(["--device", "cpu"]) == 1
    assert "FAILED: the compiled forward disagrees with eager" in capsys.readouterr().out


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


def test_the_plan_line_is_the_schedule_the_run_follows(bench, capsys):
    """--plan prints, without torch, the order and shares run() uses (gpu_check prints it first)."""
    assert bench.main(["--plan", "--exercise", "none-of-them"]) == 0
    line = capsys.readouterr().out
    assert f"at most {bench.RETRACTION_SHARE:.0%} of the budget" in line
    assert f"the rows {' '.join(bench.ASSIGNMENTS)}, each started only when it and none" in line
    assert "no exercise row" in line
    assert "the exercise row with hetero" in bench.plan_line(bench.parse(["--exercise", "hetero"]))
