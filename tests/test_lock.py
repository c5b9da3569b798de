"""mwm.lock: one process per run folder. A second process is refused naming the holder, a dead
holder's lock is taken over, another host's lock only once its heartbeat has stopped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import fakedata


@pytest.mark.slow
def test_second_process_on_a_run_is_refused_naming_the_holder(tiny_config, tmp_path, capsys):
    cfg = tiny_config(train__max_iters=5000, train__lr_decay_iters=5000,
                      train__eval_interval=5000, train__checkpoint_interval=5000)
    out = tmp_path / "out"
    d = out / "runs" / "tiny" / "none" / "seed0"
    proc = subprocess.Popen(fakedata.child_cmd(cfg, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fakedata.wait_for(lambda: ((d / "metrics.csv").exists()
                                   and len((d / "metrics.csv").read_text().splitlines()) > 2),
                          proc)
        from mwm.train.cli import main

        rows_before = len((d / "metrics.csv").read_text().splitlines())
        rc = main(["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(out)],
                  data=fakedata.TOKENS)
        err = capsys.readouterr().err
        assert rc == 2
        assert f"process {proc.pid}" in err and socket.gethostname() in err and "in use" in err, err
        assert proc.poll() is None  # the holder goes on, its logs untouched by the refused one
        assert len((d / "metrics.csv").read_text().splitlines()) >= rows_before
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, capsys):
    from mwm.lock import LOCK_NAME

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = tmp_path / "out" / "runs" / "tiny" / "none" / "seed0"
    d.mkdir(parents=True)
    (d / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "token": "x"}))
    rc, d2 = fakedata.run_main(tmp_path)
    assert rc == 0 and d2 == d
    assert "stale lock" in capsys.readouterr().out
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    assert not (d / LOCK_NAME).exists()  # released at the end


def test_lock_of_another_host_is_broken_only_without_heartbeat(tmp_path, capsys):
    from mwm.lock import LOCK_NAME, STALE_AFTER_S, RunLock, RunLocked

    lock_file = tmp_path / LOCK_NAME
    lock_file.write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "token": "x"}))
    with pytest.raises(RunLocked, match="elsewhere.example.*delete"):
        RunLock(tmp_path)
    old = time.time() - STALE_AFTER_S - 60  # its node died: no heartbeat for longer than the limit
    os.utime(lock_file, (old, old))
    taken = RunLock(tmp_path)
    assert "stale lock" in capsys.readouterr().out
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    taken.release()
    assert not lock_file.exists()
    lock = RunLock(tmp_path / "free")
    with pytest.raises(RunLocked, match=f"process {os.getpid()}"):
        RunLock(tmp_path / "free")
    lock.release()
    RunLock(tmp_path / "free").release()


# -- the holder's heartbeat ----------

def test_lock_holder_keeps_its_heartbeat(tmp_path, monkeypatch):
    import mwm.lock

    monkeypatch.setattr(mwm.lock, "HEARTBEAT_S", 0.05)
    lock = mwm.lock.RunLock(tmp_path)
    old = time.time() - 3600
    os.utime(lock.path, (old, old))
    t0 = time.time()
    while lock.path.stat().st_mtime < t0 - 1 and time.time() - t0 < 10:
        time.sleep(0.05)
    assert lock.path.stat().st_mtime >= t0 - 1
    lock.release()


@pytest.mark.parametrize("case", ["gone", "ended", "this job", "silent", "running"])
def test_a_slurm_job_s_lock_is_taken_over_once_its_job_is_gone(tmp_path, monkeypatch, capsys, case):
    """A retry on another node need not wait STALE_AFTER_S after a hard kill: a lock whose SLURM job
    squeue no longer runs, or is this job requeued, or whose heartbeat missed three beats, is stale."""
    import mwm.lock
    from mwm.lock import LOCK_NAME, SLURM_STALE_AFTER_S, RunLock, RunLocked

    monkeypatch.setenv("SLURM_JOB_ID", "2002")
    states = {"gone": "", "ended": "COMPLETED", "this job": "RUNNING", "silent": None, "running": "RUNNING"}
    monkeypatch.setattr(mwm.lock, "slurm_job_state", lambda job: states[case])
    lock_file = tmp_path / LOCK_NAME
    job = "2002" if case == "this job" else "1001"
    lock_file.write_text(json.dumps({"pid": 1, "host": "node7.example", "token": "x", "slurm_job": job}))
    if case == "silent":  # squeue cannot tell: the heartbeat decides
        with pytest.raises(RunLocked, match=f"SLURM job 1001.*taken over after {SLURM_STALE_AFTER_S:.0f} s"):
            RunLock(tmp_path)
        old = time.time() - SLURM_STALE_AFTER_S - 30
        os.utime(lock_file, (old, old))
    if case == "running":  # its job still runs, heartbeat fresh: refused, naming the job
        with pytest.raises(RunLocked, match="node7.example, SLURM job 1001"):
            RunLock(tmp_path)
        return
    taken = RunLock(tmp_path)
    assert "stale lock" in capsys.readouterr().out
    assert json.loads(lock_file.read_text())["slurm_job"] == "2002"
    taken.release()


def test_slurm_job_state_reads_squeue(tmp_path, monkeypatch):
    from mwm.lock import slurm_job_state

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text('#!/bin/sh\ncase "$3" in 7) echo RUNNING;; 8) echo "slurm_load_jobs error: Invalid job id '
                      'specified" >&2; exit 1;; *) echo "cannot reach slurmctld" >&2; exit 1;; esac\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert slurm_job_state("7") == "RUNNING"
    assert slurm_job_state("8") == ""  # purged from the controller: gone
    assert slurm_job_state("9") is None  # squeue cannot tell
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slurm_job_state("7") is None  # no squeue here
