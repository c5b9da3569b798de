"""SLURM site settings, per kind of job, from the environment (torch-free: the workflow reads it).

A cluster's partition, account, QoS and node constraint are the user's, not the repository's, and
they differ between the GPU jobs (training, a study given a GPU) and the CPU ones (tokenization,
the report, the CPU studies): the CPU jobs must not queue on the GPU partition. So they come from
the environment, one variable per kind and setting, named after the SLURM plugin's resources:

=============================  ============================  ==========================================
variable                       plugin resource               sbatch
=============================  ============================  ==========================================
``MWM_SLURM_GPU_PARTITION``    ``slurm_partition``           ``-p`` (GPU jobs; ``_CPU_``: CPU jobs)
``MWM_SLURM_GPU_ACCOUNT``      ``slurm_account``             ``-A``
``MWM_SLURM_GPU_QOS``          ``qos``                       ``--qos``
``MWM_SLURM_GPU_CONSTRAINT``   ``constraint``                ``-C``
``MWM_SLURM_GPU_MODEL``        ``gpu_model``                 ``--gpus=<model>:N``
``MWM_SLURM_GPU_REQUEST``      ``gpu`` or ``gres``           ``--gpus=N`` (``gpus``, the default) or
                                                             ``--gres=gpu[:<model>]:N`` (``gres``)
=============================  ============================  ==========================================

``MWM_SLURM_PARTITION`` (and ``_ACCOUNT``, ``_QOS``, ``_CONSTRAINT``) without a kind apply to both
kinds where the kind's own is unset. A value holding whitespace or a shell character is refused
when the workflow loads, naming the variable: values reach sbatch as values.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from mwm.errors import ConfigError

__all__ = ["SETTINGS", "site_resources", "stage_resources", "train_slurm_extra"]

#: The settings a kind of job takes, by the suffix of their variable, and the plugin's resource.
SETTINGS = {"PARTITION": "slurm_partition", "ACCOUNT": "slurm_account", "QOS": "qos", "CONSTRAINT": "constraint"}
_SHELL = re.compile(r"[\s;$`'\"\\<>|&]")
_CONSTRAINT_SHELL = re.compile(r"[\s;$`'\"\\<>]")  # a constraint may say a|b and a&b
_GPU_MODEL = re.compile(r"^[A-Za-z0-9_.]+$")  # what the plugin accepts


def _value(var: str, value: str, pattern: re.Pattern) -> str:
    if pattern.search(value):
        raise ConfigError(f"environment variable {var}={value!r}: whitespace and shell characters are refused "
                          "(the value goes to sbatch as it is)")
    return value


def site_resources(gpus: int, environ: Mapping[str, str] = os.environ) -> dict:
    """The plugin resources of a job that asks for ``gpus`` GPUs (0: a CPU job), from ``environ``."""
    kind = "GPU" if gpus else "CPU"
    out: dict = {}
    for key, resource in SETTINGS.items():
        for var in (f"MWM_SLURM_{kind}_{key}", f"MWM_SLURM_{key}"):
            if environ.get(var):
                out[resource] = _value(var, environ[var], _CONSTRAINT_SHELL if key == "CONSTRAINT" else _SHELL)
                break
    if not gpus:
        return out
    model = environ.get("MWM_SLURM_GPU_MODEL") or None
    if model is not None and not _GPU_MODEL.match(model):
        raise ConfigError(f"environment variable MWM_SLURM_GPU_MODEL={model!r}: a GPU model is letters, digits, "
                          "'_' and '.' (e.g. a100, h100)")
    form = environ.get("MWM_SLURM_GPU_REQUEST") or "gpus"
    if form == "gres":
        out["gres"] = f"gpu:{model}:{gpus}" if model else f"gpu:{gpus}"
    elif form == "gpus":
        out["gpu"] = gpus
        if model:
            out["gpu_model"] = model
    else:
        raise ConfigError(f"environment variable MWM_SLURM_GPU_REQUEST={form!r}: 'gpus' (sbatch --gpus, the "
                          "default) or 'gres' (--gres=gpu:N, for clusters that refuse --gpus)")
    return out


def _given(table, key: str) -> str | None:
    """A resource as Snakemake's command line or a profile gave it (--set-resources,
    --default-resources): an entry with ``raw`` or ``value``, or None."""
    r = (table or {}).get(key)
    if r is None:
        return None
    raw = r.raw if r.raw is not None else r.value
    return None if raw is None else str(raw).strip().strip("'\"").strip()


def train_slurm_extra(signal_opt: str, overwrite: Mapping | None, default: Mapping | None) -> str:
    """The training jobs' sbatch extras: a site's --default-resources slurm_extra (``default``) with the
    warning signal added; a --set-resources train:slurm_extra (``overwrite``, train's) would replace the
    signal, so one without it is refused (a run past its time limit would lose every step since its
    last checkpoint)."""
    mine = _given(overwrite, "slurm_extra")
    if mine is not None and "--signal" not in mine:
        raise ConfigError(
            f"--set-resources train:slurm_extra={mine} replaces the training jobs' {signal_opt} (SLURM's "
            f"warning before the time limit, workflow.warning_signal_s): give both, "
            f"--set-resources \"train:slurm_extra='{mine} {signal_opt}'\"")
    site = _given(default, "slurm_extra")
    return signal_opt if not site else site if "--signal" in site else f"{site} {signal_opt}"


def stage_resources(cfg: dict, stage: str, ranks: int, overwrite: Mapping | None = None,
                    default: Mapping | None = None, environ: Mapping[str, str] = os.environ) -> dict:
    """A stage's Snakemake resources: memory and runtime from the config's workflow section, the SLURM
    site settings of its kind of job (GPU or CPU) from ``environ``; for training, the warning signal
    (``overwrite``/``default``: Snakemake's --set-resources for train and --default-resources) and, with
    more than one of ``ranks`` per run, one node."""
    r = dict(cfg["workflow"]["resources"][stage])
    out = {"mem_mb": r["mem_mb"], "runtime": r["runtime"], **site_resources(r["gpu"], environ)}
    if stage == "train" and cfg["workflow"]["warning_signal_s"]:
        # SLURM's warning before the time limit: the run checkpoints and exits 75 (ignored elsewhere)
        out["slurm_extra"] = train_slurm_extra(f"--signal=USR1@{cfg['workflow']['warning_signal_s']}", overwrite,
                                               default)
    if stage == "train" and ranks > 1:
        # mwm.train starts the ranks itself (torchrun --standalone): one task on one node
        # with every GPU and thread of the run (SLURM tasks would rerun the whole job step)
        out["nodes"] = 1
    return out
