"""mwm.workflow.owner: a config name's results belong to one config file.

A config/mine.yaml copied from ci.yaml with one learning rate changed and `name: ci` kept is
refused, rather than planning its jobs into results/runs/ci and paper_figures/ci."""

from __future__ import annotations

import json
import re

import pytest

import fakedata
from mwm.config import load_config
from mwm.workflow.owner import OWNER_FILE, TAKE_OVER_ENV, OwnerError, check_owner, claim, owner_path
from fakedata import HAS_SNAKEMAKE, repo_copy, snakemake_in


def _cfg(tiny_config, file, **over):
    return load_config(tiny_config(file, **over))


def test_same_file_edited_is_a_config_change_another_file_is_refused(tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)
    a = _cfg(tiny_config, "a.yaml")
    assert check_owner("results", a, "a.yaml") is None  # unclaimed
    claim("results", a, "a.yaml")
    rec = json.loads(owner_path("results", "tiny").read_text())
    assert owner_path("results", "tiny").name == OWNER_FILE and rec["config_file"] == "a.yaml"
    # the same file with other settings: accepted, and the record follows it
    edited = _cfg(tiny_config, "a.yaml", train__learning_rate=0.002)
    claim("results", edited, str(tmp_path / "a.yaml"))  # the same file, named by another path
    assert json.loads(owner_path("results", "tiny").read_text())["settings_hash"] != rec["settings_hash"]
    # a copy with the same settings: accepted, the name stays with the first file
    same = _cfg(tiny_config, "copy.yaml", train__learning_rate=0.002)
    claim("results", same, "copy.yaml")
    assert json.loads(owner_path("results", "tiny").read_text())["config_file"] == "a.yaml"
    # a copy with other settings: refused, naming both files and the way out
    other = _cfg(tiny_config, "mine.yaml", train__learning_rate=0.02)
    with pytest.raises(OwnerError) as err:
        claim("results", other, "mine.yaml")
    msg = str(err.value)
    assert "mine.yaml" in msg and "belong to a.yaml" in msg and f"{TAKE_OVER_ENV}=tiny" in msg
    assert json.loads(owner_path("results", "tiny").read_text())["config_file"] == "a.yaml"
    # handed over explicitly, for this name only
    monkeypatch.setenv(TAKE_OVER_ENV, "other-name")
    with pytest.raises(OwnerError):
        check_owner("results", other, "mine.yaml")
    monkeypatch.setenv(TAKE_OVER_ENV, "tiny")
    claim("results", other, "mine.yaml")
    assert json.loads(owner_path("results", "tiny").read_text())["config_file"] == "mine.yaml"


def test_hand_run_of_a_copied_config_is_refused_before_writing(tiny_config, tmp_path, monkeypatch, capsys):
    from mwm.train.cli import main

    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)
    over = dict(train__max_iters=2, train__lr_decay_iters=2, train__eval_interval=2)
    a = tiny_config("a.yaml", **over)
    out = tmp_path / "out"
    assert main(["--config", str(a), "--assignment", "none", "--seed", "0", "--out", str(out)],
                data=fakedata.TOKENS) == 0
    mine = tiny_config("mine.yaml", train__learning_rate=0.02, **over)
    assert main(["--config", str(mine), "--assignment", "none", "--seed", "1", "--out", str(out)],
                data=fakedata.TOKENS) == 2
    assert "belong to" in capsys.readouterr().err and not (out / "runs" / "tiny" / "none" / "seed1").exists()


def test_report_of_a_copied_config_is_refused_before_it_reads_anything(tiny_config, tmp_path, monkeypatch, capsys):
    from mwm.report.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)
    claim("results", _cfg(tiny_config, "a.yaml"), "a.yaml")
    _cfg(tiny_config, "mine.yaml", train__learning_rate=0.02)
    assert main(["--config", "mine.yaml", "--out", str(tmp_path / "pf")]) == 2
    err = capsys.readouterr().err
    assert "belong to a.yaml" in err and "missing" not in err and not (tmp_path / "pf").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")
def test_workflow_refuses_a_copied_config_keeping_the_name(tmp_path, monkeypatch):
    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)
    repo = repo_copy(tmp_path / "repo")
    # a real (not dry) run claims the name when it starts: here its cheapest job, the data
    cfg = load_config(repo / "config" / "ci.yaml")
    from mwm.data import dataset_dir

    dry = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    assert dry.returncode == 0 and not (repo / "results" / "runs" / "ci" / OWNER_FILE).exists()
    run = snakemake_in(repo, "--configfile", "config/ci.yaml", "--cores", "1",
                       f"{dataset_dir(cfg['data'])}/meta.json", timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    rec = json.loads((repo / "results" / "runs" / "ci" / OWNER_FILE).read_text())
    assert rec["config_file"] == "config/ci.yaml"
    text = (repo / "config" / "ci.yaml").read_text()
    assert "max_iters: 30" in text
    (repo / "config" / "mine.yaml").write_text(text.replace("max_iters: 30", "max_iters: 31"))
    proc = snakemake_in(repo, "--configfile", "config/mine.yaml", "--dry-run", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config/mine.yaml has name 'ci'" in out and "belong to config/ci.yaml" in out, \
        out[-3000:]
    assert not re.search(r"rule (train|report)", out)
    # the same file edited is a config change, as before
    (repo / "config" / "ci.yaml").write_text(text.replace("max_iters: 30", "max_iters: 32"))
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
