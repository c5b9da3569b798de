"""mwm.train.device: where and in what precision a run computes (built on the CPU, then moved; native
bfloat16; TF32 through one API)."""


import pytest
import torch

import fakedata
from mwm.config import ConfigError


def test_model_and_optimizers_are_built_on_the_cpu_then_moved(tmp_path, monkeypatch):
    """The Stiefel init (float64 SVD per matrix) runs on the CPU before the model moves,
    and the optimizers hold the moved parameters (the same objects)."""
    seen = []
    svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda A, *a, **k: seen.append(A.device.type) or svd(A, *a, **k))
    monkeypatch.setattr("mwm.train.loop.resolve_train_device", lambda tc, world: torch.device("meta"))
    run = fakedata.tiny_run(tmp_path, assignment="stiefel")
    assert seen and set(seen) == {"cpu"}
    params = {id(p) for p in run.model.parameters()}
    held = [p for opt in (run.opts.muon, run.opts.adamw) for g in opt.param_groups for p in g["params"]]
    assert held and all(id(p) in params and p.device.type == "meta" for p in held)


def test_a_gpu_without_native_bfloat16_is_refused_naming_the_keys():
    from mwm.train.device import check_bfloat16

    dev = torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"train.dtype=bfloat16, train.msign_precision=bfloat16: cuda:0 .* no native"):
        check_bfloat16({"dtype": "bfloat16", "msign_precision": "bfloat16"}, dev, native=False)
    with pytest.raises(ConfigError, match=r"^train.msign_precision=bfloat16:"):
        check_bfloat16({"dtype": "float32", "msign_precision": "bfloat16"}, dev, native=False)
    check_bfloat16({"dtype": "float32", "msign_precision": "float32"}, dev, native=False)
    check_bfloat16({"dtype": "bfloat16", "msign_precision": "bfloat16"}, dev, native=True)


def test_tf32_goes_through_one_api_and_every_getter_still_reads_it():
    import warnings

    from mwm.train.device import set_matmul_precision

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            set_matmul_precision({"tf32": True}, torch.device("cuda"))
            # the legacy getters inductor reads, and the new ones: none raises, all agree
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
                assert torch.backends.cuda.matmul.fp32_precision == "tf32"
            set_matmul_precision({"tf32": False}, torch.device("cuda"))
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            set_matmul_precision({"tf32": True}, torch.device("cpu"))  # no effect on CPU
            assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
