"""Training jobs through Snakemake itself (local executor, a throwaway working folder).

- An unstable run and an AdamW run complete as jobs with every declared output, and
  the absorption study passes over their "not captured" pairs files to a run that
  reached the capture step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import re
import shlex
import shutil
from fakedata import HAS_SNAKEMAKE, alias_bomb, repo_copy, snakemake_in
from mwm.config import load_config, read_config
from mwm.paths import CONFIG_ENV

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("snakemake") is None,
                                 reason="snakemake not installed (pip install -e '.[workflow]')")]

BASE = {
    "data": {"corpus": "shakespeare", "vocab_size": 256, "split": "tail", "val_fraction": 0.1},
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
    "train": {"batch_size": 4, "max_iters": 12, "warmup_iters": 2, "lr_decay_iters": 12, "eval_interval": 4,
              "eval_iters": 1, "probe_batch": 2, "log_interval": 4, "checkpoint_interval": 4,
              "dual_ascent_steps": 3, "device": "cpu", "keep_final_checkpoint": False},
    "workflow": {"retries": 0, "resources": {k: {"threads": 1, "mem_mb": 500, "runtime": 5}
                                             for k in ("data", "study", "train", "report")}},
    "studies": {"device": "cpu",
                "absorption": {"sizes": [8], "seeds": 1, "reference_iterations": 12, "snapshots": [2, 4],
                               "flatness_T": [2, 4]}},
}


def write_config(folder: Path, name: str, **sections) -> Path:
    cfg = yaml.safe_load(yaml.safe_dump(BASE))
    cfg["name"] = name
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake(workdir: Path, config: Path, *targets: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("SNAKEMAKE_PROFILE", None)
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "--cores", "2",
         *targets, "--configfile", str(config)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def test_unstable_and_adamw_runs_complete_and_absorption_finds_pairs(tmp_path):
    # hetero is the preferred pairs source; its huge AdamW learning rate (weight decay
    # factor 1 - lr wd of about -1000) overflows the embeddings within a few steps,
    # long before capture_pairs_step; stiefel reaches it
    cfg = write_config(tmp_path, "div", train={**BASE["train"], "capture_pairs_step": 8},
                       grid={"assignments": ["hetero", "stiefel", "adamw"],
                             "train_overrides": {"hetero": {"learning_rate": 1.0e4}}})
    runs = tmp_path / "results" / "runs" / "div"
    targets = [f"results/runs/div/{v}/seed0/summary.json" for v in ("hetero", "stiefel", "adamw")]
    targets.append("results/studies/div/absorption_derived.json")
    res = snakemake(tmp_path, cfg, *targets)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    summary = {v: json.loads((runs / v / "seed0" / "summary.json").read_text()) for v in ("hetero", "stiefel", "adamw")}
    assert summary["hetero"]["status"] == "unstable"
    assert 0 <= summary["hetero"]["onset_step"] < 8 and summary["hetero"]["steps_done"] <= 8
    assert summary["stiefel"]["status"] == summary["adamw"]["status"] == "completed"
    for v in ("hetero", "stiefel", "adamw"):  # every declared output is there
        for f in ("metrics.csv", "eval.csv", "spectral.csv", "attention.csv", "pairs.npz"):
            assert (runs / v / "seed0" / f).is_file(), (v, f)
        assert (runs / v / "seed0" / "spectra").is_dir()
    with np.load(runs / "hetero" / "seed0" / "pairs.npz") as z:
        assert not bool(z["captured"]) and len(z["names"]) == 0 and "unstable" in str(z["reason"])
    with np.load(runs / "adamw" / "seed0" / "pairs.npz") as z:
        assert not bool(z["captured"]) and "no Muon matrices" in str(z["reason"])
    with np.load(runs / "stiefel" / "seed0" / "pairs.npz") as z:
        assert bool(z["captured"]) and int(z["step"]) == 8 and len(z["names"]) == 4

    derived = json.loads((tmp_path / "results" / "studies" / "div" / "absorption_derived.json").read_text())
    assert derived["pairs_file"].endswith("stiefel/seed0/pairs.npz")
    assert [Path(p["file"]).parts[-3] for p in derived["pairs_not_captured"]] == ["hetero"]
    assert derived["pairs"]["per_pair"]


# Square matrices left to plain Muon, as in test_train.py's DDP test: a square W's dual
# ascent amplifies the all-reduce's rounding, which would test that chaos, not the ranks.
DDP = {"assignments": ["ddp"], "custom": {"ddp": {"*.attn.c_attn.*": "stiefel", "*.mlp.*": "dgram"}}}
LONG = {**BASE["train"], "max_iters": 24, "lr_decay_iters": 24, "eval_interval": 8, "checkpoint_interval": 4,
        "keep_final_checkpoint": True}


def test_two_ranks_through_snakemake_equal_one_rank_and_resume_after_kill(tmp_path):
    import signal
    import time

    import torch

    wf = {**BASE["workflow"], "resources": {**BASE["workflow"]["resources"],
                                            "train": {"threads": 2, "mem_mb": 500, "runtime": 5}}}
    one = write_config(tmp_path, "one", train={**LONG, "grad_accum": 2}, grid=DDP, workflow=wf)
    two = write_config(tmp_path, "two", train={**LONG, "grad_accum": 2}, grid=DDP, workflow={**wf, "ranks_per_run": 2})
    target = "results/runs/{}/ddp/seed0/summary.json"

    dry = snakemake(tmp_path, two, target.format("two"), "-n")
    assert dry.returncode == 0 and "nodes=1" in dry.stdout, dry.stdout[-2000:]
    res = snakemake(tmp_path, one, target.format("one"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    # the 2-rank job, killed with SIGKILL (Snakemake, launcher, torchrun and both ranks)
    # once it has a checkpoint, then started again
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "--cores", "2",
           target.format("two"), "--configfile", str(two)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "results" / "checkpoints" / "two" / "ddp" / "seed0" / "ckpt.pt"
    t0 = time.time()
    while not ckpt.exists():
        assert proc.poll() is None, "the 2-rank job ended before its first checkpoint"
        assert time.time() - t0 < 300, "no checkpoint after 300 s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    d = tmp_path / "results" / "runs" / "two" / "ddp" / "seed0"
    assert not (d / "summary.json").exists(), "killed too late: the run had finished"
    assert snakemake(tmp_path, two, "--unlock").returncode == 0
    res = snakemake(tmp_path, two, target.format("two"), "--rerun-incomplete")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = (tmp_path / "logs" / "two" / "train" / "ddp" / "seed0.log").read_text()
    assert "launching 2 ranks" in log and "resumed from" in log

    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "completed" and s["world_size"] == 2 and s["steps_done"] == 24
    ref = tmp_path / "results" / "runs" / "one" / "ddp" / "seed0"
    steps = [line.split(",")[0] for line in (d / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [str(i) for i in range(24)]  # resumed logs: every step once
    a, b = torch.load(ref / "final.pt"), torch.load(d / "final.pt")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-4, rtol=1e-3), k


def test_launched_ranks_checkpoint_and_exit_75_on_a_scheduler_signal(tmp_path):
    """SIGUSR1 to the whole job (as `sbatch --signal`): torchrun ignores it, the launcher
    forwards it, both ranks stop at the same step, one checkpoint, exit status 75."""
    import signal
    import time

    # far more steps than the run can reach before the signal: a fast CPU must not finish first
    steps = 1_000_000
    long = {**LONG, "max_iters": steps, "lr_decay_iters": steps, "eval_interval": steps, "checkpoint_interval": steps,
            "grad_accum": 2}  # one micro-batch per rank
    cfg = write_config(tmp_path, "sig", train=long, grid=DDP, workflow={**BASE["workflow"], "ranks_per_run": 2})
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    prep = subprocess.run([sys.executable, "-m", "mwm.data", "prepare", "--config", str(cfg)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    log = tmp_path / "launch.log"  # the launcher's, torchrun's and both ranks' output, shown on a failure
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mwm.train", "--config", str(cfg), "--assignment", "ddp",
                                 "--seed", "0", "--threads", "2", "--out", "results"], cwd=tmp_path, env=env,
                                start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    metrics = tmp_path / "results" / "runs" / "sig" / "ddp" / "seed0" / "metrics.csv"
    t0 = time.time()
    while not (metrics.exists() and len(metrics.read_text().splitlines()) > 5):
        assert proc.poll() is None and time.time() - t0 < 300, log.read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGUSR1)
    try:
        assert proc.wait(timeout=300) == 75, log.read_text()[-3000:]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit 300 s after SIGUSR1:\n{log.read_text()[-3000:]}") from None
    finally:  # a lost signal leaves the ranks training: stop them
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ck = torch_load(tmp_path / "results" / "checkpoints" / "sig" / "ddp" / "seed0" / "ckpt.pt")
    assert 5 <= ck["step"] < steps
    assert len(metrics.read_text().splitlines()) - 1 == ck["step"]


def torch_load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.parametrize("source", ["own", "grid"])
def test_a_config_whose_every_run_diverges_still_completes_its_dag(tmp_path, source):
    """Learning rates of 1e6 (AdamW and Muon): every run, and the solver study's captures (its
    own capture trainings, or the grid's runs with source grid), go unstable at once. The DAG
    still ends green: every run `unstable`, the absorption study without pairs, the solver
    study "not captured" with the reason, and the report showing both (study_solvers
    exits 0)."""
    cfg = read_config(ROOT / "config" / "ci.yaml")  # on its scale: the copy lies outside config/
    cfg["name"] = "alldiv"
    cfg["train"].update(learning_rate=1.0e6, muon_lr=1.0e6, keep_final_checkpoint=False)
    cfg["grid"] = {"assignments": ["none", "adamw", "dgram"] + (["stiefel"] if source == "grid" else []),
                   "seeds": [0]}
    cfg["studies"]["solvers"]["source"] = source
    path = tmp_path / "alldiv.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(tmp_path, path, "all")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    runs = tmp_path / "results" / "runs" / "alldiv"
    for v in cfg["grid"]["assignments"]:
        assert json.loads((runs / v / "seed0" / "summary.json").read_text())["status"] == "unstable", v
    studies = tmp_path / "results" / "studies" / "alldiv"
    absorption = json.loads((studies / "absorption_derived.json").read_text())
    assert absorption["pairs_file"] is None and [Path(p["file"]).parts[-3]
                                                 for p in absorption["pairs_not_captured"]] == (
        ["stiefel", "dgram"] if source == "grid" else ["dgram"])
    solvers = json.loads((studies / "solvers_derived.json").read_text())
    assert solvers["by_manifold"] == {}
    assert [m["assignment"] for m in solvers["not_captured"]] == ["stiefel", "dgram"]
    assert all(m["reason"].startswith("unstable at step ") for m in solvers["not_captured"])
    assert (studies / "_train").exists() == (source == "own")  # with source grid nothing trained twice
    assert (studies / "solvers.csv").read_text().startswith("candidate,")  # headers only
    figures = tmp_path / "paper_figures" / "alldiv"
    table = (figures / "table_solvers.md").read_text()
    assert table.count("not captured: unstable at step") == 2
    assert (figures / "fig_solvers_pareto.png").is_file()
    t4 = (figures / "table4_results.csv").read_text()
    assert t4.count("Unstable") == len(cfg["grid"]["assignments"]), t4


def test_snakemake_refuses_an_alias_bomb_at_once(tmp_path):
    """`snakemake -n` on nine levels of nine YAML aliases took 1.7-2.3 GB and was killed at 60 s
    (the schema error message serialised the expanded config); now one line, at once."""
    import resource


    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("SNAKEMAKE_PROFILE", None)
    try:
        res = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path),
                              "--configfile", str(path), "--cores", "1", "-n", "all"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail("snakemake -n on an alias bomb did not end within 60 s")
    assert res.returncode != 0
    # named relative to the workflow's folder (-d), where it lies
    assert ("config bomb.yaml holds more than 100,000 values once its YAML aliases are expanded"
            in res.stdout + res.stderr)


# -- the workflow in a throwaway copy ----------

@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
@pytest.mark.parametrize("name", ["..", "."])
def test_workflow_refuses_dotdot_name_in_a_throwaway_copy(tmp_path, name):
    """`name: ".."` made the report's directory() output the repository itself (Snakemake
    deletes it before the job). Dry run in a copy: refused before any job is planned."""
    repo = repo_copy(tmp_path / "repo")
    cfg = read_config(repo / "config" / "ci.yaml")
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
    (cfg_dir / "ci.yaml").write_text(yaml.safe_dump(read_config(repo / "config" / "ci.yaml")))
    proc = snakemake_in(repo, "--configfile", "my configs/ci.yaml", "--dry-run", "--printshellcmds",
                        "--forceall", "--nolock", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    cmds = [line.split("Shell command: ", 1)[-1] for line in out.splitlines() if "python -m mwm." in line]
    assert len(cmds) >= 5
    for cmd in cmds:
        argv = shlex.split(cmd)
        given = argv[argv.index("--config") + 1]
        if "mwm.data prepare" in cmd:  # the data rule reads the file from the environment (common.smk)
            assert given == f"${CONFIG_ENV}", cmd
            continue
        assert given == "my configs/ci.yaml", cmd  # relative: a moved checkout keeps its params


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_configs_sharing_a_dataset_and_a_moved_checkout_plan_nothing_new(tmp_path):
    """A dataset's identity is its data section: a second config with the same data section finds the
    data made by the first up to date, and a checkout moved elsewhere finds its run up to date."""
    repo = repo_copy(tmp_path / "repo")
    a = write_config(repo, "share-a")
    b = write_config(repo, "share-b", train={**BASE["train"], "max_iters": 8, "lr_decay_iters": 8})
    run = "results/runs/share-a/stiefel/seed0/summary.json"
    done = snakemake_in(repo, "--configfile", a.name, "--cores", "2", run)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    from mwm.data import dataset_dir

    meta = str(dataset_dir(load_config(b)["data"]) / "meta.json")
    for config, target in ((b, meta), (a, run)):
        plan = snakemake_in(repo, "--configfile", config.name, "--dry-run", "--cores", "2", target)
        out = plan.stdout + plan.stderr
        assert plan.returncode == 0 and "Nothing to be done" in out, out[-3000:]
    moved = tmp_path / "elsewhere" / "repo"
    moved.parent.mkdir()
    shutil.move(str(repo), str(moved))
    plan = snakemake_in(moved, "--configfile", str(moved / a.name), "--dry-run", "--cores", "2", run)
    out = plan.stdout + plan.stderr
    assert plan.returncode == 0 and "Nothing to be done" in out, out[-3000:]


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


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_workflow_accepts_exponent_numbers(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    text = yaml.safe_dump(read_config(repo / "config" / "ci.yaml"))
    assert "max_iters: " in text
    import re

    (repo / "e.yaml").write_text(re.sub(r"max_iters: \d+", "max_iters: 3e1", text))
    proc = snakemake_in(repo, "--configfile", "e.yaml", "--dry-run", "--nolock", "--cores", "1", "all")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_tiny_sweep_config_runs_end_to_end(tmp_path):
    # config/ci-sweep.yaml: the learning-rate sweep's code paths, with one rate where every run goes
    # unstable (its AdamW rates scaled far past stability) and the capped intervention beside All DGram
    import pandas as pd

    from mwm.plan.variants import sweep_variants

    cfg = load_config(ROOT / "config" / "ci-sweep.yaml")
    res = snakemake(tmp_path, ROOT / "config" / "ci-sweep.yaml", "all")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "paper_figures" / "ci-sweep"
    for f in ("fig_sweep_lr.png", "fig_sweep_edge.png", "table_sweep.md", "table_sweep_grid.csv", "sweep_runs.csv",
              "ledger.md"):
        assert (out / f).is_file(), f
    captions = (ROOT / "captions" / "item.rst").read_text()  # every item the HTML report shows has a caption
    for f in out.iterdir():
        if f.suffix in (".png", ".gif", ".csv"):
            assert f'item == "{f.stem}"' in captions, f"{f.name} has no caption in captions/item.rst"
    runs = pd.read_csv(out / "sweep_runs.csv")
    assert sorted(runs.variant) == sorted(sweep_variants(cfg["grid"]))
    top = max(cfg["grid"]["sweep"]["muon_lr"])
    assert set(runs[runs.rate == top].status) == {"unstable"}
    assert set(runs[runs.rate == cfg["train"]["muon_lr"]].status) == {"completed"}
    ledger = pd.read_csv(out / "ledger.csv").set_index("id")
    sweep_rows = ledger.loc[[i for i in ledger.index if i.startswith("sweep.")]]
    assert len(sweep_rows) == 4 and (sweep_rows.seeds == "1").all()
    assert set(sweep_rows.verdict) <= {"too few seeds", "not comparable at this scale"}  # one seed
    assert "first unstable rate" in ledger.loc["sweep.cap_restores", "rebuilt"]
    # the capped runs' attention singular values stay at the cap, even where the run blows up
    for rate in cfg["grid"]["sweep"]["muon_lr"]:
        sp = pd.read_csv(tmp_path / "results" / "runs" / "ci-sweep" / f"dgram-capped-eta{rate:g}" / "seed0"
                         / "spectral.csv")
        assert float(sp[sp.module == "attn"].sigma_max.max()) <= 1.0 + 1e-2, rate


def test_tiny_mechanism_config_runs_end_to_end(tmp_path):
    # config/ci-mechanism.yaml: the mechanism experiment's code paths, with one rate where every run goes
    # unstable (failed), every kind of intervention beside All DGram, and the solver study on pairs that
    # the grid's All DGram run captured at the first rate
    import pandas as pd

    cfg = load_config(ROOT / "config" / "ci-mechanism.yaml")
    res = snakemake(tmp_path, ROOT / "config" / "ci-mechanism.yaml", "all")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "paper_figures" / "ci-mechanism"
    for f in ("fig_mechanism_loss.png", "fig_mechanism_chain.png", "fig_solver_quality.png", "table_mechanism.md",
              "table_mechanism_contrasts.csv", "mechanism_runs.csv", "fig_solvers_pareto.png",
              "table_solvers_alignment.csv", "ledger.md"):
        assert (out / f).is_file(), f
    captions = (ROOT / "captions" / "item.rst").read_text()  # every item the HTML report shows has a caption
    for f in out.iterdir():
        if f.suffix in (".png", ".gif", ".csv"):
            assert f'item == "{f.stem}"' in captions, f"{f.name} has no caption in captions/item.rst"
    runs = pd.read_csv(out / "mechanism_runs.csv")
    top = max(cfg["grid"]["sweep"]["muon_lr"])
    assert set(runs[runs.rate == top].failed) == {True} and set(runs[runs.rate == top].status) == {"unstable"}
    assert set(runs[runs.rate < top].status) == {"completed"}
    contrasts = pd.read_csv(out / "table_mechanism_contrasts.csv")
    assert set(contrasts["failed cells of the baseline"]) == {1} and set(contrasts.restored) == {0}
    ledger = pd.read_csv(out / "ledger.csv").set_index("id")
    mech = ledger.loc[[i for i in ledger.index if i.startswith("mech.")]]
    assert len(mech) == 5 and (mech.seeds == "1").all()
    assert set(mech.verdict) == {"too few seeds"}  # one seed; the rules need six
    assert set(ledger.loc[[i for i in ledger.index if i.startswith("sweep.")], "verdict"]) == {
        "not comparable at this scale"}
    # the normalized and plain solves side by side on the captured pairs
    align = pd.read_csv(out / "table_solvers_alignment.csv")
    assert set(align.normalized) == {True, False} and len(align) == 2 * len(align[~align.normalized])
    # every constrained run measured its solves, and the MLP cap held
    sol = pd.read_csv(tmp_path / "results" / "runs" / "ci-mechanism" / "dgram-norm-eta0.02" / "seed0" / "solver.csv")
    assert len(sol) and sol.alignment_converged.between(0, 1 + 1e-5).all()
    sp = pd.read_csv(tmp_path / "results" / "runs" / "ci-mechanism" / "dgram-mlpcap-eta0.02" / "seed0" / "spectral.csv")
    assert float(sp[sp.module == "mlp"].sigma_max.max()) <= 4.0 * (1 + 1e-4)


def assert_round_report(out, name: str) -> None:
    """A round of the per-baseline mechanism report in ``out``: its files, named after the round, each with a
    caption."""
    for f in (f"fig_{name}_loss.png", f"fig_{name}_chain.png", f"fig_{name}_checks.png", f"table_{name}.md",
              f"table_{name}_contrasts.csv", f"table_{name}_margins.csv", f"{name}_runs.csv", "ledger.md"):
        assert (out / f).is_file(), f
    captions = (ROOT / "captions" / "item.rst").read_text()
    for f in out.iterdir():
        if f.suffix in (".png", ".gif", ".csv"):
            assert f'item == "{f.stem}"' in captions, f"{f.name} has no caption in captions/item.rst"


def test_tiny_mechanism2_config_runs_end_to_end(tmp_path):
    # config/ci-mechanism2.yaml: the second mechanism experiment's code paths, with one rate where every
    # run goes unstable, each kind of intervention beside All DGram, and no Hetero-inv arm
    import pandas as pd

    cfg = load_config(ROOT / "config" / "ci-mechanism2.yaml")
    res = snakemake(tmp_path, ROOT / "config" / "ci-mechanism2.yaml", "all")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "paper_figures" / "ci-mechanism2"
    assert_round_report(out, "mechanism2")
    runs = pd.read_csv(out / "mechanism2_runs.csv")
    top = max(cfg["grid"]["sweep"]["muon_lr"])
    assert set(runs[runs.rate == top].failed) == {True} and set(runs[runs.rate < top].status) == {"completed"}
    # the report's checks are the ones each run wrote into its summary.json
    folder = tmp_path / "results" / "runs" / "ci-mechanism2"
    for row in runs.itertuples():
        summary = json.loads((folder / row.variant / f"seed{row.seed}" / "summary.json").read_text())
        for kind in ("solver", "saturation"):
            want = summary["manipulation"][kind]["passed"]
            got = getattr(row, f"{kind}_check")
            assert (want is None and pd.isna(got)) or bool(got) == want, (row.variant, kind)
    contrasts = pd.read_csv(out / "table_mechanism2_contrasts.csv")
    assert set(contrasts.baseline) == {"dgram"} and set(contrasts["failed cells"]) == {1}
    assert set(contrasts.kind) == {"solver", "solver_attn", "saturation"}
    ledger = pd.read_csv(out / "ledger.csv").set_index("id")
    mech = ledger.loc[[i for i in ledger.index if i.startswith("mech2.") and i.endswith(".dgram")]]
    assert len(mech) == 5 and set(mech.verdict) == {"too few seeds"}  # one seed; the rules need twelve
    hetero = ledger.loc[[i for i in ledger.index if i.startswith("mech2.") and i.endswith(".hetero-inv")]]
    assert len(hetero) == 5 and set(hetero.rebuilt) == {"--"}


def test_tiny_mechanism3_config_runs_end_to_end(tmp_path):
    # config/ci-mechanism3.yaml: round 3's code paths (the normalized-ADMM solver arm, the solver check per
    # module kind, files named after the round), with one rate where every run trains and one where none does
    import pandas as pd

    res = snakemake(tmp_path, ROOT / "config" / "ci-mechanism3.yaml", "all")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "paper_figures" / "ci-mechanism3"
    assert_round_report(out, "mechanism3")
    runs = pd.read_csv(out / "mechanism3_runs.csv")
    # the solver arm's check is the per-kind one, and each run's summary.json records both kinds
    folder = tmp_path / "results" / "runs" / "ci-mechanism3"
    for row in runs[runs.arm == "dgram-admm"].itertuples():
        summary = json.loads((folder / row.variant / f"seed{row.seed}" / "summary.json").read_text())
        kinds = summary["manipulation"]["solver"]["per_kind"]
        assert set(kinds) == {"attn", "mlp"}
        want = None if any(k["passed"] is None for k in kinds.values()) else all(k["passed"] for k in kinds.values())
        assert (want is None and pd.isna(row.check)) or bool(row.check) == want
    sol = pd.read_csv(folder / "dgram-admm-eta0.02" / "seed0" / "solver.csv")
    assert len(sol) and (sol.gap_converged.abs() <= 2e-3).all()
    contrasts = pd.read_csv(out / "table_mechanism3_contrasts.csv")
    assert set(contrasts.kind) == {"solver", "saturation"} and set(contrasts.baseline) == {"dgram"}
    ledger = pd.read_csv(out / "ledger.csv").set_index("id")
    mech = ledger.loc[[i for i in ledger.index if i.startswith("mech3.") and i.endswith(".dgram")]]
    assert len(mech) == 4 and set(mech.verdict) == {"too few seeds"}  # one seed; the rules need twelve


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_a_config_value_on_the_command_line_is_refused_as_such(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--nolock", "--cores", "1",
                        "--config", "train={'learning_rate': 0.1}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "--config train on the command line is refused" in out and "--configfile" in out, out[-2000:]
    assert "is not of type" not in out
    assert 'File "' not in out and "Traceback" not in out, out[-2000:]  # one line, no stack under it


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_a_locked_folder_is_explained_before_snakemake_suggests_unlock(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    locks = repo / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("")
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert "a Snakemake run holds this folder" in out and "Several configs" in out, out[-2000:]
    (locks / "0.input.lock").unlink()
    quiet = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    assert "holds this folder" not in quiet.stdout + quiet.stderr


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_a_damaged_data_bin_is_refused_before_any_job_deletes_a_run(tmp_path):
    """A byte flipped in train.bin (mtime restored or not) stops the workflow at load, naming the file
    and the fix, before Snakemake deletes a finished run's outputs to retrain it on the damaged tokens."""
    from mwm.data import dataset_dir

    repo = repo_copy(tmp_path / "repo")
    cfg = write_config(repo, "damaged")
    run = "results/runs/damaged/stiefel/seed0/summary.json"
    done = snakemake_in(repo, "--configfile", cfg.name, "--cores", "2", run)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    train_bin = repo / dataset_dir(load_config(cfg)["data"]) / "train.bin"
    st = train_bin.stat()
    raw = bytearray(train_bin.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    train_bin.write_bytes(bytes(raw))
    for restore_mtime in (True, False):
        if restore_mtime:
            os.utime(train_bin, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            os.utime(train_bin)  # newer than the run: Snakemake would plan to retrain it
        for extra in (("--dry-run",), ("--keep-going",)):
            proc = snakemake_in(repo, "--configfile", cfg.name, "--cores", "2", *extra, run)
            out = proc.stdout + proc.stderr
            assert proc.returncode != 0, out[-3000:]
            assert f"{train_bin.relative_to(repo)}: " in out and "no run was deleted" in out, out[-3000:]
            assert "rule train" not in out, out[-3000:]
            assert (repo / run).is_file()


@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_a_config_edited_while_its_dag_runs_starts_no_job_on_the_edit(tmp_path):
    """Snakemake records a job's settings when it plans it; a job started after the config file was
    edited refuses it, so no run trains on settings its record does not show (a later DAG would
    retrain it)."""
    repo = repo_copy(tmp_path / "repo")
    train = {**BASE["train"], "max_iters": 600, "lr_decay_iters": 600, "eval_interval": 300,
             "checkpoint_interval": 300, "log_interval": 100}
    cfg = write_config(repo, "edited", train=train, grid={"assignments": ["stiefel"], "seeds": [0, 1]})
    from mwm.data import dataset_dir

    meta = str(dataset_dir(load_config(cfg)["data"]) / "meta.json")
    prep = snakemake_in(repo, "--configfile", cfg.name, "--cores", "1", meta)
    assert prep.returncode == 0, (prep.stdout + prep.stderr)[-3000:]
    runs = [repo / f"results/runs/edited/stiefel/seed{s}/summary.json" for s in (0, 1)]
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    env["PYTHONPATH"] = str(repo / "src")
    dag = subprocess.Popen([sys.executable, "-m", "snakemake", "--configfile", cfg.name, "--cores", "1",
                            "--keep-going", *(str(r.relative_to(repo)) for r in runs)],
                           cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = [repo / f"logs/edited/train/stiefel/seed{s}.log" for s in (0, 1)]
    deadline = time.monotonic() + 300
    while not any(f.is_file() and "parameters;" in f.read_text() for f in logs):  # its config is read
        assert dag.poll() is None and time.monotonic() < deadline, dag.communicate()[0][-3000:]
        time.sleep(0.05)
    cfg.write_text(cfg.read_text().replace("max_iters: 600", "max_iters: 500"))
    out = dag.communicate(timeout=300)[0]
    assert dag.returncode != 0, out[-3000:]
    assert sum(r.is_file() for r in runs) == 1, out[-3000:]
    refused = "".join(f.read_text() for f, r in zip(logs, runs) if not r.is_file())
    assert f"config file {cfg.name} was edited after the workflow planned this job" in refused, refused[-2000:]
    plan = snakemake_in(repo, "--configfile", cfg.name, "--cores", "1", "--dry-run",
                        *(str(r.relative_to(repo)) for r in runs))
    planned = plan.stdout + plan.stderr
    assert plan.returncode == 0 and re.search(r"^train\s+2$", planned, re.M), planned[-3000:]
