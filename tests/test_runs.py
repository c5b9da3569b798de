"""mwm.runs: a run's identity, and how a summary is compared with the config's own run."""

from __future__ import annotations

import copy

import yaml

import fakedata
from mwm.config import config_hash, load_config
from mwm.runs import config_run_identity, expected_identity, identity_diff, identity_problem


def _cfg(tmp_path, **over):
    return load_config(fakedata.write_config(tmp_path / "tiny.yaml", **over))


def test_expected_identity_merges_train_overrides_and_reads_the_retraction_from_the_variant(tmp_path):
    cfg = _cfg(tmp_path, grid__assignments=["dgram", "none"], grid__train_overrides={"dgram": {"learning_rate": 0.5}})
    ident = expected_identity(cfg, "dgram-colnorm", 1)
    assert ident["train"]["learning_rate"] == 0.5 and ident["retraction"] == "colnorm" and ident["seed"] == 1
    assert expected_identity(cfg, "dgram", 1)["retraction"] == cfg["train"]["dgram_retraction"]
    assert expected_identity(cfg, "none", 0)["train"]["learning_rate"] == cfg["train"]["learning_rate"]
    assert config_run_identity(cfg, "dgram", 1, "colnorm") == ident


def test_diff_names_every_differing_key_with_both_values(tmp_path):
    cfg = _cfg(tmp_path)
    own = expected_identity(cfg, "none", 0)
    other = copy.deepcopy(own)
    other["train"]["learning_rate"] = 0.02
    other["model"]["n_layer"] = 3
    del other["data"]
    diff = identity_diff(other, own)
    assert f"train.learning_rate: run 0.02, config {cfg['train']['learning_rate']}" in diff
    assert f"model.n_layer: run 3, config {cfg['model']['n_layer']}" in diff
    assert any(d.startswith("data: run (not recorded)") for d in diff) and len(diff) == 3
    assert identity_diff(copy.deepcopy(own), own) == []


def test_a_summary_is_checked_by_its_identity_else_by_its_hash(tmp_path):
    cfg = _cfg(tmp_path)
    own = expected_identity(cfg, "none", 0)
    # what summary.json holds after a JSON round trip is the config's own run
    stored = yaml.safe_load(yaml.safe_dump(own))
    assert identity_problem({"identity": stored, "config_hash": config_hash(own)}, own) is None
    hand = copy.deepcopy(own)
    hand["train"]["learning_rate"] = 0.02
    msg = identity_problem({"identity": hand, "config_hash": config_hash(hand)}, own)
    assert "not the config's" in msg and "train.learning_rate: run 0.02" in msg
    # an older summary: only its hash, so the keys cannot be named
    assert identity_problem({"config_hash": config_hash(own)}, own) is None
    msg = identity_problem({"config_hash": config_hash(hand)}, own)
    assert config_hash(hand) in msg and "cannot be named" in msg
    assert "cannot be checked" in identity_problem({"status": "completed"}, own)


def test_workflow_names_a_finished_run_that_is_not_the_configs_at_load(tmp_path):
    """After an older mwm.train wrote a hand run with an override over a published run, Snakemake
    planned only the report; now it names the run and the keys when it loads, before any job."""
    import pytest

    from test_reliability import HAS_SNAKEMAKE, repo_copy, snakemake_in

    if not HAS_SNAKEMAKE:
        pytest.skip("snakemake not installed")
    from mwm.io import atomic_write_json

    repo = repo_copy(tmp_path / "repo")
    cfg = load_config(repo / "config" / "ci.yaml")
    hand = copy.deepcopy(expected_identity(cfg, "none", 0))
    hand["train"]["learning_rate"] = 0.02
    atomic_write_json(repo / "results" / "runs" / "ci" / "none" / "seed0" / "summary.json",
                      {"status": "completed", "identity": hand, "config_hash": config_hash(hand)})
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert ("results/runs/ci/none/seed0/summary.json: trained with settings that are not the config's: "
            f"train.learning_rate: run 0.02, config {cfg['train']['learning_rate']}") in out, out[-3000:]
    assert "--forcerun" in out


def test_capture_window_names_the_grid_runs_the_solver_study_reads(tmp_path):
    from mwm.runs import capture_window

    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml", grid__assignments=["none", "stiefel", "dgram"],
                                            grid__seeds=[0, 1]))
    sec = cfg["studies"]["solvers"]
    assert sec["source"] == "own" and capture_window(cfg, "stiefel", 0) is None  # the study captures itself
    sec.update(source="grid", capture_start=3, capture_length=2, seed=1)
    assert capture_window(cfg, "stiefel", 1) == {"start": 3, "length": 2}
    assert capture_window(cfg, "dgram", "1") == {"start": 3, "length": 2}  # a wildcard's string seed
    assert capture_window(cfg, "stiefel", 0) is None and capture_window(cfg, "none", 1) is None
    assert capture_window(cfg, "dgram-colnorm", 1) is None  # the ablation's variant is another run
