"""mwm.setaside: a finished run that is not the config's own is moved aside (nothing lost) and a
marker written, which the workflow's train job of that run takes as an input."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mwm.config import ConfigError, config_hash, load_config
from mwm.io import atomic_write_json
from mwm.lock import LOCK_NAME, RunLock, RunLocked
from mwm.paths import UnsafePathError
from mwm.plan.runs import Plan, checkpoint_dir, expected_identity, run_dir
from mwm.setaside import (RECORD_FILE, ForeignRuns, foreign_problem, foreign_root, next_marker, retrain_dir,
                          retrain_markers, set_aside)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cfg(tiny_config):
    return load_config(tiny_config(grid__assignments=["none", "dgram"]))


def _run(root: Path, cfg: dict, variant: str = "none", seed: int = 0, lr: float | None = 0.02) -> Path:
    """A finished run folder; ``lr`` set: a hand run's identity with that learning rate."""
    ident = copy.deepcopy(expected_identity(cfg, variant, seed))
    if lr is not None:
        ident["train"]["learning_rate"] = lr
    folder = run_dir(root, cfg["name"], variant, seed)
    atomic_write_json(folder / "summary.json", {"status": "completed", "identity": ident,
                                                "config_hash": config_hash(ident)})
    (folder / "metrics.csv").write_text("step,train_loss\n0,5.0\n")
    (folder / "spectra").mkdir()
    (folder / "spectra" / "step_000000.npz").write_bytes(b"x")
    return folder


def test_markers_are_numbered_inside_the_runs_folder(cfg, tmp_path):
    root = tmp_path / "results"
    assert retrain_dir(root, "tiny", "none", 0) == root / "runs" / "tiny" / ".retrain" / "none" / "seed0"
    assert retrain_markers(root, "tiny", "none", 0) == []
    assert next_marker(root, "tiny", "none", 0).name == "1.json"
    folder = retrain_dir(root, "tiny", "none", 0)
    folder.mkdir(parents=True)
    for name in ("2.json", "10.json", "1.json", "notes.txt", "0.json"):
        (folder / name).write_text("{}")
    assert [m.name for m in retrain_markers(root, "tiny", "none", 0)] == ["1.json", "2.json", "10.json"]
    assert next_marker(root, "tiny", "none", 0).name == "11.json"
    for bad in ("..", "../x", ".hidden"):
        with pytest.raises(UnsafePathError):
            retrain_dir(root, "tiny", bad, 0)
        with pytest.raises(UnsafePathError):
            foreign_root(root, bad)


def test_foreign_problem_names_the_keys_and_ignores_the_configs_own_and_missing_runs(cfg, tmp_path):
    root = tmp_path / "results"
    assert foreign_problem(Plan(cfg, root), "none", 0) is None  # no run
    _run(root, cfg, "dgram", lr=None)
    assert foreign_problem(Plan(cfg, root), "dgram", 0) is None  # the config's own
    _run(root, cfg)
    assert "train.learning_rate: run 0.02" in foreign_problem(Plan(cfg, root), "none", 0)


def test_the_foreign_runs_are_scanned_once_and_wired_by_their_markers(cfg, tmp_path):
    """The workflow's view: which finished runs are foreign, what it says, the train job's marker
    inputs (those made before, and the next while foreign) and the markers as targets."""
    root = tmp_path / "results"
    _run(root, cfg)  # none seed0: a hand run's identity
    _run(root, cfg, "dgram", lr=None)  # the config's own
    folder = retrain_dir(root, "tiny", "dgram", 0)
    folder.mkdir(parents=True)
    (folder / "1.json").write_text("{}")  # dgram was set aside and retrained once
    foreign = ForeignRuns(Plan(cfg, root))
    assert list(foreign.found) == [("none", 0)] and "train.learning_rate" in foreign.found["none", 0]
    note = foreign.note("config/tiny.yaml")
    assert note.startswith("mwm: 1 finished run(s) of config/tiny.yaml are not the config's own")
    assert f"{root}/runs/tiny/none/seed0/summary.json: " in note
    assert foreign.train_markers("none", "0") == [(retrain_dir(root, "tiny", "none", 0) / "1.json").as_posix()]
    assert foreign.train_markers("dgram", "0") == [(folder / "1.json").as_posix()]  # kept once retrained
    assert foreign.targets() == foreign.train_markers("none", "0")
    no_grid = {**cfg, "workflow": {**cfg["workflow"], "report": "solvers"}}  # trains no grid runs
    assert ForeignRuns(Plan(no_grid, root)).found == {} and ForeignRuns(Plan(no_grid, root)).note("x") == ""


