"""mwm.train.launch: N DDP ranks of one run (the rank count a config asks for, the threads split across
ranks, the exit status the ranks agree on). The real torchrun path runs in test_train.py and through
Snakemake in test_workflow_runs.py; here torchrun is replaced by a stand-in process."""

import os
import subprocess
import sys

import pytest

import mwm.train.launch as launch_mod
from mwm.config import ConfigError
from mwm.plan.ranks import ranks_per_run
from mwm.train.launch import LAUNCH_DIR_ENV, launch, main, worker_exit


def wf(gpu=0, ranks=None, accum=4):
    return {"workflow": {"resources": {"train": {"gpu": gpu}}, "ranks_per_run": ranks}, "train": {"grad_accum": accum}}


def test_ranks_follow_the_gpus_unless_set():
    assert ranks_per_run(wf()) == 1
    assert ranks_per_run(wf(gpu=4)) == 4
    assert ranks_per_run(wf(gpu=0, ranks=2)) == 2  # gloo ranks on CPU
    assert ranks_per_run(wf(gpu=2, ranks=2)) == 2
    with pytest.raises(ConfigError, match="ranks_per_run=3 but workflow.resources.train.gpu=2"):
        ranks_per_run(wf(gpu=2, ranks=3))


def test_ranks_must_share_the_step_s_micro_batches():
    with pytest.raises(ConfigError, match=r"train.grad_accum=1 .* multiple of the 2 ranks"):
        ranks_per_run(wf(gpu=2, accum=1))
    with pytest.raises(ConfigError, match=r"train.grad_accum=6 .* multiple of the 4 ranks"):
        ranks_per_run(wf(gpu=0, ranks=4, accum=6))


class FakeTorchrun:
    """Stands in for ``subprocess.Popen`` of torchrun: each rank 'writes' its exit status."""

    def __init__(self, codes, rc):
        self.codes, self.rc, self.calls = codes, rc, []

    def __call__(self, cmd, env, preexec_fn=None):
        self.calls.append((cmd, env))
        for rank, code in enumerate(self.codes):
            with open(os.path.join(env[LAUNCH_DIR_ENV], f"rc.{rank}"), "w") as fh:
                fh.write(str(code))
        return self

    def wait(self):
        return self.rc


@pytest.mark.parametrize("codes, rc, expected", [
    ([0, 0], 0, 0),
    ([75, 75], 1, 75),  # preempted: every rank checkpointed, torchrun's failure is not the answer
    ([2, 2], 1, 2),     # bad input on every rank
    ([0, 1], 1, 1),     # ranks disagree: torchrun's status
    ([0], -9, 1),       # torchrun killed, one rank's status missing: a failure
])
def test_exit_status_is_the_ranks_common_one(monkeypatch, codes, rc, expected):
    fake = FakeTorchrun(codes, rc)
    monkeypatch.setattr(launch_mod.subprocess, "Popen", fake)
    assert launch(2, ["--config", "c.yaml"], wait_s=0) == expected


def test_threads_are_split_across_ranks(monkeypatch):
    fake = FakeTorchrun([0, 0], 0)
    monkeypatch.setattr(launch_mod.subprocess, "Popen", fake)
    assert main(["--nproc", "2", "--threads", "5", "--", "--config", "c.yaml", "--seed", "0"]) == 0
    cmd, env = fake.calls[0]
    assert "--nproc_per_node=2" in cmd and cmd[cmd.index("-m", 3) + 1] == "mwm.train"
    assert cmd[-4:] == ["--seed", "0", "--threads", "2"] and env["OMP_NUM_THREADS"] == "2"
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        launch(0, [])


def test_a_rank_records_its_pid_and_status_where_the_launcher_reads(tmp_path):
    code = ("import sys; from mwm.train.launch import worker_started, worker_exit; "
            "worker_started(); sys.exit(worker_exit(75))")
    env = dict(os.environ, **{LAUNCH_DIR_ENV: str(tmp_path), "RANK": "1"})
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == 75
    assert (tmp_path / "rc.1").read_text() == "75" and (tmp_path / "pid.1").read_text().isdigit()


def test_outside_a_launch_a_rank_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(LAUNCH_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert worker_exit(3) == 3 and list(tmp_path.iterdir()) == []
