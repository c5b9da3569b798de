"""Reliability and security (issue 13): what a config, a second process or a crash can do.

Each test here failed on the code before the fix it covers. Workflow tests run in a
throwaway copy of the repository under a temp folder, never in the working tree.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import pickle
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import fakedata
from mwm.config import ConfigError, load_config
from mwm.runs import checkpoint_dir, run_dir

ROOT = Path(__file__).resolve().parents[1]
HAS_SNAKEMAKE = importlib.util.find_spec("snakemake") is not None


def repo_copy(dest: Path) -> Path:
    """A throwaway copy of what the workflow needs (sources, rules, configs, profiles)."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".snakemake")
    for name in ("Snakefile", "rules", "config", "src", "local", "slurm", "profiles", "envs"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def snakemake_in(repo: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    env["PYTHONPATH"] = str(repo / "src")
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------
# 1. paths from config / CLI values stay inside their parent
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-rf", "a/b", "a b", ""])
def test_schema_refuses_unsafe_config_names(tmp_path, name):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"name": name}))
    with pytest.raises(ConfigError, match="name"):
        load_config(cfg)


def test_schema_refuses_unsafe_assignment_names(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"grid": {"custom": {"..": {"*.mlp.*": "stiefel"}}, "assignments": [".."]}}))
    with pytest.raises(ConfigError, match=r"grid\.(custom|assignments)"):
        load_config(cfg)


def test_inside_refuses_escapes(tmp_path):
    from mwm.paths import UnsafePathError, inside

    assert inside(tmp_path, "ci", "hetero", "seed0") == tmp_path / "ci" / "hetero" / "seed0"
    for parts in ([".."], ["."], ["ci", ".."], ["a/../.."], ["/etc"], ["ci", ""]):
        with pytest.raises(UnsafePathError):
            inside(tmp_path, *parts)
    # a symlink you make on purpose (a data folder on another disk) is followed
    (tmp_path / "link").symlink_to(tmp_path.parent)
    assert inside(tmp_path, "link") == tmp_path / "link"
    for build in (run_dir, checkpoint_dir):
        with pytest.raises(UnsafePathError):
            build(tmp_path, "..", "hetero", 0)
        with pytest.raises(UnsafePathError):
            build(tmp_path, "ci", "..", 0)