def test_set_aside_moves_the_run_and_its_checkpoint_then_writes_the_marker(cfg, tmp_path):
    root = tmp_path / "results"
    run = _run(root, cfg)
    ckpt = checkpoint_dir(root, "tiny", "none", 0)
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt.pt").write_bytes(b"old")
    marker = next_marker(root, "tiny", "none", 0)
    rec = set_aside(cfg, "tiny.yaml", "none", 0, marker, root=root, now=0.0)
    dest = foreign_root(root, "tiny") / "none" / "seed0-19700101T000000Z"
    assert rec["moved_to"] == dest.as_posix() and "train.learning_rate: run 0.02" in rec["why"]
    assert not run.exists() and not ckpt.exists()
    moved = json.loads((dest / "summary.json").read_text())
    assert moved["identity"]["train"]["learning_rate"] == 0.02
    assert (dest / "metrics.csv").is_file() and (dest / "spectra" / "step_000000.npz").is_file()
    assert (dest / "checkpoint" / "ckpt.pt").read_bytes() == b"old"
    assert not (dest / LOCK_NAME).exists()  # the lock taken while moving went with it, and was removed
    assert json.loads(marker.read_text()) == json.loads((dest / RECORD_FILE).read_text()) == rec

    # written over again within the same second: a folder of its own, the next marker
    _run(root, cfg, lr=0.03)
    rec2 = set_aside(cfg, "tiny.yaml", "none", 0, next_marker(root, "tiny", "none", 0), root=root, now=0.0)
    assert rec2["moved_to"].endswith("seed0-19700101T000000Z-2") and (dest / "summary.json").is_file()
    assert [m.name for m in retrain_markers(root, "tiny", "none", 0)] == ["1.json", "2.json"]

    # a retry after the move (or the config's own run) moves nothing, and still writes its marker
    _run(root, cfg, lr=None)
    rec3 = set_aside(cfg, "tiny.yaml", "none", 0, next_marker(root, "tiny", "none", 0), root=root)
    assert rec3["moved_to"] is None and "nothing set aside" in rec3["why"]
    assert (run / "summary.json").is_file()
    assert len(retrain_markers(root, "tiny", "none", 0)) == 3


def test_set_aside_refuses_paths_outside_their_parent_and_runs_not_of_the_config(cfg, tmp_path):
    root = tmp_path / "results"
    _run(root, cfg)
    good = next_marker(root, "tiny", "none", 0)
    for marker in (tmp_path / "elsewhere.json", retrain_dir(root, "tiny", "none", 0) / ".." / "1.json",
                   retrain_dir(root, "tiny", "dgram", 0) / "1.json", good.with_name("x.json")):
        with pytest.raises(ConfigError, match="the markers of none seed 0 are"):
            set_aside(cfg, "tiny.yaml", "none", 0, marker, root=root)
    for variant, seed in (("../none", 0), ("hetero", 0), ("none", 7)):
        with pytest.raises(ConfigError, match="is not a run of config 'tiny'"):
            set_aside(cfg, "tiny.yaml", variant, seed, good, root=root)
    with pytest.raises(UnsafePathError):
        set_aside({**cfg, "name": ".."}, "tiny.yaml", "none", 0, good, root=root)
    assert run_dir(root, "tiny", "none", 0).is_dir() and not good.exists()


def test_set_aside_refuses_a_run_a_live_process_writes(cfg, tmp_path):
    root = tmp_path / "results"
    run = _run(root, cfg)
    lock = RunLock(run)
    try:
        with pytest.raises(RunLocked, match="in use by process"):
            set_aside(cfg, "tiny.yaml", "none", 0, next_marker(root, "tiny", "none", 0), root=root)
    finally:
        lock.release()
    assert (run / "summary.json").is_file() and not retrain_markers(root, "tiny", "none", 0)
    assert not foreign_root(root, "tiny").exists() or not any(foreign_root(root, "tiny").rglob("summary.json"))


def test_cli_has_help_and_one_line_errors(cfg, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "mwm.setaside", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    proc = cli("--help")
    assert proc.returncode == 0 and "results/hand/foreign/" in proc.stdout
    proc = cli("--config", "tiny.yaml", "--variant", "none", "--seed", "0", "--marker", "/tmp/1.json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: marker ")
    _run(tmp_path / "results", cfg)
    marker = "results/runs/tiny/.retrain/none/seed0/1.json"
    proc = cli("--config", "tiny.yaml", "--variant", "none", "--seed", "0", "--marker", marker)
    assert proc.returncode == 0, proc.stderr
    assert "set aside results/runs/tiny/none/seed0" in proc.stdout and (tmp_path / marker).is_file()
