"""mwm.train.checkpoint: a run's exact checkpoint and resume, on the fake data: preempted and killed runs
resume bit for bit, a checkpoint that cannot be trusted is refused in one line, logs cut by a kill are
repaired from the copy beside the checkpoint."""

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import fakedata
from mwm.config import load_config
from mwm.train.loop import EXIT_PREEMPTED, Run
import pickle


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_interrupted_run_resumes_bit_for_bit(tmp_path, how):
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=24, train__lr_decay_iters=24,
                                train__checkpoint_interval=4, train__eval_interval=8)
    ref_out, out = tmp_path / "ref", tmp_path / "cut"
    assert subprocess.run(fakedata.child_cmd(cfg, ref_out, "hetero"), capture_output=True).returncode == 0
    proc = subprocess.Popen(fakedata.child_cmd(cfg, out, "hetero"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ck = out / "checkpoints" / "tiny" / "hetero" / "seed0" / "ckpt.pt"
    d = out / "runs" / "tiny" / "hetero" / "seed0"
    fakedata.wait_for(lambda: ck.exists() and (d / "metrics.csv").exists()
             and len((d / "metrics.csv").read_text().splitlines()) > 10, proc)
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    else:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == EXIT_PREEMPTED
        # the workflow deletes a failed job's declared outputs before retrying it
        import shutil

        shutil.rmtree(d)
    assert not (d / "summary.json").exists()
    done = subprocess.run(fakedata.child_cmd(cfg, out, "hetero"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout
    ref_d = ref_out / "runs" / "tiny" / "hetero" / "seed0"
    assert fakedata.metric_rows(d) == fakedata.metric_rows(ref_d)
    assert (d / "eval.csv").read_text() == (ref_d / "eval.csv").read_text()
    assert (d / "solver.csv").read_text() == (ref_d / "solver.csv").read_text()
    a = torch.load(d / "final.pt")
    b = torch.load(ref_d / "final.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_resume_loads_the_checkpoint_to_the_cpu_whatever_the_run_device(tmp_path):
    """The RNG states must reach torch.set_rng_state as CPU tensors and AdamW's step
    counters stay on the CPU: the checkpoint is loaded there, not onto the run's device
    (on CUDA, map_location=device made every resume fail). A run whose device is the
    meta device cannot have loaded its checkpoint onto it and resumed."""
    run = fakedata.tiny_run(tmp_path)
    run.open_logs(0)
    for _ in range(4):
        run.train_step()
        run.step += 1
    run.evaluate()
    run.save_checkpoint()
    want_rng, want_sampler = torch.get_rng_state(), run.sampler_state()  # before the next step's prefetched draw
    torch.manual_seed(123)
    again = fakedata.tiny_run(tmp_path)
    again.device = torch.device("meta")  # what the checkpoint must not be mapped to
    assert again.try_resume() == 4
    assert torch.equal(torch.get_rng_state(), want_rng)
    assert torch.equal(again.train_sampler.gen.get_state(), want_sampler)
    for p, q in zip(again.model.parameters(), run.model.parameters()):
        assert p.device.type == "cpu" and torch.equal(p, q)
    steps = [s["step"] for s in again.opts.adamw.state.values()]
    assert steps and all(t.device.type == "cpu" for t in steps)


def test_full_disk_at_a_checkpoint_is_named_in_the_summary_and_the_run_resumes(tmp_path, capsys):
    """The second checkpoint (step 8) hits a full disk: summary.json says "No space left on
    device" (not PyTorch's "unexpected pos"), the job ends with one line, the checkpoint of
    step 4 is intact and the next start resumes from it."""
    from test_io import full_disk_for

    with pytest.MonkeyPatch.context() as disk:  # the full disk only; the fake data stays
        failed = full_disk_for(disk, ".ckpt.pt.", after=1)
        rc, run = fakedata.run_inprocess(tmp_path, "stiefel")
    err = capsys.readouterr().err
    assert failed and rc == 1
    assert "No space left on device" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and "No space left on device" in s["error"] and "unexpected pos" not in s["error"]
    assert "the previous checkpoint is kept" in s["error"]
    ck = torch.load(tmp_path / "out" / "checkpoints" / "tiny" / "stiefel" / "seed0" / "ckpt.pt", weights_only=True)
    assert ck["step"] == 4

    rc, run = fakedata.run_inprocess(tmp_path, "stiefel")
    assert rc == 0 and "resumed from" in capsys.readouterr().out
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps_done"] == 12
    assert [r[0] for r in fakedata.csv_cols(run / "metrics.csv", ("step",))] == [str(i) for i in range(12)]


def test_planted_pickle_checkpoint_is_refused_and_runs_no_code(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    ck = tmp_path / "out" / "checkpoints" / "tiny" / "none" / "seed0" / "ckpt.pt"
    ck.parent.mkdir(parents=True)
    with open(ck, "wb") as fh:
        pickle.dump({"step": 4, "x": _Evil(marker)}, fh)
    # old torch.save zip layout as well: torch.save of an object that runs code when unpickled
    rc, d = fakedata.run_main(tmp_path)
    assert not marker.exists()
    assert rc == 2 and "ckpt.pt" in capsys.readouterr().err
    torch.save({"step": 4, "x": _Evil(marker)}, ck)
    rc, d = fakedata.run_main(tmp_path)
    assert not marker.exists()
    assert rc == 2 and "weights only" in capsys.readouterr().err


def _saved_at_step_4(tmp_path, assignment):
    """A tiny run's checkpoint written at step 4: the run and the checkpoint read back as weights only."""
    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    run = Run(cfg, assignment, 0, "paper", tmp_path / "out", data=fakedata.TOKENS)
    run.open_logs(0)
    run.step = 4
    run.save_checkpoint()
    return run, torch.load(run.ckpt_path, weights_only=True)


def test_real_checkpoints_load_as_weights_only(tmp_path):
    _, ck = _saved_at_step_4(tmp_path, "hetero")
    assert ck["step"] == 4


@pytest.mark.slow
def test_sigint_checkpoints_like_sigterm(tmp_path):
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=5000, train__lr_decay_iters=5000,
                                train__eval_interval=5000, train__checkpoint_interval=5000)
    out = tmp_path / "out"
    d = out / "runs" / "tiny" / "none" / "seed0"
    proc = subprocess.Popen(fakedata.child_cmd(cfg, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fakedata.wait_for(lambda: ((d / "metrics.csv").exists()
                               and len((d / "metrics.csv").read_text().splitlines()) > 3), proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == EXIT_PREEMPTED
    ck = torch.load(out / "checkpoints" / "tiny" / "none" / "seed0" / "ckpt.pt", weights_only=True)
    assert ck["step"] >= 3


@pytest.mark.parametrize("drop", ["opt_shares", "config_hash", "step", "sampler", "muon", "a model weight"])
def test_a_checkpoint_short_of_a_key_is_a_one_line_error_naming_it(tmp_path, capsys, monkeypatch, drop):
    from mwm.train.folder import RunFolder

    run, ck = _saved_at_step_4(tmp_path, "none")
    assert set(ck) == {*Run.CHECKPOINT_KEYS, *Run.OPTIONAL_KEYS}  # the list the check reads is what it holds
    if drop == "a model weight":
        del ck["model"][next(iter(ck["model"]))]
    elif drop == "muon":
        del ck["optimizers"]["muon"]
    else:
        del ck[drop]
    torch.save(ck, run.ckpt_path)
    monkeypatch.setattr(RunFolder, "logs_reach", lambda self, step, extent=None: True)  # as if logged to step 4
    rc, _ = fakedata.run_main(tmp_path)
    err = capsys.readouterr().err
    assert rc == 2 and "ckpt.pt" in err and "delete it to start the run afresh" in err, err
    assert err.count("\n") == 1  # one line, no traceback
    if drop not in ("a model weight", "muon"):
        assert f"lacks {drop}" in err


def _interrupted(tmp_path, monkeypatch, at_step: int, during_copy: bool = False):
    """A tiny run killed at its checkpoint of ``at_step``: after the checkpoint is written, or (``during_copy``)
    while the copy of its logs is written, after metrics.csv and before eval.csv. Returns the Run class."""
    import mwm.train.folder as folder_mod

    real_copy, real_save = folder_mod._copy_run_files, Run.save_checkpoint

    def copy(src, dst, replace_steps):
        if during_copy and dst.name == "logs" and (src / "metrics.csv").read_text().count("\n") > at_step:
            shutil.copyfile(src / "metrics.csv", dst / "metrics.csv")
            raise _Killed()
        real_copy(src, dst, replace_steps)

    def save(self):
        real_save(self)
        if self.step == at_step:
            raise _Killed()

    monkeypatch.setattr(folder_mod, "_copy_run_files", copy)
    monkeypatch.setattr(Run, "save_checkpoint", save)
    with pytest.raises(_Killed):
        fakedata.run_main(tmp_path)
    monkeypatch.setattr(folder_mod, "_copy_run_files", real_copy)
    monkeypatch.setattr(Run, "save_checkpoint", real_save)


def _same_as_uninterrupted(tmp_path, d):
    rc, ref = fakedata.run_main(tmp_path, out="ref")
    assert rc == 0
    for name in ("eval.csv", "spectral.csv", "attention.csv", "solver.csv"):
        assert (d / name).read_text() == (ref / name).read_text(), name
    rows = [r.split(",")[:4] for r in (d / "metrics.csv").read_text().splitlines()]
    assert rows == [r.split(",")[:4] for r in (ref / "metrics.csv").read_text().splitlines()]
    assert (sorted(p.name for p in (d / "spectra").glob("*.npz"))
            == sorted(p.name for p in (ref / "spectra").glob("*.npz")))


def test_a_kill_while_the_logs_are_copied_beside_a_checkpoint_loses_no_row(tmp_path, monkeypatch, capsys):
    """Killed between the metrics.csv and eval.csv copies of the step-8 checkpoint, then retried after the
    workflow deleted the job's outputs: the run resumes from the last whole checkpoint (step 4) and ends with
    every row an uninterrupted run has."""
    _interrupted(tmp_path, monkeypatch, at_step=8, during_copy=True)
    d = tmp_path / "out" / "runs" / "tiny" / "none" / "seed0"
    for f in d.glob("*.csv"):  # Snakemake removes a failed job's declared outputs before the retry
        f.unlink()
    capsys.readouterr()
    rc, d = fakedata.run_main(tmp_path)
    said = capsys.readouterr().out
    assert rc == 0 and "restored them from the checkpoint's copy" in said and "at step 4" in said, said
    _same_as_uninterrupted(tmp_path, d)


def test_a_duplicated_log_row_below_the_checkpoint_is_repaired_from_its_copy(tmp_path, monkeypatch):
    _interrupted(tmp_path, monkeypatch, at_step=8)
    d = tmp_path / "out" / "runs" / "tiny" / "none" / "seed0"
    lines = (d / "metrics.csv").read_text().splitlines()
    (d / "metrics.csv").write_text("\n".join([*lines[:3], lines[2], *lines[3:]]) + "\n")
    rc, d = fakedata.run_main(tmp_path)
    assert rc == 0
    _same_as_uninterrupted(tmp_path, d)


def test_a_foreign_checkpoint_is_refused_before_anything_moves(tmp_path, monkeypatch, capsys):
    _interrupted(tmp_path, monkeypatch, at_step=8)
    d = tmp_path / "out" / "runs" / "tiny" / "none" / "seed0"
    ck = tmp_path / "out" / "checkpoints" / "tiny" / "none" / "seed0" / "ckpt.pt"
    for f in d.glob("*.csv"):
        f.unlink()
    before = ck.read_bytes()
    capsys.readouterr()
    rc, _ = fakedata.run_main(tmp_path, train__learning_rate=0.002)
    err = capsys.readouterr().err
    assert rc == 2 and "belongs to a different configuration" in err and "learning_rate" in err, err
    assert "Traceback" not in err and ck.read_bytes() == before
    assert not list(d.glob("*.csv"))  # its copy of the logs was not brought in


def test_a_checkpoint_of_other_numerics_is_refused_naming_both_versions(tmp_path, monkeypatch, capsys):
    from mwm import numerics

    _interrupted(tmp_path, monkeypatch, at_step=4)
    ck = tmp_path / "out" / "checkpoints" / "tiny" / "none" / "seed0" / "ckpt.pt"
    monkeypatch.setattr(numerics, "VERSION", numerics.VERSION + 1)
    import mwm.plan.runs as runs_mod

    monkeypatch.setattr(runs_mod, "VERSION", numerics.VERSION)
    capsys.readouterr()
    rc, _ = fakedata.run_main(tmp_path)
    err = capsys.readouterr().err
    assert rc == 2 and f"numerics: run {numerics.VERSION - 1}, config {numerics.VERSION}" in err, err
    assert ck.is_file()


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


class _Killed(BaseException):
    """A kill at a chosen moment (BaseException: nothing in the run catches it)."""
