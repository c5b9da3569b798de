"""scripts/gpu_check.sh --cpu: the GPU check's whole sequence (imports, the gpu test
tier, bench_gpu) on the CPU with a tiny model, so the script is known to work before a
GPU is lent: the first call rehearsed under a deadline in the GPU case's proportions, and
the second (--full); it ends by its deadline, and it refuses a bad command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _check(tmp_path, *args, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), "--cpu", *args, str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_gpu_check_full_runs_on_cpu(tmp_path):
    """--full, the second call: the tier with its compile test, the bench with the exercise row."""
    res = _check(tmp_path, "--full")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "out"
    for name in ("versions.txt", "gpu_tier.log", "bench_gpu.log", "bench_gpu.json", "summary.txt"):
        assert (out / name).is_file(), name
    summary = (out / "summary.txt").read_text()
    assert "gpu tier on cpu: rc 0" in summary and "passed" in summary and "done: exit 0" in summary
    assert "5 passed, 1 skipped" in summary and "deselected" not in summary  # the compile test ran
    assert summary.count("msign bf16 (") == 3  # the native-vs-emulation figures, one per shape
    rows = json.loads((out / "bench_gpu.json").read_text())["results"]
    assert len(rows) == 6 and "exercise" in next(r for r in rows if r["assignment"] == "hetero")
    assert "x none" in summary and "hetero-admm" in summary


@pytest.mark.slow
def test_the_first_call_rehearsed_on_cpu_reaches_the_rows_that_matter_first(tmp_path):
    """The first call under a deadline in the GPU case's proportions: the tiny model's cold compile
    on a CPU (20-45 s on this project's 2-core machines, a fresh compile cache each run) is about the
    share of 100 s that GPT-2 small's (30-75 s) is of the GPU's 270 s. The plan is printed before
    anything runs; the tier runs without its compile test; the retraction row (both polar solves)
    comes first, then dgram and hetero before any other row, and none; the rest ran or is named as cut."""
    res = _check(tmp_path, "--deadline", "100", timeout=200)
    assert res.returncode in (0, 3), res.stdout[-3000:] + res.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    lines = summary.splitlines()
    plan = next(i for i, ln in enumerate(lines) if "plan for the 100 s deadline" in ln)
    tier = next(i for i, ln in enumerate(lines) if "gpu tier on cpu" in ln)
    assert plan < tier and "1 deselected" in lines[tier] and "rc 0" in lines[tier]
    assert "the rows dgram hetero hetero-admm stiefel hetero-inv none" in lines[plan + 1]  # bench_gpu's own plan
    doc = json.loads((tmp_path / "out" / "bench_gpu.json").read_text())
    rr = doc["settings"]["retraction"]
    assert rr["shapes"] and set(rr["s"]) == {"released-svd", "eigh", "newton-schulz"}
    ran = [r["assignment"] for r in doc["results"]]
    assert ran[:2] == ["dgram", "hetero"] and "none" in ran, (ran, summary)
    assert sorted(ran + doc["settings"]["cut"]) == sorted(["dgram", "hetero", "hetero-admm", "stiefel",
                                                            "hetero-inv", "none"])
    first = doc["results"][0]
    assert first["compiled_vs_eager"]["ok"] and first["compile_s"] > 0  # compiled, checked against eager
    assert "DGram retraction of" in summary and "faster at the default's accuracy" in summary
    assert all("exercise" not in r for r in doc["results"])
    # in the summary's table too: the retraction row, then dgram and hetero before any other row
    rows = [ln.split()[0] for ln in lines if ln.startswith(("DGram retraction of", "dgram ", "hetero", "stiefel ",
                                                             "none "))]
    assert rows[:3] == ["DGram", "dgram", "hetero"], rows


def test_gpu_check_refuses_a_bad_command_line(tmp_path):
    for args in ([], ["--cpu"], ["--bogus"], ["a", "b"], ["--deadline", "5", "o"], ["--deadline", "x", "o"]):
        res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "gpu_check.sh --prepare" in res.stdout, args


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 1 and "no CUDA device here; use --cpu" in res.stdout


def test_a_missing_package_fails_in_the_first_seconds_with_the_fix(tmp_path):
    # -S: a Python without site-packages, as bare as an image that lacks them
    env = dict(os.environ, PYTHON=f"{sys.executable} -S")
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "jsonschema" in res.stdout and "not importable here" in res.stdout
    assert "bash scripts/gpu_check.sh --prepare" in res.stdout and "Traceback" not in res.stdout + res.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "done: exit 1" in summary
    for name in ("gpu_tier.log", "bench_gpu.log", "bench_gpu.json"):
        assert (tmp_path / "out" / name).is_file(), name


@pytest.mark.slow
def test_the_check_ends_by_its_deadline_and_says_what_it_cut(tmp_path):
    import time

    env = dict(os.environ, PYTHON=sys.executable)
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(SCRIPT), "--cpu", "--deadline", "30", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]  # cut, not failed
    assert took < 30 + 15, took
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "cut by the deadline" in summary and "done: exit 3" in summary
    assert json.loads((tmp_path / "out" / "bench_gpu.json").read_text())["results"] == []
