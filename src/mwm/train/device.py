"""Where and in what precision a run computes: its device, the bfloat16 check, TF32."""

from __future__ import annotations

import os

import torch

from mwm.config import ConfigError, resolve_device

__all__ = ["resolve_train_device", "check_bfloat16", "set_matmul_precision"]


def resolve_train_device(tc: dict, world: int) -> torch.device:
    """The device of a run: ``train.device`` (:func:`mwm.config.resolve_device`), the local
    rank's GPU under DDP; bfloat16 only on GPU."""
    dev = resolve_device(tc["device"], "train.device")
    if tc["dtype"] == "bfloat16" and dev.type != "cuda":
        raise ConfigError("train.dtype=bfloat16 is allowed on GPU only; use float32 on CPU")
    if world > 1 and dev.type == "cuda":
        dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    if dev.type == "cuda":  # cuda:N: the current device, so autocast, syncs and kernels use it
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(dev)
        check_bfloat16(tc, dev)
    return dev


def check_bfloat16(tc: dict, dev: torch.device, native=None) -> None:
    """Refuse, before training, a GPU without native bfloat16 (a V100) for a run that computes in it
    (``train.dtype`` or ``train.msign_precision``): autocast would raise at the first step, on every
    retry. ``native`` (testing) stands in for the device's answer."""
    keys = [k for k in ("dtype", "msign_precision") if tc.get(k) == "bfloat16"]
    if not keys:
        return
    if native is None:
        try:
            with torch.cuda.device(dev):
                native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # an older torch without the argument
            native = torch.cuda.get_device_capability(dev) >= (8, 0)
    if not native:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" and torch.cuda.is_available() else str(dev)
        raise ConfigError(f"{', '.join(f'train.{k}=bfloat16' for k in keys)}: {dev} ({name}) has no native bfloat16; "
                          "run on a GPU that has it (compute capability 8.0 or newer) or set these to float32")


def set_matmul_precision(tc: dict, device: torch.device) -> None:
    """``train.tf32``: TF32 for float32 matmuls and convolutions on a GPU, as the released
    train.py sets it (``torch.backends.cuda.matmul.allow_tf32``, ``cudnn.allow_tf32``).
    PyTorch's switch is global: the optimizer's float32 matmuls (the inner solver's
    products; msign in bfloat16 is not affected) run in TF32 too, as they did there.
    Off: full float32. No effect on CPU. Through one API only,
    ``torch.set_float32_matmul_precision`` and cudnn's ``allow_tf32``: setting the newer
    ``fp32_precision`` as well makes every later legacy getter (which inductor's autotuning
    reads) raise "mix of the legacy and new APIs"."""
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if tc["tf32"] else "highest")
    torch.backends.cudnn.allow_tf32 = bool(tc["tf32"])
