"""mwm.plan.checks: what a config alone tells, checked before any job.

n_embd % n_head, a grid.custom pattern matching nothing and a split shorter than block_size
are refused by the config check, not inside a train job after the data and the studies ran."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mwm.plan.checks import check_config, check_splits, min_split_tokens
from mwm.config import ConfigError, load_config
from fakedata import HAS_SNAKEMAKE, repo_copy, snakemake_in

ROOT = Path(__file__).resolve().parents[2]

needs_snakemake = pytest.mark.skipif(not HAS_SNAKEMAKE, reason="snakemake not installed")


def _cfg(tiny_config, **over):
    return load_config(tiny_config(**over))


def test_head_divisibility_and_custom_patterns_are_checked_without_data(tiny_config, tmp_path):
    check_config(_cfg(tiny_config, grid__custom={"l0": {"transformer.h.0.attn.*": "stiefel"}},
                      grid__assignments=["none", "l0"]))
    with pytest.raises(ConfigError, match=r"tiny.yaml: model: n_embd=15 is not divisible by n_head=2"):
        check_config(_cfg(tiny_config, model__n_embd=15), source=str(tmp_path / "tiny.yaml"))
    with pytest.raises(ConfigError, match=r"grid.custom.mine: .*\['\*.attn.q_proj.\*'\] match no hidden matrix"):
        check_config(_cfg(tiny_config, grid__custom={"mine": {"*.attn.q_proj.*": "stiefel"}},
                          grid__assignments=["mine"]))
    # a custom assignment the grid does not train is not checked (nothing would run it)
    check_config(_cfg(tiny_config, grid__custom={"unused": {"nothing.*": "stiefel"}}))


def test_a_named_size_is_checked_by_its_shape(tiny_config):
    check_config(_cfg(tiny_config, model__size="gpt2", grid__custom={"x": {"transformer.h.11.mlp.*": "dgram"}},
                      grid__assignments=["x"]))


def test_split_shorter_than_a_window_is_refused_naming_file_and_key(tiny_config):
    cfg = _cfg(tiny_config, model__block_size=64)
    need = min_split_tokens(64)
    ok = {"splits": {"train": {"tokens": 10_000}, "val": {"tokens": need}}}
    check_splits(cfg, ok, "d/meta.json")
    short = {"splits": {"train": {"tokens": 10_000}, "val": {"tokens": need - 1}}}
    with pytest.raises(ConfigError, match=rf"cfg.yaml: model.block_size = 64 needs .* val split of d/meta.json "
                                          rf"has {need - 1}"):
        check_splits(cfg, short, "d/meta.json", source="cfg.yaml")


def test_data_job_fails_when_its_val_split_is_too_short_for_the_model(tiny_config, tmp_path, monkeypatch, capsys):
    from mwm.data.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        (tmp_path / "corpus" / f"d{i}.txt").write_text(" ".join(rng.choice(["the", "king", "is", "dead"], 300)))
    over = dict(data__corpus="text", data__paths=["corpus/*.txt"], data__vocab_size=16, data__num_proc=1,
                data__split="tail", data__val_fraction=0.1)
    cfg = tiny_config("ok.yaml", **over)
    assert main(["prepare", "--config", str(cfg)]) == 0
    capsys.readouterr()
    big = tiny_config("big.yaml", model__block_size=256, **over)
    assert main(["prepare", "--config", str(big)]) == 1
    err = capsys.readouterr().err
    assert "big.yaml: model.block_size = 256" in err and "val split" in err and "meta.json" in err


# -- through Snakemake: refused when the workflow loads, before any job ---------------------------
def _dry(repo, cfg):
    proc = snakemake_in(repo, "--configfile", cfg, "--dry-run", "--nolock", "--cores", "1", "all")
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
@needs_snakemake
def test_workflow_refuses_heads_that_do_not_divide_before_any_job(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    raw = yaml.safe_load((repo / "config" / "ci.yaml").read_text())
    raw["name"] = "heads"
    raw.setdefault("model", {})["n_head"] = 3  # over its scale's model (n_embd 32)
    (repo / "config" / "heads.yaml").write_text(yaml.safe_dump(raw))
    rc, out = _dry(repo, "config/heads.yaml")
    assert rc != 0 and "n_embd=32 is not divisible by n_head=3" in out and "config/heads.yaml" in out, out[-2000:]
    assert "rule prepare_data" not in out


@pytest.mark.slow
@needs_snakemake
def test_workflow_refuses_existing_data_too_short_for_block_size(tmp_path):
    """Data made by another config with the same data section: its job does not rerun, so the
    split sizes are checked when the workflow loads."""
    from mwm.data import dataset_dir

    repo = repo_copy(tmp_path / "repo")
    cfg = load_config(repo / "config" / "ci.yaml")
    folder = repo / dataset_dir(cfg["data"])
    folder.mkdir(parents=True)
    tokens = min_split_tokens(cfg["model"]["block_size"]) - 1
    (folder / "meta.json").write_text(json.dumps({"splits": {"train": {"tokens": 10 ** 6}, "val": {"tokens": tokens}}}))
    rc, out = _dry(repo, "config/ci.yaml")
    assert rc != 0 and f"val split of {dataset_dir(cfg['data'])}/meta.json has {tokens}" in out, out[-2000:]
    assert "rule train" not in out


def test_a_solver_study_reading_the_grid_needs_its_runs_and_window_in_the_grid(tiny_config):
    """studies.solvers.source: grid: the captured assignments, seed and window are checked
    against the grid before any job (each names the key and the value)."""
    grid = {"assignments": ["none", "stiefel", "dgram"], "seeds": [0, 1]}

    def cfg(**solvers):
        c = _cfg(tiny_config, grid__assignments=grid["assignments"], grid__seeds=grid["seeds"])
        c["studies"]["solvers"].update({"source": "grid", "capture_start": 2, "capture_length": 3, **solvers})
        return c

    check_config(cfg())  # stiefel, dgram at seed 0, steps 2-4 of 12
    with pytest.raises(ConfigError, match=r"studies.solvers.assignments: \['hetero'\] not in grid.assignments"):
        check_config(cfg(assignments=["stiefel", "hetero"]))
    with pytest.raises(ConfigError, match=r"studies.solvers.seed: 5 not in grid.seeds \[0, 1\]"):
        check_config(cfg(seed=5))
    with pytest.raises(ConfigError, match=r"capture_start \+ capture_length = 13 is past train.max_iters 12"):
        check_config(cfg(capture_start=10))
    own = cfg(seed=5)
    own["studies"]["solvers"]["source"] = "own"  # the study trains its own captures: nothing to check
    check_config(own)


def test_a_sweep_solver_study_captures_the_variant_at_its_rate(tmp_path):
    from mwm.plan.runs import capture_variants, capture_window

    cfg = load_config(ROOT / "config" / "mechanism.yaml")
    check_config(cfg, "config/mechanism.yaml")
    assert capture_variants(cfg) == ["dgram-eta5.12"]
    assert capture_window(cfg, "dgram-eta5.12", 10) == {"start": 150, "length": 5}
    assert capture_window(cfg, "dgram-eta2.56", 10) is None and capture_window(cfg, "dgram-eta5.12", 11) is None
    for rate, match in ((1.0, "a rate of grid.sweep.muon_lr"), (None, "need studies.solvers.rate")):
        bad = copy.deepcopy(cfg)
        bad["studies"]["solvers"]["rate"] = rate
        with pytest.raises(ConfigError, match=match):
            check_config(bad, "config/mechanism.yaml")


def test_a_logger_whose_package_is_missing_is_refused_before_any_job(monkeypatch):
    import importlib.util

    from mwm.config import load_config
    from mwm.plan.checks import check_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "ci.yaml")
    cfg["workflow"]["loggers"] = ["dvclive"]
    check_config(cfg, "config/ci.yaml")  # installed here: accepted
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dvclive" else real(name, *a))
    with pytest.raises(ConfigError, match=r"config/ci\.yaml: workflow\.loggers: dvclive needs the dvclive package, "
                                          r"which is not installed: pip install dvclive"):
        check_config(cfg, "config/ci.yaml")


def test_the_retraction_ablation_with_a_colnorm_run_is_refused():
    """dgram and dgram-colnorm would train the same thing with one identity: a run compared with itself."""
    ci = Path(__file__).resolve().parents[2] / "config" / "ci.yaml"
    cfg = load_config(ci, ["train.dgram_retraction=colnorm"])
    assert cfg["grid"]["retraction_ablation"]
    with pytest.raises(ConfigError, match="grid.retraction_ablation: true with train.dgram_retraction: colnorm"):
        check_config(cfg, str(ci))
    check_config(load_config(ci, ["train.dgram_retraction=colnorm", "grid.retraction_ablation=false"]), str(ci))
    check_config(load_config(ci), str(ci))
