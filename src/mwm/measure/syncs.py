"""Counting host-device synchronisations, the stalls of a GPU training step.

Each time the host reads a value computed on the GPU (``.item()``, ``bool(t)``, a
``.tolist()``, a copy to the CPU) it waits for every queued kernel to finish, and
the GPU then idles until the host launches more. :class:`SyncCounter` counts them
over a block of code:

- on CUDA, exactly: PyTorch's sync debug mode reports every synchronising call
  (``torch.cuda.set_sync_debug_mode``), and each report is counted;
- on CPU, where nothing synchronises, as a proxy: the reads of floating-point and
  boolean tensor values (``item``, ``bool``, ``float``, ``int``, ``tolist``) made
  by this package's own code, the calls that would be syncs were its tensors on a
  GPU. Integer tensors are left out (the data sampler's indices live on the CPU by
  design), and so is PyTorch's own code (AdamW reads its step counters, which stay
  on the CPU on a GPU too).

    with SyncCounter(device) as c:
        run.train_step()
    print(c.count, c.kind)
"""

from __future__ import annotations

import sys
import warnings

import torch

__all__ = ["SyncCounter"]

_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def _ours(frame) -> bool:
    """Whether ``frame`` runs this package's code (``mwm`` or a module under it)."""
    name = frame.f_globals.get("__name__", "")
    return name == "mwm" or name.startswith("mwm.")


class SyncCounter:
    """Context manager; ``count`` is the number of syncs (CUDA) or host reads (CPU)
    inside it, ``kind`` says which of the two was counted."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.kind = "cuda syncs" if self.device.type == "cuda" else "host reads (CPU proxy)"
        self.count = 0
        self._saved: dict = {}
        self._warnings = None

    def __enter__(self) -> "SyncCounter":
        self.count = 0
        if self.device.type == "cuda":
            self._warnings = warnings.catch_warnings(record=True)
            self._log = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            for name in _READS:
                original = getattr(torch.Tensor, name)
                self._saved[name] = original
                setattr(torch.Tensor, name, self._counting(original))
        return self

    def _counting(self, original):
        counter = self

        def read(t, *args, **kwargs):
            if (t.dtype.is_floating_point or t.dtype == torch.bool) and _ours(sys._getframe(1)):
                counter.count += 1
            return original(t, *args, **kwargs)

        return read

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in self._log)
            self._warnings.__exit__(*exc)
        else:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()
