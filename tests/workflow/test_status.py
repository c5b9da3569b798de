"""python -m mwm.workflow.status: one table of every run of a config, from the run folders only."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
import yaml

import fakedata
from mwm.workflow import status
from mwm.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg(tiny_config):
    path = tiny_config("st.yaml", base=REPO / "config" / "ci.yaml", name="st",
                       grid={"assignments": ["none", "stiefel", "dgram", "hetero"], "seeds": [0, 1],
                       "retraction_ablation": False})
    return load_config(str(path)), path


def _csv(path: Path, header: str, rows: list[str], partial: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows) + partial)


def _metrics(folder: Path, steps: int, step_time: float, partial: str = "") -> None:
    head = "step,train_loss,lr,muon_lr,step_time,tokens_per_s,optimizer_time,optimizer_share"
    _csv(folder / "metrics.csv", head, [f"{s},5.0,0.001,0.01,{step_time},100,0.01,0.2" for s in range(steps)], partial)


def _summary(folder: Path, **kw) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"steps_done": 30, "max_iters": 30, **kw}))


def test_every_run_of_the_grid_with_its_state(cfg, tmp_path):
    cfg, _ = cfg
    res = tmp_path / "results"
    runs = res / "runs" / "st"
    _summary(runs / "none" / "seed0", status="completed", final_val_loss=4.25, mean_step_time=0.05)
    _summary(runs / "dgram" / "seed0", status="unstable", onset_step=20, final_val_loss=7.5, mean_step_time=0.1)
    _summary(runs / "dgram" / "seed1", status="failed", steps_done=3, error="boom")
    # running: 12 of 30 steps logged, an unterminated last line (being written) is ignored
    _metrics(runs / "stiefel" / "seed0", 12, 0.02, partial="12,5.0,0.00")
    _csv(runs / "stiefel" / "seed0" / "eval.csv", "step,train_loss,val_loss", ["0,6.0,6.1", "10,5.0,5.25"])
    # preempted, waiting for its retry: run folder gone, the checkpoint's copy of the logs remains
    _metrics(res / "checkpoints" / "st" / "hetero" / "seed1" / "logs", 20, 0.04)
    now = max(p.stat().st_mtime for p in res.rglob("*.csv")) + 90

    got = {(r.variant, r.seed): r for r in status.collect(cfg, res, now)}
    assert len(got) == 8  # 4 assignments x 2 seeds, whatever exists on disk
    assert got["none", 0].status == "completed" and got["none", 0].val_loss == 4.25
    assert got["none", 0].ms_per_step == pytest.approx(50) and got["none", 0].eta_s is None
    assert got["dgram", 0].status == "unstable" and got["dgram", 0].onset == 20
    assert got["dgram", 1].status == "failed" and got["dgram", 1].step == 3
    run = got["stiefel", 0]
    assert run.status == "running" and run.step == 12 and run.val_loss == 5.25
    assert run.ms_per_step == pytest.approx(20) and run.eta_s == pytest.approx(18 * 0.02)
    assert run.updated == pytest.approx(90, abs=1)
    assert got["hetero", 1].status == "pending" and got["hetero", 1].step == 20  # resumes there
    assert got["hetero", 0].status == "pending" and got["hetero", 0].step is None

    table = status.format_table(list(got.values()))
    lines = table.splitlines()
    assert lines[0].split() == ["variant", "seed", "status", "step", "val", "loss", "ms/step", "ETA", "onset",
                                "updated"]
    row = next(ln for ln in lines if ln.startswith("stiefel") and " running " in ln).split()
    assert row[3] == "12/30" and row[4] == "5.2500" and row[5] == "20.0" and row[6] == "0s"
    assert "unstable" in table and " 20 " in next(ln for ln in lines if "unstable" in ln)


def test_tail_reads_only_the_end_of_a_long_log(tmp_path):
    p = tmp_path / "metrics.csv"
    _metrics(tmp_path, 20000, 0.5, partial="20000,5.0")
    rows = status._tail_rows(p, max_bytes=4096)
    assert 0 < len(rows) < 200 and rows[-1]["step"] == "19999"
    assert all(set(r) == set(rows[0]) and None not in r.values() for r in rows)


def test_cli_prints_runs_studies_and_report(cfg, tmp_path, capsys, monkeypatch):
    cfg, path = cfg
    res = tmp_path / "results"
    (res / "studies" / "st").mkdir(parents=True)
    (res / "studies" / "st" / "audits.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert status.main(["--config", str(path), "--results", str(res), "--figures", str(tmp_path / "pf")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config st") and "8 pending" in out
    prods = {ln.split()[1]: ln.split()[2] for ln in out.splitlines() if ln.startswith("study ")}
    assert prods == {"alpha": "pending", "absorption": "pending", "audits": "completed", "solvers": "pending"}
    assert "report" in out


def test_bad_config_is_an_error_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain: {max_iters: -3}\n")
    assert status.main(["--config", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_reads_a_run_being_written_without_locking(cfg, tmp_path):
    """Log files are only opened for reading (the cluster's jobs keep appending)."""
    cfg, _ = cfg
    folder = tmp_path / "results" / "runs" / "st" / "none" / "seed0"
    _metrics(folder, 5, 0.01)
    os.chmod(folder / "metrics.csv", 0o444)
    got = status.collect(cfg, tmp_path / "results")
    assert got[0].status == "running" and got[0].step == 5


def test_a_real_run_logs_progress_and_reads_completed(tiny_config, tmp_path, capsys, one_thread):
    """The training log shows step, loss, lr, ms/step and ETA every log_interval steps, and the
    status table reads the finished run folder."""
    from mwm.train.cli import train

    path = tiny_config(train__max_iters=8, train__log_interval=4)
    cfg = load_config(str(path))
    assert train(cfg, "stiefel", 0, out_root=tmp_path / "results", data=fakedata.TOKENS) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " step " in ln and "/8 " in ln]
    assert [ln.split()[3] for ln in lines] == ["0/8", "4/8"]
    for ln in lines:
        assert re.search(r"loss \d+\.\d{4} lr \d\.\d\de-\d\d \d+\.\d ms/step .* eta \d+(\.\d)? (s|min|h)$", ln), ln
    got = {r.variant: r for r in status.collect(cfg, tmp_path / "results")}
    assert got["stiefel"].status == "completed" and got["stiefel"].step == 8
    assert got["stiefel"].val_loss is not None and got["stiefel"].ms_per_step > 0
    assert got["none"].status == "pending"


