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
