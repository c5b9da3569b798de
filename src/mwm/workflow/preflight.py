"""Everything the workflow checks before any job, in one call: ``preflight`` (rules/common.smk).

Snakemake reads the Snakefile in the main run and again in every job it starts (a SLURM job, a
subprocess). Each read validates the config; the main run also judges the prepared data, refuses a
DVC stage whose outputs lead out of the repository, and says when another run holds the folder. A
refusal is a :class:`~mwm.errors.ConfigError` whose message is the one line the rules print: nothing
has run yet, so nothing was deleted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Mapping, MutableMapping

from mwm.config import PLANNED_ENV, ConfigError, compose, exponent_floats, load_config, planned_stamp, validate
from mwm.data import DataError, TokenDataset, dataset_dir
from mwm.paths import CONFIG_ENV, first_on_pythonpath, inside, leads_out
from mwm.plan.checks import check_config, check_splits
from mwm.plan.ranks import ranks_per_run
from mwm.plan.runs import CONFIG_KINDS, RESULTS_ROOT, Plan, check_grid, config_dir
from mwm.workflow.dvc import PERSISTENT
from mwm.workflow.owner import check_owner

__all__ = ["preflight", "data_meta", "LOCKS"]

#: Where Snakemake keeps its lock while a DAG runs in the folder.
LOCKS = os.path.join(".snakemake", "locks")


def data_meta(path: Path) -> dict | None:
    """A data folder's meta.json, or None when it is missing or unreadable (a job cut while writing
    it: Snakemake reruns that job, which checks its own output)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def load_checked(config_file: str, given: Mapping, merged: Mapping) -> dict:
    """The validated config of ``config_file``, every check that needs no job done: ``given`` is what
    ``--config`` set on Snakemake's command line (refused), ``merged`` the config as Snakemake merged it
    (on its scale file, must equal the file's: the entry points read the file itself)."""
    if given:  # before validation: a --config value would otherwise read as a type error in the file
        raise ConfigError(
            f"--config {' '.join(sorted(given))} on the command line is refused: the entry points "
            f"(training, studies, report) read the config file itself ({config_file}), so a value given "
            "only to Snakemake would make the two disagree. Put the setting in a config file (a copy with "
            "its own name) and pass it with --configfile")
    cfg = load_config(config_file)
    check_grid(cfg["grid"])
    ranks_per_run(cfg)
    check_config(cfg, source=config_file)  # model shape, grid.custom patterns: no data needed
    meta_path = dataset_dir(cfg["data"]) / "meta.json"
    meta = data_meta(meta_path)
    if meta is not None:  # made already (maybe by another config): its splits against block_size
        check_splits(cfg, meta, str(meta_path), source=config_file)
    check_owner(RESULTS_ROOT, cfg, config_file)  # a copied config keeping the name is refused
    # Snakemake reads YAML 1.1 ("1e6" is a string there) and knows nothing of extends: the file's keys alone
    raw = compose(exponent_floats(dict(merged)), config_file)
    raw.setdefault("name", os.path.splitext(os.path.basename(config_file))[0])
    if validate(raw, source=f"{config_file} (as Snakemake merged it)") != cfg:
        raise ConfigError(
            "--config overrides are not supported: the entry points read the config file itself. "
            f"Put the settings in a config file and pass --configfile (read: {config_file})")
    for kind in CONFIG_KINDS:  # the schema already refuses such names; a path never leaves its parent
        config_dir(kind, cfg["name"])
    inside("logs", cfg["name"], what="config name (in logs)")
    return cfg


def check_data(cfg: dict, data: str) -> None:
    """A prepared data folder is judged here, before any job: found inside each training job, a
    damaged bin would fail it after Snakemake had deleted that run's outputs. The verdict is cached
    (mwm.data's .verified.json), so only a changed bin is hashed again."""
    if data_meta(dataset_dir(cfg["data"]) / "meta.json") is None:
        return  # not made yet: the data job's
    try:
        ds = TokenDataset(data)
        if not ds.verified():
            print(f"mwm: verifying {data} (sha256 of its bins, once after each change)", file=sys.stderr)
            ds.verify_cached()
    except DataError as exc:
        raise ConfigError(f"{exc}. Found before any job ran, so no run was deleted: delete {data}/ and run "
                          "again (the data job prepares it anew and the runs trained on it are retrained)") from None


def check_dvc_stage(folders: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """Under `dvc repro` (DVC names the stage in DVC_STAGE): a stage whose outputs' folder leads out of
    the repository (a symlinked data/ or results/) is refused before it runs; DVC, unable to git-ignore
    them there, would fail only after it. The data stage's outputs persist, so DVC deleted none of them."""
    stage = environ.get("DVC_STAGE", "").rpartition(":")[2]
    if not stage:
        return
    for kind, folder in folders.items():
        real = leads_out(f"{folder}/-", environ.get("DVC_ROOT", ".")) if stage == kind else None
        if real:
            kept = "nothing was deleted" if kind in PERSISTENT else "DVC removed the stage's outputs before this"
            raise ConfigError(
                f"DVC stage {stage}: {folder} is {real}, outside the repository, where DVC cannot track files (it "
                f"would fail after the stage ran); refused before any job ({kept}). Keep the folder inside the "
                "repository and put DVC's cache on the scratch disk (docs/dvc.md, 'Data on scratch'), or run "
                "this config with snakemake alone")


def preflight(config_file: str, basedir: str, given: Mapping, merged: Mapping, in_job: bool,
              environ: MutableMapping[str, str] = os.environ) -> Plan:
    """The config's :class:`~mwm.plan.runs.Plan`, after every check before a job (ConfigError: one
    line to print). Sets what every job reads from the environment: the config file (the data job's,
    whichever config asked for the data), this checkout's package first on PYTHONPATH, and in the
    main run the planned stamp by which every job refuses a config file edited from then on."""
    environ[CONFIG_ENV] = config_file
    first_on_pythonpath(os.path.join(basedir, "src"))
    cfg = load_checked(config_file, given, merged)
    plan = Plan(cfg)
    if in_job:  # the main run's checks are done
        return plan
    environ[PLANNED_ENV] = planned_stamp(config_file, cfg)  # SLURM jobs get it through sbatch --export=ALL
    check_data(cfg, plan.folders["data"])
    check_dvc_stage(plan.folders, environ)
    if os.path.isdir(LOCKS) and os.listdir(LOCKS):
        # Snakemake refuses a second DAG here, suggesting --unlock, which would break the first
        print(f"mwm: a Snakemake run holds this folder ({LOCKS}). Several configs run in one DAG after another, "
              "or in separate checkouts that share data/ (docs/running.md, 'Several configs'). Use --unlock only "
              "when no Snakemake runs here (a killed run leaves its lock behind).", file=sys.stderr)
    return plan
