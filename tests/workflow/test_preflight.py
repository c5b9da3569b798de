"""mwm.workflow.preflight: every check before a job, one call, one line per refusal."""

import os
from pathlib import Path

import pytest
import yaml

from mwm.config import PLANNED_ENV, ConfigError, load_config
from mwm.paths import CONFIG_ENV
from mwm.plan.runs import Plan
from mwm.workflow.preflight import check_dvc_stage, preflight


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _raw(path):
    return yaml.safe_load(Path(path).read_text())


def test_a_config_passes_and_the_jobs_environment_is_set(tiny_config, here):
    path = tiny_config(folder=here / "config")
    env = {}
    plan = preflight(str(path), str(here), {}, _raw(path), False, env)
    assert isinstance(plan, Plan) and plan.cfg == load_config(path)
    assert env[CONFIG_ENV] == str(path) and env[PLANNED_ENV]
    inside_job = {}
    preflight(str(path), str(here), {}, _raw(path), True, inside_job)
    assert PLANNED_ENV not in inside_job  # a job keeps the main run's stamp


def test_command_line_values_and_a_merge_that_differs_are_refused_by_name(tiny_config, here):
    path = tiny_config(folder=here / "config")
    with pytest.raises(ConfigError, match=r"--config train.lr on the command line is refused"):
        preflight(str(path), str(here), {"train.lr": 1}, _raw(path), False, {})
    merged = _raw(path)
    merged["train"]["max_iters"] = 99
    with pytest.raises(ConfigError, match="--config overrides are not supported"):
        preflight(str(path), str(here), {}, merged, False, {})


def test_a_damaged_data_folder_is_refused_before_any_job(tiny_config, here, monkeypatch):
    from mwm.data import dataset_dir

    path = tiny_config(folder=here / "config")
    cfg = load_config(path)
    folder = Path(dataset_dir(cfg["data"]))
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text('{"splits": {}}')
    with pytest.raises(ConfigError, match="Found before any job ran, so no run was deleted"):
        preflight(str(path), str(here), {}, _raw(path), False, {})
    preflight(str(path), str(here), {}, _raw(path), True, {})  # a job checks its own data


def test_a_dvc_stage_whose_outputs_lead_out_is_refused(here, tmp_path_factory):
    outside = tmp_path_factory.mktemp("scratch")
    os.symlink(outside, here / "results")
    folders = {"data": "data/x", "runs": "results/runs/tiny"}
    check_dvc_stage(folders, {})  # not under dvc repro
    check_dvc_stage(folders, {"DVC_STAGE": "dvc.yaml:data"})  # another stage's folder
    with pytest.raises(ConfigError, match="DVC stage runs: results/runs/tiny is .*outside the repository"):
        check_dvc_stage(folders, {"DVC_STAGE": "dvc.yaml:runs"})


def _extending(tiny_config, here):
    """A tiny config whose model and batch size come from config/scales/tiny.yaml (the file extends it)."""
    path = tiny_config(folder=here / "config")
    raw = _raw(path)
    scale = {"model": raw.pop("model"), "train": {"batch_size": raw["train"].pop("batch_size")}}
    (here / "config" / "scales").mkdir()
    (here / "config" / "scales" / "tiny.yaml").write_text(yaml.safe_dump(scale))
    path.write_text(yaml.safe_dump({"extends": "scales/tiny.yaml", **raw}))
    return path


def test_a_config_extending_a_scale_passes_as_snakemake_merges_it(tiny_config, here):
    """Snakemake reads the file alone (extends, no model): the workflow composes it with the scale as
    load_config does, and a merge that differs from the scale's settings is still refused."""
    path = _extending(tiny_config, here)
    merged = _raw(path)
    assert "extends" in merged and "model" not in merged
    plan = preflight(str(path), str(here), {}, merged, False, {})
    assert plan.cfg == load_config(path) and plan.cfg["model"]["n_embd"] == 16
    assert (plan.cfg["train"]["batch_size"], plan.cfg["train"]["max_iters"]) == (4, 12)  # the scale's, the file's
    merged["model"] = {"n_layer": 1}
    with pytest.raises(ConfigError, match="--config overrides are not supported"):
        preflight(str(path), str(here), {}, merged, False, {})


def test_a_scale_edited_after_planning_fails_the_job_that_reads_it(tiny_config, here, monkeypatch):
    path = _extending(tiny_config, here)
    env = {}
    preflight(str(path), str(here), {}, _raw(path), False, env)
    monkeypatch.setenv(PLANNED_ENV, env[PLANNED_ENV])
    load_config(path)  # as planned
    scale = here / "config" / "scales" / "tiny.yaml"
    raw = _raw(scale)
    raw["train"]["batch_size"] += 1
    scale.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="or its scale file .*tiny.yaml was edited after the workflow planned"):
        load_config(path)