# -- runs that are not the config's own --------------------------------------------------------
def test_a_run_that_is_not_the_configs_own_is_flagged_naming_the_keys(cfg, tmp_path, capsys, monkeypatch):
    from mwm.config import config_hash
    from mwm.plan.runs import expected_identity

    cfg, path = cfg
    res = tmp_path / "results"
    runs = res / "runs" / "st"
    own = expected_identity(cfg, "none", 0)
    _summary(runs / "none" / "seed0", status="completed", identity=own, config_hash=config_hash(own))
    hand = json.loads(json.dumps(own))
    hand["train"]["learning_rate"] = 0.02
    _summary(runs / "stiefel" / "seed0", status="completed", final_val_loss=3.3675, identity=hand)
    got = {(r.variant, r.seed): r for r in status.collect(cfg, res)}
    assert got["none", 0].status == "completed" and got["none", 0].note is None
    assert got["stiefel", 0].status == "mismatch" and "train.learning_rate: run 0.02" in got["stiefel", 0].note
    assert status.main(["--config", str(path), "--results", str(res), "--figures", str(tmp_path / "pf")]) == 0
    out = capsys.readouterr().out
    assert "1 mismatch" in out and "stiefel seed0: trained with settings that are not the config's" in out


def test_a_run_of_other_numerics_is_flagged_naming_both_versions(cfg, tmp_path):
    from mwm.numerics import VERSION
    from mwm.plan.runs import expected_identity

    cfg, _ = cfg
    res = tmp_path / "results"
    own = expected_identity(cfg, "none", 0)
    _summary(res / "runs" / "st" / "none" / "seed0", status="completed", identity=dict(own, numerics=VERSION - 1))
    unversioned = {k: v for k, v in own.items() if k != "numerics"}
    _summary(res / "runs" / "st" / "stiefel" / "seed0", status="completed", identity=unversioned,
             code_version="0.1.0+abc1234-dirty")
    got = {(r.variant, r.seed): r for r in status.collect(cfg, res)}
    assert got["none", 0].status == "mismatch"
    assert f"made with numerics version {VERSION - 1}; this code's is {VERSION}" in got["none", 0].note
    assert got["stiefel", 0].status == "mismatch" and "unknown numerics" in got["stiefel", 0].note


def test_step_counts_out_of_the_runs_own_max_iters_and_the_solver_study_is_listed(cfg, tmp_path, capsys):
    """A run trained with train.max_iters=20 showed 20/30; the solver study was not listed."""
    cfg, path = cfg
    res = tmp_path / "results"
    _summary(res / "runs" / "st" / "none" / "seed0", status="completed", steps_done=20, max_iters=20)
    got = {(r.variant, r.seed): r for r in status.collect(cfg, res)}
    assert got["none", 0].step == 20 and got["none", 0].max_iters == 20
    assert "20/20" in status.format_table(list(got.values()))
    (res / "studies" / "st").mkdir(parents=True)
    (res / "studies" / "st" / "solvers_derived.json").write_text("{}")
    assert status.main(["--config", str(path), "--results", str(res), "--figures", str(tmp_path / "pf")]) == 0
    prods = {ln.split()[1]: ln.split()[2] for ln in capsys.readouterr().out.splitlines() if ln.startswith("study ")}
    assert prods["solvers"] == "completed" and prods["alpha"] == "pending"


def test_a_solver_study_config_lists_no_training_runs():
    cfg = load_config(str(REPO / "config" / "widths.yaml"))
    assert cfg["workflow"]["report"] == "solvers" and status.collect(cfg, Path("/nonexistent")) == []


def _bench(logs: Path, stage: str, job: str, s: float, cpu: float) -> None:
    path = logs / "benchmarks" / stage / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time"
    path.write_text(f"{head}\n{s}\t0:00:00\t100\t200\t90\t95\t0\t1\t99.0\t{cpu}\n")


