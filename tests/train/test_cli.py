"""mwm.train.cli: python -m mwm.train on the fake data: bad input refused in one line before anything is
written, a hand run's results root, the ranks a run can share, the signal handlers it gives back."""

import json
import signal
from pathlib import Path

import pytest

import fakedata
from mwm.config import load_config
from mwm.train.cli import main


def test_bad_input_fails_before_writing(tmp_path, capsys):
    rc, d = fakedata.run_inprocess(tmp_path, assignment="heter")
    assert rc == 2 and not d.exists()
    assert "unknown assignment 'heter'" in capsys.readouterr().err
    cfg = fakedata.write_config(tmp_path / "bad.yaml", train__lerning_rate=0.1)
    assert main(["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(tmp_path / "o")],
                data=fakedata.TOKENS) == 2
    assert "lerning_rate" in capsys.readouterr().err
    rc, d = fakedata.run_inprocess(tmp_path, model__vocab_size=10)
    assert rc == 2 and "vocab_size=10" in capsys.readouterr().err
    rc, d = fakedata.run_inprocess(tmp_path, assignment="mine", grid__custom={"mine": {"*.attn.q_proj.*": "stiefel"}},
                          grid__assignments=["mine"])
    assert rc == 2 and "match no hidden matrix" in capsys.readouterr().err and not d.exists()


def test_hand_run_with_overrides_never_lands_in_the_config_folder(tmp_path, monkeypatch, capsys):
    """A hand run with an override went into results/runs/<name>/ and replaced the config's run."""
    from mwm.config import config_hash
    from mwm.plan.runs import HAND_FOLDER, RESULTS_ROOT

    monkeypatch.chdir(tmp_path)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=4, train__lr_decay_iters=4)
    own = Path(RESULTS_ROOT) / "runs" / "tiny" / "none" / "seed0"
    args = ["--config", str(cfg), "--assignment", "none", "--seed", "0"]
    assert main([*args, "--out", RESULTS_ROOT, "train.learning_rate=0.02"], data=fakedata.TOKENS) == 2
    err = capsys.readouterr().err
    assert "train.learning_rate: run 0.02" in err and "not config 'tiny'" in err and not own.exists()
    assert main([*args, "train.learning_rate=0.02"], data=fakedata.TOKENS) == 0
    hand = Path(RESULTS_ROOT) / HAND_FOLDER / config_hash(load_config(cfg, ["train.learning_rate=0.02"]))
    assert str(hand) in capsys.readouterr().out
    s = json.loads((hand / "runs" / "tiny" / "none" / "seed0" / "summary.json").read_text())
    assert s["identity"]["train"]["learning_rate"] == 0.02 and not own.exists()
    assert json.loads((hand / "overrides.json").read_text())["overrides"] == ["train.learning_rate=0.02"]
    # an override that leaves the run as the config's own (not a train/model/data key) stays there
    assert main([*args, "workflow.retries=3"], data=fakedata.TOKENS) == 0 and (own / "summary.json").exists()


def test_a_hand_run_after_a_config_edit_keeps_the_finished_run(tmp_path, monkeypatch, capsys):
    """docs/training.md's "same by hand" command after a config edit replaced the finished run in place; it
    is now moved to results/hand/foreign/ first, as the workflow would set it aside."""
    monkeypatch.chdir(tmp_path)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=4, train__lr_decay_iters=4)
    args = ["--config", str(cfg), "--assignment", "none", "--seed", "0"]
    own = Path("results") / "runs" / "tiny" / "none" / "seed0"
    assert main(args, data=fakedata.TOKENS) == 0
    # its own run: rerun in place, as before
    assert main(args, data=fakedata.TOKENS) == 0 and not Path("results/hand").exists()
    first = (own / "summary.json").read_text()
    fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=4, train__lr_decay_iters=4, train__eval_interval=2)
    capsys.readouterr()
    assert main(args, data=fakedata.TOKENS) == 0
    assert "moved it to" in capsys.readouterr().err
    kept = list((Path("results") / "hand" / "foreign" / "tiny" / "none").glob("seed0-*"))
    assert len(kept) == 1 and (kept[0] / "summary.json").read_text() == first
    assert "train.eval_interval" in json.loads((kept[0] / "set_aside.json").read_text())["why"]
    assert json.loads((own / "summary.json").read_text())["identity"]["train"]["eval_interval"] == 2


def test_config_errors_fail_before_any_data_is_read(tmp_path, monkeypatch, capsys):
    """n_embd/n_head and grid.custom patterns need no data: they failed only once the data was open."""
    class NoData:  # any read of the run's tokens fails the test
        def __getattr__(self, name):
            raise AssertionError("the data was read before the config was checked")

    rc, d = fakedata.run_inprocess(tmp_path, tokens=NoData(), model__n_embd=15, model__n_head=2)
    assert rc == 2 and "n_embd=15 is not divisible by n_head=2" in capsys.readouterr().err and not d.exists()
    rc, d = fakedata.run_inprocess(tmp_path, assignment="mine", tokens=NoData(),
                                   grid__custom={"mine": {"*.attn.q_proj.*": "stiefel"}}, grid__assignments=["mine"])
    err = capsys.readouterr().err
    assert rc == 2 and "grid.custom.mine" in err and "match no hidden matrix" in err and not d.exists()


