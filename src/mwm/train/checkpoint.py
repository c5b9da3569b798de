"""A run's exact checkpoint and resume: what a checkpoint holds, how it is written (the copy of the
logs first, the checkpoint last: it is the commit point), and how a run resumes from it or sets it
aside. :class:`Resumable` is the part of :class:`mwm.train.loop.Run` that does it."""

from __future__ import annotations

import torch

from mwm.config import ConfigError, config_hash
from mwm.io import atomic_torch_save
from mwm.plan.runs import identity_diff
from mwm.train.divergence import DivergenceMonitor

__all__ = ["Resumable"]


class Resumable:
    """Checkpoint and resume of a run (mixed into :class:`mwm.train.loop.Run`, whose state it reads:
    model, optimizers, divergence, step, timings, RNG and sampler state, folder and identity)."""

    def state_dict(self) -> dict:
        return {
            "step": self.step, "model": self.model.state_dict(), "optimizers": self.opts.state_dict(),
            "last_val": self.last_val, **self.divergence.state_dict(),
            "step_times": self.step_times, "opt_shares": self.opt_shares,
            "rng_torch": torch.get_rng_state(), "sampler": self.sampler_state(),
            # the run's own GPU only: a retry may land on a node that shows fewer
            "rng_cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "config_hash": config_hash(self._identity()),
            "identity": self._identity(),
        }

    def load_state_dict(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        self.opts.load_state_dict(ck["optimizers"])
        self.divergence.load_state_dict(ck)
        self.step, self.last_val, self.step_times, self.opt_shares = (ck["step"], ck["last_val"], ck["step_times"],
                                                                      ck["opt_shares"])
        torch.set_rng_state(ck["rng_torch"])
        self.train_sampler.gen.set_state(ck["sampler"])
        self._prefetched = None
        rng_cuda = ck["rng_cuda"]
        if isinstance(rng_cuda, (list, tuple)):  # older checkpoints: one state per visible GPU
            i = self.device.index or 0
            rng_cuda = rng_cuda[i] if i < len(rng_cuda) else None
        if rng_cuda is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng_cuda, self.device)

    def save_checkpoint(self):
        if self.master:
            if self.live is not None:
                self.live.flush()
            # the copy of the logs first, the checkpoint last: the checkpoint is the commit point, and
            # the copy it records is whole whenever it exists (a kill in between leaves the older one)
            self.folder.save_mirror()
            state = self.state_dict()
            state["logs"] = self.folder.extent(self.step, self.folder.mirror)
            atomic_torch_save(self.ckpt_path, state)

    def resume(self) -> int:
        """The step to start from, the same on every rank: rank 0 alone decides (:meth:`try_resume`: it
        may restore the logs or set the checkpoint aside) and broadcasts it; the others then load the
        checkpoint it resumed from. Ranks deciding apart could start at different steps and hang."""
        if self.world == 1:
            return self.try_resume()
        start = self.try_resume() if self.master else 0
        flag = torch.tensor([start], dtype=torch.int64, device=self.device)
        torch.distributed.broadcast(flag, src=0)
        start = int(flag.item())
        if not self.master and start:
            ck = self._load_checkpoint()
            if ck["step"] != start:
                raise ConfigError(f"checkpoint {self.ckpt_path} is at step {ck['step']}, rank 0 resumed at {start}: "
                                  "another process wrote it meanwhile; rerun the job")
            self._load_state(ck)
        return start

    def try_resume(self) -> int:
        """Load the checkpoint if there is one the logs reach; the step to start from."""
        if not self.ckpt_path.exists():
            return 0
        ck = self._load_checkpoint()
        if ck["config_hash"] != config_hash(self._identity()):  # before anything is copied or moved
            recorded = ck.get("identity")
            diff = identity_diff(recorded, self._identity()) if isinstance(recorded, dict) else []
            raise ConfigError(
                f"checkpoint {self.ckpt_path} belongs to a different configuration"
                + (f" ({'; '.join(diff[:4])})" if diff else "")
                + "; nothing was changed: delete it or restore the config it was written with")
        step, extent = ck["step"], ck.get("logs")
        if not self.folder.logs_reach(step, extent) and self.folder.mirror_holds(step, extent):
            self.folder.restore_mirror()
            self.log("run logs missing, short or altered (a retried job); restored them from the checkpoint's copy")
        if not self.folder.logs_reach(step, extent):
            where = self.folder.set_aside()
            self.log(f"checkpoint at step {step} but neither the run's logs nor their copy beside it are the ones "
                     f"it recorded; starting afresh (checkpoint and logs moved to {where})")
            return 0
        self._load_state(ck)
        return self.step

    def _load_checkpoint(self) -> dict:
        """The checkpoint, read as weights only and checked for every key."""
        try:  # tensors and plain containers only: a planted pickle cannot run code
            # to the CPU: the RNG states must stay there, AdamW's step counters too (a GPU one
            # costs a sync per step); load_state_dict puts weights and buffers on the device
            ck = torch.load(self.ckpt_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ConfigError(f"checkpoint {self.ckpt_path} cannot be loaded as weights only ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); it is damaged or not written by "
                              f"mwm.train: delete it to start the run afresh") from exc
        self._check_checkpoint(ck)
        return ck

    def _load_state(self, ck: dict) -> None:
        try:
            self.load_state_dict(ck)
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:  # a model or optimizer that does not fit
            raise ConfigError(f"checkpoint {self.ckpt_path} does not fit this run ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); it is damaged or was written by "
                              "other code: delete it to start the run afresh") from exc

    #: What every checkpoint holds (:meth:`state_dict`'s keys).
    CHECKPOINT_KEYS = ("step", "model", "optimizers", "last_val", *DivergenceMonitor.KEYS, "step_times",
                       "opt_shares", "rng_torch", "sampler", "rng_cuda", "config_hash")
    #: What checkpoints hold since they record their identity and their logs' extent; older ones may lack them.
    OPTIONAL_KEYS = ("identity", "logs")

    def _check_checkpoint(self, ck) -> None:
        """A ConfigError naming the file and what it lacks, for a checkpoint short of any key."""
        missing = list(self.CHECKPOINT_KEYS) if not isinstance(ck, dict) else [
            k for k in self.CHECKPOINT_KEYS if k not in ck]
        if missing:
            raise ConfigError(f"checkpoint {self.ckpt_path} lacks {', '.join(missing)}: it is damaged or was written "
                              "by other code; delete it to start the run afresh")
