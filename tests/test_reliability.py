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
import socket
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
TESTS = Path(__file__).parent
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
    # a symlink planted inside the parent that points out of it is caught as well
    (tmp_path / "link").symlink_to("/")
    with pytest.raises(UnsafePathError, match="outside"):
        inside(tmp_path, "link", "etc")
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
