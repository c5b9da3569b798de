"""mwm.config: device settings (cuda:N accepted, as bench_gpu and the docs offer it) and
the GPU-only checks that need no GPU to be tested."""

import pytest
import torch

from mwm.config import ConfigError, load_config, resolve_device

import fakedata


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_schema_accepts_every_device_the_docs_offer(tmp_path, device):
    cfg = load_config(fakedata.write_config(tmp_path / "c.yaml", train__device=device))
    assert cfg["train"]["device"] == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda0", "cpu:0"])
def test_schema_refuses_other_devices_naming_the_key(tmp_path, device):
    with pytest.raises(ConfigError, match="train.device"):
        load_config(fakedata.write_config(tmp_path / "c.yaml", train__device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_a_config_error_naming_the_key(device):
    with pytest.raises(ConfigError, match=rf"train.device is '{device}' but no CUDA device"):
        resolve_device(device, "train.device")


def test_auto_and_cpu_resolve_on_any_machine():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