@pytest.mark.parametrize("args,needle", [
    (["--seed", "99999999999999999999"], "above 2147483647"),
    (["--out", "/"], "the filesystem root is not an output folder"),
    (["--out", "/proc"], "--out /proc is not a writable folder"),
])
def test_bad_seed_and_output_roots_are_refused_before_the_run(tmp_path, monkeypatch, capsys, args, needle):
    """`--seed 99999999999999999999` died with "Overflow when unpacking long long"; `--out /`
    (as root) made /runs and /checkpoints; `--out /proc` was a traceback."""
    started = []
    monkeypatch.setattr("mwm.train.cli.train", lambda *a, **k: started.append(a) or 0)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml")
    argv = ["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(tmp_path / "o"), *args]
    try:
        rc = main(argv, data=fakedata.TOKENS)
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert started == [] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,needle", [(["--seed", "-1"], "--seed"), (["--threads", "-1"], "--threads"),
                                         (["--threads", "0"], "--threads")])
def test_negative_seed_and_threads_are_refused(tmp_path, capsys, args, needle):
    cfg = fakedata.write_config(tmp_path / "tiny.yaml")
    argv = ["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(tmp_path / "o")] + args
    with pytest.raises(SystemExit) as exc:
        main(argv, data=fakedata.TOKENS)
    assert exc.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_colnorm_of_an_assignment_without_dgram_is_refused(tmp_path, capsys):
    rc, d = fakedata.run_main(tmp_path, assignment="none-colnorm")
    assert rc == 2 and "colnorm" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_hand_run_is_checked_against_what_it_runs_not_the_grid_s_capture_window(tmp_path, capsys):
    """The grid captures steps 6-7 of stiefel seed 0 for the solver study; a hand run of 4 steps captures
    nothing and is no grid run, so that window does not refuse it. The run's own model still is checked."""
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=8, train__lr_decay_iters=8,
                                studies__solvers={"source": "grid", "assignments": ["stiefel"],
                                                  "capture_start": 6, "capture_length": 2},
                                grid__assignments=["stiefel"])
    args = ["--config", str(cfg), "--assignment", "stiefel", "--seed", "0", "--out", str(tmp_path / "o")]
    assert main([*args, "train.max_iters=4", "train.lr_decay_iters=4"], data=fakedata.TOKENS) == 0
    assert main([*args, "model.n_head=3"], data=fakedata.TOKENS) == 2
    assert "tiny.yaml with model.n_head=3: model:" in capsys.readouterr().err
    # the config file itself still is checked whole
    bad = fakedata.write_config(tmp_path / "bad.yaml", train__max_iters=6, train__lr_decay_iters=6,
                                studies__solvers={"source": "grid", "assignments": ["stiefel"],
                                                  "capture_start": 6, "capture_length": 2},
                                grid__assignments=["stiefel"])
    assert main(["--config", str(bad), "--assignment", "stiefel", "--seed", "0", "--out", str(tmp_path / "b"),
                 "train.max_iters=4"], data=fakedata.TOKENS) == 2
    assert "capture_start + capture_length = 8 is past train.max_iters 6" in capsys.readouterr().err


def test_a_results_folder_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Root writes into read-only folders, so the OS's refusal is planted where the run takes its lock."""
    import mwm.lock

    def refuse(self, folder, *a, **k):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(mwm.lock.RunLock, "__init__", refuse)
    rc, d = fakedata.run_main(tmp_path)
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert "cannot write the run: Permission denied" in err and str(d) in err and "Traceback" not in err


def test_a_run_gives_back_the_signal_handlers_it_replaced(tmp_path):
    mine = lambda signum, frame: None  # noqa: E731
    before = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        rc, _ = fakedata.run_inprocess(tmp_path, train__max_iters=2, train__lr_decay_iters=2, train__eval_interval=2)
        assert rc == 0
        assert all(signal.getsignal(sig) is mine for sig in before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_nproc_that_the_grad_accum_cannot_share_is_refused_before_torchrun(tmp_path, capsys, monkeypatch):
    import mwm.train.cli as cli

    started = []
    monkeypatch.setattr(cli, "launch", lambda *a, **k: started.append(a) or 0)
    rc, _ = fakedata.run_main(tmp_path, "--nproc", "2", train__grad_accum=1)
    err = capsys.readouterr().err
    assert rc == 2 and started == [] and err.count("\n") == 1, err
    assert "train.grad_accum=1" in err and "multiple of the 2 ranks" in err