def test_stage_times_sum_the_benchmarks_of_finished_jobs(tmp_path):
    logs = tmp_path / "logs" / "st"
    _bench(logs, "train", "none/seed0", 100.0, 95.0)
    _bench(logs, "train", "stiefel/seed0", 300.0, 290.0)
    _bench(logs, "study_alpha", "study_alpha", 50.0, 45.0)
    _bench(logs, "data", "data", 10.0, 20.0)
    (logs / "benchmarks" / "report").mkdir(parents=True)
    (logs / "benchmarks" / "report" / "report.tsv").write_text("s\tcpu_time\n")  # being written: skipped
    bench = status.read_benchmarks(logs)
    assert (bench["train"]["stiefel/seed0"] == {"s": 300.0, "cpu_time": 290.0, "max_rss": 100.0}
            and "report" not in bench)
    rows = status.stage_times(bench)
    assert [r[0] for r in rows] == ["data", "study_alpha", "train", "total"]  # the DAG's order
    train = rows[2]
    assert train[1] == "2" and train[2] == "6m40s" and train[3] == "6m25s" and train[4] == "87%"  # wall: 400 of 460
    assert rows[-1][1:4] == ["4", "7m40s", "7m30s"]


def test_dag_eta_adds_running_runs_and_jobs_to_come_at_their_stage_mean(cfg, tmp_path):
    cfg, _ = cfg
    res = tmp_path / "results"
    runs = res / "runs" / "st"
    for v in ("none", "stiefel", "dgram"):
        _summary(runs / v / "seed0", status="completed", final_val_loss=4.0, mean_step_time=0.1)
    _metrics(runs / "hetero" / "seed0", 10, 0.5)  # running: 20 steps left at 0.5 s
    now = max(p.stat().st_mtime for p in res.rglob("*.csv")) + 1
    got = status.collect(cfg, res, now)
    prods = status.products(cfg, res, tmp_path / "pf", now)  # every study and the report pending
    # no benchmark yet: 4 pending runs at the finished runs' 100 ms/step x 30 steps; studies unknown
    eta, how = status.dag_eta(got, prods, {}, jobs=None)
    assert eta == pytest.approx(20 * 0.5 + 4 * 30 * 0.1)
    assert "study_alpha" in how and "not counted" in how
    logs = tmp_path / "logs" / "st"
    _bench(logs, "train", "none/seed0", 40.0, 39.0)
    _bench(logs, "train", "stiefel/seed0", 60.0, 59.0)
    for stage in ("study_alpha", "study_absorption", "study_audits", "study_solvers", "report"):
        _bench(logs, stage, stage, 7.0, 7.0)
    eta, how = status.dag_eta(got, prods, status.read_benchmarks(logs), jobs=2)
    assert eta == pytest.approx((20 * 0.5 + 4 * 50.0 + 5 * 7.0) / 2) and "not counted" not in how
    done = [status.RunStatus(r.variant, r.seed, "completed", 30, 30, 4.0, 100.0, None, 1.0) for r in got]
    finished = [[p[0], "completed", p[2], p[3]] for p in prods]
    assert status.dag_eta(done, finished, {}, None) == (0.0, "nothing left")
    # nothing measured yet anywhere: no estimate, not "0s"
    fresh = [status.RunStatus(r.variant, r.seed, "pending", 0, 30, None, None, None, None) for r in got]
    eta, how = status.dag_eta(fresh, prods, {}, None)
    assert eta is None and "no benchmark or ms/step yet" in how


def test_cli_prints_the_stage_split_and_the_eta(cfg, tmp_path, capsys):
    cfg, path = cfg
    logs = tmp_path / "logs"
    _bench(logs / "st", "train", "none/seed0", 100.0, 95.0)
    argv = ["--config", str(path), "--results", str(tmp_path / "r"), "--figures", str(tmp_path / "pf"),
            "--logs", str(logs)]
    assert status.main(argv) == 0
    out = capsys.readouterr().out
    assert "finished jobs per stage" in out and re.search(r"^train\s+1\s+1m40s\s+1m35s\s+100%", out, re.M)
    assert re.search(r"^ETA for the whole DAG: \d+m\d\ds \(", out, re.M)  # 8 runs at 100 s, 1 job at once
    assert status.main(argv + ["--jobs", "0"]) == 2 and "--jobs must be at least 1" in capsys.readouterr().err


def test_no_results_folder_is_said_and_a_closed_pipe_ends_quietly(cfg, tmp_path, capsys):
    import subprocess
    import sys

    cfg, path = cfg
    assert status.main(["--config", str(path), "--results", str(tmp_path / "nowhere")]) == 0
    assert "no results found: " in capsys.readouterr().out
    # many seeds: the table outgrows the pipe's buffer, so `| head -1` closes it while status writes
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["seeds"] = list(range(400))
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(f"{sys.executable} -m mwm.workflow.status --config {path} --results {tmp_path} | head -1",
                          shell=True, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.stdout.startswith("config st") and proc.stderr == "", proc.stderr[-2000:]