def test_data_folder_stays_inside_data_root(tmp_path):
    from mwm.data import dataset_dir

    assert dataset_dir({"corpus": "shakespeare"}, root=tmp_path).parent == tmp_path


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
@pytest.mark.parametrize("name", ["..", "."])
def test_workflow_refuses_dotdot_name_in_a_throwaway_copy(tmp_path, name):
    """`name: ".."` made the report's directory() output the repository itself (Snakemake
    deletes it before the job). Dry run in a copy: refused before any job is planned."""
    repo = repo_copy(tmp_path / "repo")
    cfg = yaml.safe_load((repo / "config" / "ci.yaml").read_text())
    cfg["name"] = name
    (repo / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake_in(repo, "--configfile", "bad.yaml", "--dry-run", "--nolock", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "name" in out and "paper_figures/.." not in out and "Job stats" not in out, out[-3000:]
    assert (repo / "Snakefile").exists() and (repo / "src").is_dir()


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_rules_quote_a_config_path_with_a_space(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    cfg_dir = repo / "my configs"
    cfg_dir.mkdir()
    shutil.copy(repo / "config" / "ci.yaml", cfg_dir / "ci.yaml")
    proc = snakemake_in(repo, "--configfile", "my configs/ci.yaml", "--dry-run", "--printshellcmds",
                        "--forceall", "--nolock", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    cmds = [line.split("Shell command: ", 1)[-1] for line in out.splitlines() if "python -m mwm." in line]
    assert len(cmds) >= 5
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert Path(argv[argv.index("--config") + 1]).resolve() == (cfg_dir / "ci.yaml").resolve(), cmd


# ---------------------------------------------------------------------------------------
# training runs: helpers
# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# 3. an interrupted rerun of a completed run never looks complete
# ---------------------------------------------------------------------------------------
def test_interrupted_rerun_leaves_no_summary_the_logs_do_not_back(tmp_path):
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=300, train__lr_decay_iters=300,
                                train__eval_interval=100, train__checkpoint_interval=100)
    out = tmp_path / "out"
    d = out / "runs" / "tiny" / "none" / "seed0"
    first = subprocess.run(fakedata.child_cmd(cfg, out), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((d / "summary.json").read_text())["status"] == "completed" and (d / "final.pt").exists()
    proc = subprocess.Popen(fakedata.child_cmd(cfg, out), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # the rerun has started once it reports its parameter count
            if "parameters" in line:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    if (d / "summary.json").exists():  # only a summary the logs back may stay
        s = json.loads((d / "summary.json").read_text())
        rows = len((d / "metrics.csv").read_text().splitlines()) - 1
        assert s["status"] != "completed" or rows == s["steps_done"], (s, rows)
    assert not (d / "final.pt").exists()
    assert not list((d / "spectra").glob("step_*.npz")) or \
        max(int(p.stem[5:]) for p in (d / "spectra").glob("step_*.npz")) <= 0


# ---------------------------------------------------------------------------------------
# 5. checkpoints are loaded as weights only
# ---------------------------------------------------------------------------------------
class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def test_planted_pickle_checkpoint_is_refused_and_runs_no_code(tmp_path, fake_data, capsys):
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


def test_real_checkpoints_load_as_weights_only(tmp_path, fake_data):
    from mwm.train import Run

    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    run = Run(cfg, "hetero", 0, "paper", tmp_path / "out")
    run.open_logs(0)
    run.step = 4
    run.save_checkpoint()
    ck = torch.load(run.ckpt_path, weights_only=True)
    assert ck["step"] == 4


def test_stale_logs_without_header_start_the_run_afresh(tmp_path, fake_data):
    """A checkpoint whose logs do not reach it (here: metrics.csv without its header, in the
    run folder and beside the checkpoint, as after two processes wrote one run folder) starts
    the run afresh: the stale logs and checkpoint go, the run completes as a fresh one would."""
    from mwm.train import Run

    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    run = Run(cfg, "none", 0, "paper", tmp_path / "out")
    run.open_logs(0)
    run.step = 4
    run.save_checkpoint()
    stale = "".join(f"{i},4.1,0.0006,0.02,0.01,100,0.005,0.5\n" for i in range(2))  # no header, short
    for folder in (run.dir, run.folder.mirror):
        (folder / "metrics.csv").write_text(stale)
    rc, d = fakedata.run_main(tmp_path)
    assert rc == 0 and d == run.dir
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    assert not run.ckpt_path.exists() and not run.folder.mirror.exists()
    rc, ref = fakedata.run_main(tmp_path, out="ref")
    assert rc == 0
    for name in ("eval.csv", "spectral.csv", "attention.csv"):
        assert (d / name).read_text() == (ref / name).read_text(), name
    rows = [r.split(",")[:4] for r in (d / "metrics.csv").read_text().splitlines()]
    assert rows == [r.split(",")[:4] for r in (ref / "metrics.csv").read_text().splitlines()]
    assert rows[0][0] == "step" and len(rows) == 1 + cfg["train"]["max_iters"]


# ---------------------------------------------------------------------------------------
# 6. files honour the umask; 7. strict JSON
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_honour_the_umask(tmp_path, fake_data, mask, mode):
    from mwm.studies.common import write_csv, write_json

    old = os.umask(mask)
    try:
        rc, d = fakedata.run_main(tmp_path, train__capture_pairs_step=2)
        write_csv(tmp_path / "study" / "a.csv", ["x"], [[1.0]])
        write_json(tmp_path / "study" / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert rc == 0
    files = [p for p in d.rglob("*") if p.is_file()] + list((tmp_path / "study").iterdir())
    assert {"summary.json", "final.pt", "pairs.npz", "metrics.csv", "a.csv"} <= {p.name for p in files}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == mode, (p, oct(p.stat().st_mode))


def test_summary_is_strict_json_with_reasons(tmp_path, fake_data):
    from mwm.train import Run

    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    run = Run(cfg, "none", 0, "paper", tmp_path / "out")
    run.last_val = float("nan")
    run.divergence.best_val = float("inf")
    run.write_summary(status="unstable")

    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    s = json.loads((run.dir / "summary.json").read_text(), parse_constant=refuse)
    assert s["final_val_loss"] is None and s["non_finite"]["final_val_loss"] == "nan"


# ---------------------------------------------------------------------------------------
# 7. command line and signals
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [(["--seed", "-1"], "--seed"), (["--threads", "-1"], "--threads"),
                                         (["--threads", "0"], "--threads")])
def test_negative_seed_and_threads_are_refused(tmp_path, fake_data, capsys, args, needle):
    from mwm.train import main

    cfg = fakedata.write_config(tmp_path / "tiny.yaml")
    argv = ["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(tmp_path / "o")] + args
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_colnorm_of_an_assignment_without_dgram_is_refused(tmp_path, fake_data, capsys):
    rc, d = fakedata.run_main(tmp_path, assignment="none-colnorm")
    assert rc == 2 and "colnorm" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sigint_checkpoints_like_sigterm(tmp_path):
    from mwm.train import EXIT_PREEMPTED

    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=5000, train__lr_decay_iters=5000,
                                train__eval_interval=5000, train__checkpoint_interval=5000)
    out = tmp_path / "out"
    d = out / "runs" / "tiny" / "none" / "seed0"
    proc = subprocess.Popen(fakedata.child_cmd(cfg, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fakedata.wait_for(lambda: (d / "metrics.csv").exists() and len((d / "metrics.csv").read_text().splitlines()) > 3, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == EXIT_PREEMPTED
    ck = torch.load(out / "checkpoints" / "tiny" / "none" / "seed0" / "ckpt.pt", weights_only=True)
    assert ck["step"] >= 3


def test_report_refuses_a_summary_its_logs_do_not_back(tmp_path, fake_data):
    """What an interrupted rerun left before the fix: the old summary over logs cut to step 0."""
    from mwm.report.load import ReportError, load_runs

    rc, d = fakedata.run_main(tmp_path, grid__assignments=["none"])
    assert rc == 0
    cfg = load_config(tmp_path / "tiny.yaml")
    assert len(load_runs(cfg, tmp_path / "out")) == 1
    for name in ("metrics.csv", "eval.csv"):
        lines = (d / name).read_text().splitlines()
        (d / name).write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(ReportError, match=r"metrics\.csv.*do not back"):
        load_runs(cfg, tmp_path / "out")
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps(dict(s, status="running")))
    with pytest.raises(ReportError, match="not a finished run"):
        load_runs(cfg, tmp_path / "out")


# ---------------------------------------------------------------------------------------
# 4. training verifies the bins (cached); meta.json checks itself; ids inside the vocabulary
# ---------------------------------------------------------------------------------------
DATA = {"corpus": "text", "paths": ["corpus/*.txt"], "vocab_size": 64, "num_proc": 1}


@pytest.fixture()
def prepared(tmp_path, monkeypatch):
    """A small prepared folder under tmp_path/data (the cwd), and a config that trains on it."""
    from mwm.data import dataset_dir, prepare_dataset

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    rng = np.random.default_rng(0)
    words = ["the", "king", "of", "Denmark", "is", "dead", "long", "live", "O", "thou", ",", ".", "\n"]
    for i in range(6):
        (tmp_path / "corpus" / f"d{i}.txt").write_text(" ".join(rng.choice(words, size=600)))
    folder = prepare_dataset(DATA, log=None)
    assert folder == dataset_dir(DATA)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml", train__max_iters=2, train__eval_interval=2,
                                train__lr_decay_iters=2, data__corpus="text", data__paths=DATA["paths"],
                                data__vocab_size=64, data__num_proc=1)
    return tmp_path / folder, cfg


def _train(cfg, out):
    from mwm.train import main

    return main(["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(out)])


def _rewrite_meta(folder, edit):
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    if "meta_sha256" in meta:
        from mwm.data.reader import meta_digest

        meta["meta_sha256"] = meta_digest(meta)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def test_training_refuses_a_flipped_byte_in_val_bin(prepared, capsys):
    folder, cfg = prepared
    assert _train(cfg, "ok") == 0
    raw = bytearray((folder / "val.bin").read_bytes())
    raw[10] ^= 1  # same size: the open-time size check cannot see it
    st = (folder / "val.bin").stat()
    (folder / "val.bin").write_bytes(bytes(raw))
    assert _train(cfg, "bad") == 2
    err = capsys.readouterr().err
    assert "val.bin" in err and "sha256" in err, err
    assert not Path("bad/runs").exists() or not list(Path("bad").rglob("summary.json"))


def test_verdict_is_cached_by_size_and_mtime(prepared, monkeypatch):
    from mwm.data import TokenDataset

    folder, _ = prepared
    assert TokenDataset(folder).verify_cached() is True  # first time: read in full
    calls = []
    real = TokenDataset._scan
    monkeypatch.setattr(TokenDataset, "_scan", lambda self, split: calls.append(split) or real(self, split))
    assert TokenDataset(folder).verify_cached() is False and calls == []
    os.utime(folder / "train.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert TokenDataset(folder).verify_cached() is True and calls == ["train", "val"]


def test_edited_vocab_size_in_meta_is_refused(prepared, capsys):
    from mwm.data.__main__ import main as data_main

    folder, cfg = prepared
    meta = json.loads((folder / "meta.json").read_text())
    meta["vocab_size"] = 50257  # a hand edit: the file no longer matches its own hash
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    assert data_main(["info", str(folder), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "meta.json" in err and ("vocab_size" in err or "edited" in err), err
    # the same edit with the self-hash recomputed: the cross-check against the remap refuses it
    _rewrite_meta(folder, lambda m: m.update(vocab_size=50257))
    assert data_main(["info", str(folder), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "meta.json" in err and "vocab_size" in err, err
    assert _train(cfg, "x") == 2


def test_token_id_outside_the_vocabulary_names_file_and_offset(prepared, capsys):
    from mwm.data.reader import sha256_file

    folder, cfg = prepared
    ids = np.fromfile(folder / "train.bin", dtype="<u2")
    ids[123] = 1000  # vocab is 65
    ids.tofile(folder / "train.bin")
    _rewrite_meta(folder, lambda m: m["splits"]["train"].update(sha256=sha256_file(folder / "train.bin")))
    assert _train(cfg, "x") == 2
    err = capsys.readouterr().err
    assert "train.bin" in err and "offset 123" in err and "1000" in err, err


# ---------------------------------------------------------------------------------------
# 7. after Ctrl-C the plain `snakemake --cores 2 all` redoes incomplete jobs
# ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_plain_snakemake_reruns_incomplete_jobs(tmp_path):
    """What a Ctrl-C leaves: outputs Snakemake marked incomplete (its .snakemake/incomplete
    record). The plain command, without --profile, must plan to redo the job, not stop."""
    from base64 import urlsafe_b64encode

    from mwm.data import dataset_dir

    repo = repo_copy(tmp_path / "repo")
    data = dataset_dir(load_config(repo / "config" / "ci.yaml")["data"])
    (repo / data).mkdir(parents=True)
    for f in ("train.bin", "val.bin", "meta.json"):
        (repo / data / f).write_text("partial")
    marker = repo / ".snakemake" / "incomplete" / urlsafe_b64encode(str(data / "meta.json").encode()).decode()
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"external_jobid": None}))
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "2", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "IncompleteFilesException" not in out and "rule prepare_data" in out, out[-3000:]


# ---------------------------------------------------------------------------------------
# 7. YAML exponent numbers; a full disk in prepare
# ---------------------------------------------------------------------------------------
def test_exponent_numbers_are_accepted(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  learning_rate: 6e-4\n  max_iters: 2e2\n")
    c = load_config(cfg, ["train.muon_lr=1e-2", "train.lr_decay_iters=1e3", "grid.seeds=[0, 1e0]"])
    assert c["train"]["learning_rate"] == 6e-4 and c["train"]["muon_lr"] == 1e-2
    assert c["train"]["max_iters"] == 200 and type(c["train"]["max_iters"]) is int
    assert c["train"]["lr_decay_iters"] == 1000 and c["grid"]["seeds"] == [0, 1]
    assert all(type(s) is int for s in c["grid"]["seeds"])
    with pytest.raises(ConfigError, match="max_iters"):
        load_config(cfg, ["train.max_iters=1.5e0"])
    # a quoted value stays a string (and the schema says where it is wrong)
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(cfg, ["train.learning_rate='1e-3'"])


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_workflow_accepts_exponent_numbers(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    text = (repo / "config" / "ci.yaml").read_text()
    assert "max_iters: " in text
    import re

    (repo / "e.yaml").write_text(re.sub(r"max_iters: \d+", "max_iters: 3e1", text))
    proc = snakemake_in(repo, "--configfile", "e.yaml", "--dry-run", "--nolock", "--cores", "1", "all")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_full_disk_in_prepare_is_one_clear_line(tmp_path, monkeypatch, capsys):
    from mwm.data.__main__ import main as data_main

    corpus = tmp_path / "c.txt"
    corpus.write_text("the king is dead, long live the king\n" * 50)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / ".prepare-x" / "train.raw"))
        yield  # a generator, like encode_units

    monkeypatch.setattr("mwm.data.prepare.encode_units", full)
    rc = data_main(["prepare", "--corpus", "text", "--paths", str(corpus), "--split", "tail", "--out",
                    str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("mwm.data: ")]
    assert rc == 1 and len(lines) == 1, err
    assert "no space left on device" in lines[0] and "train.raw" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


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
