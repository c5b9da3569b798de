"""mwm.workflow.site: SLURM site settings per kind of job, from the environment, refused when a value could
be read as shell."""

import pytest

from mwm.config import ConfigError
from mwm.workflow.site import site_resources


def test_gpu_and_cpu_jobs_take_their_own_settings_and_share_the_plain_ones():
    env = {"MWM_SLURM_GPU_PARTITION": "gpu", "MWM_SLURM_CPU_PARTITION": "cpu", "MWM_SLURM_ACCOUNT": "proj",
           "MWM_SLURM_GPU_QOS": "high", "MWM_SLURM_CPU_CONSTRAINT": "skylake|icelake"}
    assert site_resources(2, env) == {"slurm_partition": "gpu", "slurm_account": "proj", "qos": "high", "gpu": 2}
    assert site_resources(0, env) == {"slurm_partition": "cpu", "slurm_account": "proj",
                                      "constraint": "skylake|icelake"}
    assert site_resources(0, {"MWM_SLURM_PARTITION": "all"}) == {"slurm_partition": "all"}
    assert site_resources(0, {}) == {} and site_resources(1, {}) == {"gpu": 1}
    assert site_resources(0, {"MWM_SLURM_CPU_ACCOUNT": ""}) == {}  # an empty value is unset


def test_the_gpu_request_takes_the_form_the_cluster_accepts():
    assert site_resources(4, {"MWM_SLURM_GPU_MODEL": "a100"}) == {"gpu": 4, "gpu_model": "a100"}
    assert site_resources(4, {"MWM_SLURM_GPU_REQUEST": "gres"}) == {"gres": "gpu:4"}
    assert site_resources(1, {"MWM_SLURM_GPU_REQUEST": "gres", "MWM_SLURM_GPU_MODEL": "h100"}) == {"gres": "gpu:h100:1"}
    assert site_resources(0, {"MWM_SLURM_GPU_REQUEST": "gres", "MWM_SLURM_GPU_MODEL": "h100"}) == {}  # CPU job
    with pytest.raises(ConfigError, match="MWM_SLURM_GPU_REQUEST='gpu': 'gpus'"):
        site_resources(1, {"MWM_SLURM_GPU_REQUEST": "gpu"})
    with pytest.raises(ConfigError, match="MWM_SLURM_GPU_MODEL='a100:2'"):
        site_resources(1, {"MWM_SLURM_GPU_MODEL": "a100:2"})


@pytest.mark.parametrize("value", ["gpu debug", "gpu;rm -rf x", "$(id)", "`id`", "a'b", "x\ny"])
@pytest.mark.parametrize("var", ["MWM_SLURM_PARTITION", "MWM_SLURM_GPU_ACCOUNT", "MWM_SLURM_CPU_QOS",
                                 "MWM_SLURM_CONSTRAINT"])
def test_a_value_that_could_be_read_as_shell_is_refused_naming_the_variable(var, value):
    with pytest.raises(ConfigError, match=f"environment variable {var}="):
        site_resources(1, {var: value}) if "CPU" not in var else site_resources(0, {var: value})


class _Given:
    def __init__(self, raw):
        self.raw, self.value = raw, raw


def test_stage_resources_add_the_warning_signal_and_one_node_for_several_ranks():
    from mwm.workflow.site import stage_resources

    cfg = {"workflow": {"warning_signal_s": 300, "resources": {
        "train": {"mem_mb": 1000, "runtime": 10, "gpu": 2, "threads": 1},
        "report": {"mem_mb": 500, "runtime": 5, "gpu": 0, "threads": 1}}}}
    env = {"MWM_SLURM_GPU_PARTITION": "gpu", "MWM_SLURM_CPU_PARTITION": "cpu"}
    train = stage_resources(cfg, "train", 2, environ=env)
    assert train == {"mem_mb": 1000, "runtime": 10, "slurm_partition": "gpu", "gpu": 2,
                     "slurm_extra": "--signal=USR1@300", "nodes": 1}
    assert stage_resources(cfg, "report", 1, environ=env) == {"mem_mb": 500, "runtime": 5, "slurm_partition": "cpu"}
    site = stage_resources(cfg, "train", 1, None, {"slurm_extra": _Given("--exclusive")}, env)
    assert site["slurm_extra"] == "--exclusive --signal=USR1@300" and "nodes" not in site
    mine = stage_resources(cfg, "train", 1, {"slurm_extra": _Given("'--exclusive --signal=USR1@600'")}, None, env)
    assert mine["slurm_extra"] == "--signal=USR1@300"  # accepted: Snakemake puts the given value in its place
    with pytest.raises(ConfigError, match="train:slurm_extra=--exclusive replaces the training jobs' --signal"):
        stage_resources(cfg, "train", 1, {"slurm_extra": _Given("--exclusive")}, None, env)
