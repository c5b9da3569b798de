"""Train one GPT-2 run under one manifold assignment.

    python -m mwm.train --config config/config.yaml --assignment hetero --seed 0 [key=value ...]

One run per call; its folder is ``results/runs/<config>/<variant>/seed<seed>/``
(see :mod:`mwm.plan.runs`). Files, appended as the run goes and safe to read meanwhile:

``metrics.csv``   step, train_loss, lr, muon_lr, step_time, tokens_per_s, optimizer_time, optimizer_share
``eval.csv``      step, train_loss, val_loss (fixed batches, the same for every run of a config)
``spectral.csv``  per evaluation and hidden matrix (and W_Q, W_K, W_V): see :mod:`mwm.train.diagnostics`
``spectra/step_NNNNNN.npz``  full singular spectra and column norms per matrix
``sequence/step_NNNNNN.npz``  with ``train.capture_sequence`` or a grid run the solver study captures
                              (``studies.solvers.source: grid``): (W, momentum direction) of
                  every Muon matrix at each step of the window, as ``pairs.npz``
``attention.csv`` per evaluation, layer and head, on a fixed probe batch
``solver.csv``    per evaluation and Stiefel or DGram matrix, how well the inner solve did at the
                  step after it, beside a converged solve of the same pair: see :mod:`mwm.optim.quality`
``summary.json``  status (completed / unstable / failed), final and best val loss,
                  onset step, mean step time, optimizer share, parameter count,
                  config hash, code version
``final.pt``      final model weights (when ``train.keep_final_checkpoint``)

Resume: a checkpoint (model, both optimizers, step, RNG and data-sampler state,
divergence state) is written atomically every ``checkpoint_interval`` steps
under ``results/checkpoints/...``; starting the same run again resumes from it
and truncates the logs to the checkpoint, so the result equals an uninterrupted
run. The copy of the logs beside the checkpoint is written first and the checkpoint, which records
what its logs hold, last; a checkpoint whose logs are not what it recorded (even from that copy) is
moved aside with them (``<checkpoint folder>.unusable``) and the run starts afresh. SIGTERM / SIGUSR1 (a scheduler's
warning) write a checkpoint and exit with status 75 (``EXIT_PREEMPTED``) for the
workflow to retry.

Multi-process: launched by ``torchrun``, gradients are averaged with DDP (nccl on
GPU, gloo on CPU) and the Muon matrix banks are sharded across ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from mwm.optim.assignments import OptimizerSettings, build_optimizers, nonfinite
from mwm.plan.checks import check_config, check_run
from mwm.config import ConfigError, config_hash, load_config, resolve_device, seed_bound
from mwm.errors import write_failure
from mwm.train.diagnostics import ATTENTION_COLUMNS, SPECTRAL_COLUMNS, attention_stats, spectral_stats
from mwm.numerics import code_version
from mwm.io import atomic_savez, atomic_torch_save, atomic_write_json
from mwm.plan.ranks import accum_per_rank, ranks_per_run
from mwm.train.launch import launch, worker_exit, worker_started
from mwm.train.model import GPT, SIZES, GPTConfig
from mwm.config.names import RETRACTIONS, parse_variant, uses_dgram, variant_name
from mwm.optim.quality import QUALITY_COLUMNS, quality_rows
from mwm.train.manipulation import run_checks
from mwm.workflow.owner import claim
from mwm.paths import check_out_root
from mwm.train.folder import RunFolder
from mwm.plan.runs import (FINAL_STATUSES, HAND_FOLDER, RESULTS_ROOT, capture_window, config_dir, check_grid,
                           config_run_identity, hand_root, identity_diff, identity_problem, run_config, run_identity)
from mwm.train.schedule import learning_rates
from mwm.plan.variants import assignment_spec

__all__ = ["main", "train", "EXIT_PREEMPTED", "build_model_config", "resolve_data"]

EXIT_PREEMPTED = 75
METRIC_COLUMNS = ["step", "train_loss", "lr", "muon_lr", "step_time", "tokens_per_s", "optimizer_time",
                  "optimizer_share"]
EVAL_COLUMNS = ["step", "train_loss", "val_loss"]


# --------------------------------------------------------------------------------------
# set-up helpers
# --------------------------------------------------------------------------------------
def resolve_data(cfg: dict):
    """The TokenDataset of the config's data section."""
    from mwm.data import TokenDataset, dataset_dir

    folder = dataset_dir(cfg["data"])
    if not (folder / "meta.json").exists():
        raise ConfigError(f"data folder {folder} has no meta.json; run `python -m mwm.data prepare --config ...` first")
    ds = TokenDataset(folder)
    if ds.verify_cached():  # checksums and id range, once per data folder (cached)
        print(f"verified {folder}: checksums and token ids", flush=True)
    return ds


def build_model_config(cfg: dict, data_vocab: int) -> GPTConfig:
    m = dict(cfg["model"])
    shape = SIZES[m["size"]] if m["size"] else {k: m[k] for k in ("n_layer", "n_head", "n_embd")}
    vocab = m["vocab_size"]
    if vocab is None:
        vocab = data_vocab
    elif vocab < data_vocab:
        raise ConfigError(f"model.vocab_size={vocab} is smaller than the dataset's vocab size {data_vocab}")
    # train.attn_qk_scale changes the attention forward (the saturation-only intervention); absent: None
    return GPTConfig(vocab_size=vocab, block_size=m["block_size"], bias=m["bias"], dropout=m["dropout"],
                     qk_scale=cfg["train"].get("attn_qk_scale"), **shape)


class Sampler:
    """Random windows of a token array, from one seeded generator (its state checkpoints)."""

    def __init__(self, data: np.ndarray, block: int, seed: int):
        if len(data) <= block + 1:
            raise ConfigError(f"split has {len(data)} tokens, fewer than block_size + 2 = {block + 2}")
        self.data, self.block = data, block
        self.gen = torch.Generator().manual_seed(seed)

    def indices(self, n: int) -> torch.Tensor:
        return torch.randint(len(self.data) - self.block - 1, (n,), generator=self.gen)

    def batch(self, ix: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows at ``ix`` as (input, target) on ``device``; to a GPU from pinned
        memory without blocking (as the released code), so the host runs ahead."""
        rows = np.stack([np.asarray(self.data[i:i + self.block + 1], dtype=np.int64) for i in ix.tolist()])
        t = torch.from_numpy(rows)
        x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
        if torch.device(device).type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)


class Preempted(Exception):
    pass


# --------------------------------------------------------------------------------------
# the parts of a run
# --------------------------------------------------------------------------------------
class DivergenceMonitor:
    """The divergence rule of ``train.divergence`` on the evaluated val losses: a
    non-finite loss, or ``patience`` evaluations in a row above the best so far by more
    than ``threshold``, marks the run unstable with its onset (the streak's first step)."""

    #: its checkpoint state (stored under these keys, beside the run's)
    KEYS = ("best_val", "status", "onset", "streak_start", "streak")

    def __init__(self, rule: dict, log=print):
        self.rule, self.log = rule, log
        self.best_val = math.inf
        self.status = "completed"
        self.onset: int | None = None
        self.streak_start: int | None = None
        self.streak = 0

    def check(self, step: int, val: float) -> bool:
        """Record the val loss of ``step``; True when the run must stop."""
        if not math.isfinite(val):
            self.mark_unstable(step)
            return True
        if val < self.best_val:
            self.best_val = val
        if val > self.best_val + self.rule["threshold"]:
            if self.streak == 0:
                self.streak_start = step
            self.streak += 1
            if self.streak >= self.rule["patience"]:
                self.mark_unstable(self.streak_start)
                return self.rule["stop"]
        else:
            self.streak, self.streak_start = 0, None
        return False

    def mark_unstable(self, onset: int) -> None:
        if self.status != "unstable":
            self.status, self.onset = "unstable", onset
            self.log(f"run marked unstable, onset step {onset}")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def load_state_dict(self, state: dict) -> None:
        for k in self.KEYS:
            setattr(self, k, state[k])


class FixedBatches:
    """The evaluation batches (``eval_iters`` x ``batch_size`` windows of each split) and
    the attention probe batch, drawn from ``eval_seed``: the same for every run of a config."""

    def __init__(self, data, block: int, tc: dict, device: torch.device):
        self.device = device
        gen = torch.Generator().manual_seed(tc["eval_seed"])
        splits = {s: data.split(s) for s in ("train", "val")}
        self.ix: dict[str, torch.Tensor] = {}
        for split, arr in splits.items():
            if len(arr) <= block + 1:
                raise ConfigError(f"{split} split has {len(arr)} tokens, fewer than block_size + 2 = {block + 2}")
            self.ix[split] = torch.randint(len(arr) - block - 1, (tc["eval_iters"], tc["batch_size"]), generator=gen)
        self.samplers = {s: Sampler(arr, block, 0) for s, arr in splits.items()}
        probe_ix = torch.randint(len(splits["val"]) - block - 1, (tc["probe_batch"],), generator=gen)
        self.probe = self.samplers["val"].batch(probe_ix, device)[0]

    @torch.no_grad()
    def losses(self, model: torch.nn.Module, autocast) -> dict[str, float]:
        """Mean loss of ``model`` over each split's batches."""
        model.eval()
        out = {}
        for split, ix in self.ix.items():
            tot = torch.zeros((), dtype=torch.float64, device=self.device)
            for b in ix:
                x, y = self.samplers[split].batch(b, self.device)
                with autocast:
                    _, loss = model(x, y)
                tot += loss.double()  # summed on the device, read once per split
            out[split] = tot.item() / len(ix)
        model.train()
        return out


class PairCapture:
    """The (W, update direction) pairs a run saves: ``pairs.npz`` at
    ``train.capture_pairs_step`` (the absorption study) and ``sequence/step_NNNNNN.npz``
    at each step of ``train.capture_sequence`` or of the solver study's window of a grid run
    (``studies.solvers.source: grid``); ``sequence/`` exists in every finished run folder
    (a declared output of the workflow), empty where nothing is captured."""

    def __init__(self, tc: dict, run_dir: Path, log=print, window: dict | None = None):
        """``window``: the solver study's ``{start, length}`` for a grid run that captures
        (:func:`mwm.plan.runs.capture_window`), used when ``train.capture_sequence`` is unset."""
        self.at, self.max_iters = tc["capture_pairs_step"], tc["max_iters"]
        self.sequence = tc["capture_sequence"] or window
        self.dir, self.log = run_dir, log
        self.path = run_dir / "pairs.npz"

    def paths(self, step: int) -> list[Path]:
        """Where the pairs of ``step`` go (none: the step captures nothing)."""
        out = []
        if self.at is not None and step == self.at:
            out.append(self.path)
        seq = self.sequence
        if seq is not None and seq["start"] <= step < seq["start"] + seq["length"]:
            out.append(self.dir / "sequence" / f"step_{step:06d}.npz")
        return out

    def save(self, inputs: dict, path: Path, step: int) -> None:
        """``inputs`` as :meth:`ManifoldMuon.step_with_inputs` returns them, at ``path``."""
        names = sorted(inputs)
        arrays = {"names": np.array(names), "manifolds": np.array([inputs[n][0] for n in names]),
                  "captured": np.array(True), "step": np.array(step), "reason": np.array("")}
        for i, n in enumerate(names):
            arrays[f"W_{i}"] = inputs[n][1].float().cpu().numpy()
            arrays[f"G_{i}"] = inputs[n][2].float().cpu().numpy()
        atomic_savez(path, arrays)
        if path == self.path:
            self.log(f"saved {len(names)} (W, G) pairs at step {step}")

    def missing(self, assignment: str, has_muon: bool, steps_done: int, div: DivergenceMonitor) -> str | None:
        """Why the run holds no pairs at ``capture_pairs_step`` (None: it does, or none asked)."""
        cs = self.at
        if cs is None or self.path.exists():
            return None
        if not has_muon:
            return f"assignment {assignment} has no Muon matrices"
        if cs >= self.max_iters:
            return f"capture_pairs_step {cs} is not below max_iters {self.max_iters}"
        if div.status == "unstable" and steps_done <= cs:
            return (f"the run became unstable at step {div.onset} and stopped at step {steps_done}, "
                    f"before step {cs}")
        return f"no pairs were saved at step {cs} (the run stopped at step {steps_done})"

    def save_none(self, reason: str) -> None:
        """The declared pairs output of a run that has none: an explicit, empty file."""
        atomic_savez(self.path, {
            "names": np.array([], dtype=str), "manifolds": np.array([], dtype=str), "captured": np.array(False),
            "step": np.array(self.at), "reason": np.array(reason)})
        self.log(f"no (W, G) pairs: {reason}")


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


def _printer(master: bool, prefix: str):
    """A log function printing ``prefix msg`` on the master rank, silent on the others."""
    def say(msg: str) -> None:
        if master:
            print(f"{prefix} {msg}", flush=True)

    return say


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


LOG_COLUMNS = {"metrics": METRIC_COLUMNS, "eval": EVAL_COLUMNS, "spectral": SPECTRAL_COLUMNS,
               "attention": ATTENTION_COLUMNS, "solver": QUALITY_COLUMNS}


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------
class Run:
    def __init__(self, cfg: dict, assignment: str, seed: int, retraction: str, out_root: Path,
                 rank: int = 0, world: int = 1):
        self.cfg, self.tc = cfg, cfg["train"]
        tc = self.tc
        self.assignment, self.seed, self.retraction = assignment, seed, retraction
        self.rank, self.world, self.master = rank, world, rank == 0
        self.variant = variant_name(assignment, retraction, cfg["grid"].get("custom"))
        self.folder = RunFolder(out_root, cfg["name"], self.variant, seed)
        self.dir, self.ckpt_path = self.folder.dir, self.folder.ckpt_path
        self.accum = accum_per_rank(tc, world)  # this rank's micro-batches per step
        self.device = resolve_train_device(tc, world)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if tc["dtype"] == "bfloat16"
                         else nullcontext())

        self.data = resolve_data(cfg)
        self.mcfg = build_model_config(cfg, self.data.vocab_size)
        set_matmul_precision(tc, self.device)
        torch.manual_seed(seed)
        # built on the CPU, optimizers too (the Stiefel init's float64 SVDs run there), then
        # moved; the optimizers then follow the moved parameters
        self.model = GPT(self.mcfg)
        self.opts = build_optimizers(self.model, assignment_spec(cfg["grid"], assignment),
                                     OptimizerSettings.from_train(tc, retraction))
        self.model.to(self.device)
        self.opts.follow(self.model)
        if self.opts.muon is not None and world > 1:
            self.opts.muon.shard(rank, world)
        self.ddp = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # torchrun, or one rank
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.ddp = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.fwd = self.ddp if self.ddp is not None else self.model
        if tc["compile"]:
            self.fwd = torch.compile(self.fwd)

        self.train_sampler = Sampler(self.data.split("train"), self.mcfg.block_size, seed=10_000 + seed)
        self._prefetched = None  # (step, sampler state before its draw, its indices, its first micro-batch)
        self.live = None  # the live loggers (workflow.loggers), opened with the logs
        self.batches = FixedBatches(self.data, self.mcfg.block_size, tc, self.device)
        # the parts log through a printer that holds no reference to the run (no cycle:
        # a finished Run is freed at once, with its model and optimizer state)
        self._say = _printer(self.master, f"[{self.variant} seed{self.seed}]")
        self.divergence = DivergenceMonitor(tc["divergence"], self._say)
        self.pairs = PairCapture(tc, self.dir, self._say, capture_window(cfg, self.variant, seed))
        self.logs: dict = {}
        self.step = 0
        self.last_val = None
        self.step_times: list[float] = []
        self.opt_shares: list[float] = []
        self.stop_flag = False

    def log(self, msg: str):
        self._say(msg)

    def open_logs(self, resume_step: int):
        if self.master:
            self.logs = self.folder.open_logs(LOG_COLUMNS, resume_step)
            names = self.cfg.get("workflow", {}).get("loggers") or []
            if names:  # live curves (mwm.train.live), rebuilt from the CSVs just cut back to resume_step
                from mwm.train.live import LiveLogs, TeeLog

                self.live = LiveLogs(names, self.dir, {k: log.path for k, log in self.logs.items()},
                                     params=self._identity())
                self.logs = {k: TeeLog(log, k, self.live) for k, log in self.logs.items()}

    # -- checkpoint -----------------------------------------------------------------------
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

    def _identity(self) -> dict:
        return run_identity(self.cfg, self.assignment, self.seed, self.retraction)

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

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        # the optimizers refuse to write diverged weights; this makes sure no
        # diagnostic (svdvals, eigh) ever sees one, whatever path the weights took
        bad = nonfinite(list(self.model.named_parameters()))
        if bad:
            raise FloatingPointError(f"weights {bad[:4]} hold NaN, Inf or overflowing values at step {self.step}")
        # the compiled forward where it computes the same function (no DDP wrapper to step around)
        losses = self.batches.losses(self.fwd if self.ddp is None else self.model, self.autocast)
        if self.master:
            step = self.step
            self.logs["eval"].write(dict(step=step, train_loss=losses["train"], val_loss=losses["val"]))
            rows, arrays = spectral_stats(self.model, self.opts.assignment, step)
            self.logs["spectral"].write(rows)
            atomic_savez(self.dir / "spectra" / f"step_{step:06d}.npz", arrays)
            self.logs["attention"].write(attention_stats(self.model, self.batches.probe, step))
        return losses

    # -- training -------------------------------------------------------------------------
    def sampler_state(self) -> torch.Tensor:
        """The training sampler's state at the step boundary (before a prefetched draw), what a
        checkpoint holds: a resumed run draws the same batches."""
        return self._prefetched[1] if self._prefetched is not None else self.train_sampler.gen.get_state()

    def _draw(self, it: int):
        """Step ``it``'s indices (this rank's share) and its first micro-batch, prefetched or drawn now.
        One global draw per step: every rank sees the same indices and takes its share, so the
        config's grad_accum micro-batches are the same on one rank or several."""
        ready, self._prefetched = self._prefetched, None
        if ready is not None and ready[0] == it:
            return ready[2], ready[3]
        bs = self.tc["batch_size"]
        ix = self.train_sampler.indices(bs * self.tc["grad_accum"]).view(self.world, self.accum, bs)[self.rank]
        return ix, self.train_sampler.batch(ix[0], self.device)

    def forward_backward(self, it: int) -> float:
        """Accumulate the gradients of step ``it``; its mean training loss (over ranks)."""
        accum = self.accum
        ix, first = self._draw(it)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(accum):
            x, y = first if micro == 0 else self.train_sampler.batch(ix[micro], self.device)
            sync = nullcontext()
            if self.ddp is not None and micro < accum - 1:
                sync = self.ddp.no_sync()
            with sync:
                with self.autocast:
                    _, loss = self.fwd(x, y)
                (loss / accum).backward()
            total += loss.detach().double() / accum  # summed on the device: one read per step
        if it + 1 < self.tc["max_iters"]:
            # the next step's draw and first batch while the device runs this backward (the same draws
            # in the same order: bit for bit as drawing them then)
            state = self.train_sampler.gen.get_state()
            self._prefetched = (it + 1, state, *self._draw(it + 1))
        if self.world > 1:
            torch.distributed.all_reduce(total)
            total /= self.world
        return total.item()

    def train_step(self, inputs: dict | None = None) -> float:
        """One optimizer step at ``self.step``; its training loss. With a dict ``inputs``,
        the Muon updates' (manifold, W, U) are added to it (bench_gpu's precision check)."""
        tc, it = self.tc, self.step
        lr, mlr = learning_rates(it, tc)
        self.opts.set_lr(lr, mlr)
        t0 = time.perf_counter()
        loss = self.forward_backward(it)
        if not math.isfinite(loss):
            self.divergence.mark_unstable(it)
            raise FloatingPointError(f"training loss is {loss} at step {it}")
        if tc["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc["grad_clip"])
        pair_paths = self.pairs.paths(it) if self.opts.muon is not None else []
        # the step after each evaluation also measures its inner solves (solver.csv)
        directions = {} if self.opts.muon is not None and it % tc["eval_interval"] == 0 else None
        t1 = time.perf_counter()
        consumed = self.opts.step(inputs=bool(pair_paths) or inputs is not None or directions is not None,
                                  directions=directions)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        self.opts.zero_grad()
        if directions is not None:
            self.log_solver_quality(it, consumed, directions)
        if pair_paths:
            captured = self.gather_inputs(consumed)
            if self.master:
                for path in pair_paths:
                    self.pairs.save(captured, path, it)
        if inputs is not None and consumed:
            inputs.update(consumed)
        dt, opt_t = t2 - t0, t2 - t1
        self.step_times.append(dt)
        self.opt_shares.append(opt_t / dt)
        if self.master:
            self.log_step(it, loss, lr, mlr, dt, opt_t)
        return loss

    def gather_inputs(self, consumed: dict) -> dict:
        """Every rank's ``(manifold, W, U)`` of this step on rank 0 (each rank holds those of the matrices it
        computed, :meth:`ManifoldMuon.shard`); the others get ``{}``. One rank: ``consumed`` itself."""
        if self.world == 1:
            return consumed
        local = {k: (mf, W.detach().cpu(), U.detach().cpu()) for k, (mf, W, U) in consumed.items()}
        parts = [None] * self.world if self.master else None
        torch.distributed.gather_object(local, parts, dst=0)
        return {k: v for part in parts for k, v in part.items()} if self.master else {}

    def log_solver_quality(self, it: int, consumed: dict, directions: dict) -> None:
        """``solver.csv``'s rows of step ``it`` (:mod:`mwm.optim.quality`): each rank measures the matrices it
        computed, and rank 0 writes them all."""
        rows = quality_rows(consumed, directions, it)
        if self.world > 1:
            gathered = [None] * self.world
            torch.distributed.all_gather_object(gathered, rows)
            rows = sorted((r for part in gathered for r in part), key=lambda r: r["name"])
        if self.master:
            self.logs["solver"].write(rows)

    def log_step(self, it: int, loss: float, lr: float, mlr: float, dt: float, opt_t: float) -> None:
        tc = self.tc
        tokens = tc["batch_size"] * tc["grad_accum"] * self.mcfg.block_size
        self.logs["metrics"].write(dict(step=it, train_loss=loss, lr=lr, muon_lr=mlr, step_time=dt,
                                        tokens_per_s=tokens / dt, optimizer_time=opt_t, optimizer_share=opt_t / dt))
        if it % tc["log_interval"] == 0:
            recent = self.step_times[-tc["log_interval"]:]
            eta = (tc["max_iters"] - it - 1) * sum(recent) / len(recent)
            self.log(f"step {it}/{tc['max_iters']} loss {loss:.4f} lr {lr:.2e} "
                     f"{1000 * sum(recent) / len(recent):.1f} ms/step {tokens / dt:,.0f} tok/s "
                     f"opt {100 * opt_t / dt:.0f}% eta "
                     + (f"{eta / 3600:.1f} h" if eta >= 3600
                        else f"{eta / 60:.1f} min" if eta >= 60 else f"{eta:.0f} s"))

    # -- outputs --------------------------------------------------------------------------
    def write_summary(self, status: str | None = None, error: str | None = None):
        if not self.master:
            return
        ev = self._eval_rows()
        div = self.divergence
        summary = {
            "status": status or div.status, "onset_step": div.onset, "steps_done": self.step,
            "max_iters": self.tc["max_iters"], "final_val_loss": self.last_val,
            "best_val_loss": None if not math.isfinite(div.best_val) else div.best_val,
            "final_train_loss": ev[-1]["train_loss"] if ev else None,
            "mean_step_time": float(np.mean(self.step_times[1:] or self.step_times)) if self.step_times else None,
            "optimizer_share": float(np.mean(self.opt_shares[1:] or self.opt_shares)) if self.opt_shares else None,
            "n_params": self.model.num_params(), "model": self.model.export_config(),
            "assignment": self.assignment, "retraction": self.retraction, "variant": self.variant,
            "seed": self.seed, "config": self.cfg["name"], "config_hash": config_hash(self._identity()),
            "identity": self._identity(),
            "code_version": code_version(), "device": str(self.device), "world_size": self.world,
            "grad_accum_per_rank": self.accum, "manipulation": self._manipulation(),
        }
        if error:
            summary["error"] = error
        atomic_write_json(self.dir / "summary.json", summary)

    def _manipulation(self) -> dict:
        """Both manipulation checks of this run, from its own logs (:mod:`mwm.train.manipulation`)."""
        from mwm.io import read_csv_rows

        logs = {k: read_csv_rows(self.dir / f"{k}.csv") if (self.dir / f"{k}.csv").exists() else []
                for k in ("solver", "attention")}
        return run_checks(self.tc, logs["solver"], logs["attention"])

    def _eval_rows(self):
        from mwm.io import read_csv_rows

        p = self.dir / "eval.csv"
        rows = read_csv_rows(p) if p.exists() else []
        return [{k: float(v) for k, v in r.items()} for r in rows]

    def finish(self, stopped: bool) -> None:
        """The products of a run that ended (completed or unstable): pairs, final weights,
        summary; the checkpoint goes (nothing left to resume)."""
        if self.master:
            (self.dir / "sequence").mkdir(parents=True, exist_ok=True)
            missing = self.pairs.missing(self.assignment, self.opts.muon is not None, self.step, self.divergence)
            if missing:
                self.pairs.save_none(missing)
            if self.tc["keep_final_checkpoint"]:
                # on the CPU, so that it loads on a host without a GPU
                atomic_torch_save(self.dir / "final.pt",
                                  {k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        self.write_summary()
        if self.master:
            self.folder.drop_checkpoint()
            if self.live is not None:
                self.live.close()
        self.log(f"done: status {self.divergence.status}" + (" (stopped at onset)" if stopped else ""))

    def run(self) -> int:
        tc = self.tc
        start = self.resume()
        if self.master:
            if start == 0:  # nothing to continue: logs already there are stale, whatever they hold
                self.folder.discard_logs()
            self.folder.invalidate_products(start, tc["capture_pairs_step"])
        self.open_logs(start)
        if start:
            self.log(f"resumed from {self.ckpt_path} at step {start}")
        else:
            self.log(f"{self.model.num_params():,} parameters; assignment {self.assignment} "
                     f"({self.retraction} DGram retraction) on {self.device}")
        stopped = False
        try:
            while True:
                if self.step % tc["eval_interval"] == 0 or self.step == tc["max_iters"]:
                    losses = self.evaluate()
                    self.last_val = losses["val"]
                    self.log(f"eval step {self.step}: train {losses['train']:.4f} val {losses['val']:.4f}")
                    if self.divergence.check(self.step, losses["val"]):
                        stopped = True
                        break
                if self.step >= tc["max_iters"]:
                    break
                self.train_step()
                self.step += 1
                if self.should_stop():
                    raise Preempted()
                if self.step % tc["checkpoint_interval"] == 0:
                    self.save_checkpoint()
        except Preempted:
            self.save_checkpoint()
            if self.world > 1:  # no rank exits 75 before rank 0's checkpoint is down: torchrun would fail the group
                torch.distributed.barrier()
            self.log(f"preempted: checkpoint at step {self.step}, exiting with {EXIT_PREEMPTED}")
            return EXIT_PREEMPTED
        except (FloatingPointError, torch.linalg.LinAlgError) as exc:
            # an exploding run may first break a factorization (eigh, SVD) of its grown weights
            what = "non-finite values" if isinstance(exc, FloatingPointError) else "a factorization failed"
            self.log(f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            self.divergence.mark_unstable(self.step)
            stopped = True
        self.finish(stopped)
        return 0

    def should_stop(self) -> bool:
        """Whether a signal asked to stop; every rank stops at the same step, whichever got it."""
        if self.world > 1:
            flag = torch.tensor([float(self.stop_flag)], device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            self.stop_flag = bool(flag.item())
        return self.stop_flag


def keep_foreign_run(cfg: dict, assignment: str, seed: int, retraction: str, out_root: Path) -> dict | None:
    """Before a run writes its folder: a finished run there that is not this one (trained before the config
    was edited, or by other numerics) is moved to ``<out_root>/hand/foreign/`` with a record of why, as the
    workflow would set it aside, never written over. Returns that record (None: nothing was there to keep)."""
    from mwm.setaside import move_aside

    variant = variant_name(assignment, retraction, cfg["grid"].get("custom"))
    folder = RunFolder(out_root, cfg["name"], variant, seed)
    try:
        summary = json.loads((folder.dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None  # nothing finished there (a missing or cut run resumes or restarts as before)
    if not isinstance(summary, dict) or summary.get("status") not in FINAL_STATUSES:
        return None
    why = identity_problem(summary, run_identity(cfg, assignment, seed, retraction))
    if why is None:
        return None  # this run's own: rerunning it is the user's choice, as before
    record = move_aside(folder.dir, folder.ckpt_dir, out_root, cfg["name"], variant, seed, why,
                        "a hand run (python -m mwm.train)")
    print(f"mwm.train: {folder.dir} held a finished run that is not this one ({why}); moved it to "
          f"{record['moved_to']} rather than write over it", file=sys.stderr)
    return record


def train(cfg: dict, assignment: str, seed: int, retraction: str | None = None,
          out_root: str | Path = "results") -> int:
    """Run (or resume) one training run; returns the process exit status."""
    try:
        cfg = run_config(cfg, assignment)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    retraction = retraction or cfg["train"]["dgram_retraction"]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    previous = {}  # the signal handlers the run replaces
    if world > 1:
        backend = "nccl" if torch.cuda.is_available() and cfg["train"]["device"] != "cpu" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    try:
        if rank == 0:
            try:
                keep_foreign_run(cfg, assignment, seed, retraction, Path(out_root))
            except (ConfigError, OSError) as exc:  # a run being written, a full disk: nothing moved
                print(f"error: {exc}", file=sys.stderr)
                return 2
        try:
            run = Run(cfg, assignment, seed, retraction, Path(out_root), rank, world)
        except (ConfigError, ValueError) as exc:  # bad input: refuse before anything is written
            print(f"error: {exc}", file=sys.stderr)
            return 2

        def on_signal(signum, frame):
            if signum == signal.SIGINT and run.stop_flag:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            run.stop_flag = True
            run.log(f"received signal {signum}; will checkpoint after this step")

        # Ctrl-C checkpoints too; the caller's handlers come back when the run returns (a bench or a
        # check that trains in its own process must stay stoppable by SIGTERM)
        previous.update({sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)})
        from mwm.lock import RunLock, RunLocked

        try:  # one process per run folder
            lock = RunLock(run.dir) if run.master else None
        except RunLocked as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            return run.run()
        except ConfigError as exc:  # e.g. a checkpoint that cannot be trusted
            run.write_summary(status="failed", error=str(exc))
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # a full disk, a quota, EIO: the OS's own words, one line (no traceback)
            error = f"{type(exc).__name__}: {exc}"
            if exc.filename is not None and Path(exc.filename) == run.ckpt_path:
                error += " (the checkpoint write failed: the previous checkpoint is kept and the run resumes from it)"
            try:
                run.write_summary(status="failed", error=error)
            except OSError as again:
                error += f"; summary.json not written either ({again.strerror})"
            print(f"error: {error}", file=sys.stderr)
            return 1
        except Exception as exc:
            run.write_summary(status="failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if lock is not None:
                lock.release()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if world > 1:
            torch.distributed.destroy_process_group()


def _int_at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}, the largest the schema allows")
        return value

    return parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config YAML (validated against the schema)")
    ap.add_argument("--assignment", required=True,
                    help="assignment name (none, stiefel, dgram, hetero, hetero-inv, oblique, adamw) or a "
                         "variant with -colnorm suffix")
    ap.add_argument("--seed", type=_int_at_least(0, seed_bound()), required=True,
                    help=f"run seed, 0 to {seed_bound()} (grid.seeds' bound)")
    ap.add_argument("--retraction", choices=RETRACTIONS, default=None,
                    help="DGram retraction (default: train.dgram_retraction of the config)")
    ap.add_argument("--out", default=None,
                    help=f"results root (default: {RESULTS_ROOT}, the workflow's; a run whose overrides change its "
                         f"settings defaults to {RESULTS_ROOT}/{HAND_FOLDER}/<hash> and may not go to {RESULTS_ROOT})")
    ap.add_argument("--threads", type=_int_at_least(1), default=None,
                    help="torch CPU threads of the run, split across its ranks (default: torch's choice)")
    ap.add_argument("--nproc", type=_int_at_least(1), default=None,
                    help="DDP ranks for this run (default: the config's, see mwm.plan.ranks.ranks_per_run); more "
                         "than 1 relaunches this command as that many ranks under torchrun (mwm.train.launch)")
    ap.add_argument("overrides", nargs="*", help="config overrides, dotted.key=value")
    args = ap.parse_args(argv)
    try:
        if args.out is not None:
            check_out_root(args.out)
        cfg = load_config(args.config, args.overrides)
        check_grid(cfg["grid"])
        assignment, suffix_retraction = parse_variant(args.assignment)
        assignment_spec(cfg["grid"], assignment)
        retraction = args.retraction or (suffix_retraction if args.assignment.endswith("-colnorm") else None)
        if suffix_retraction == "colnorm" and not uses_dgram(assignment, cfg["grid"].get("custom")):
            raise ConfigError(f"--assignment {args.assignment}: the colnorm retraction only exists for assignments "
                              f"that use DGram; {assignment!r} does not (train {assignment!r} instead)")
        base = load_config(args.config) if args.overrides else cfg  # the config file's own settings
        check_config(base, source=args.config)  # the file as the workflow checks it
        if args.overrides:  # the run itself, as overridden (a hand run is no grid run: no grid-wide checks)
            check_run(cfg, assignment, source=f"{args.config} with {' '.join(args.overrides)}")
        out = out_root(args, base, cfg, assignment, retraction)
        if int(os.environ.get("RANK", "0")) == 0:
            claim(out, base, args.config)  # the results of base's name belong to this config file
        nproc = args.nproc or ranks_per_run(cfg)
        accum_per_rank(cfg["train"], nproc)  # --nproc too: each rank would refuse it after torchrun started
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # claiming the results folder: read-only, full
        print(f"error: {write_failure(exc, 'the results folder')} (--out)", file=sys.stderr)
        return 1
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        rest = ["--config", args.config, "--assignment", args.assignment, "--seed", str(args.seed),
                "--out", str(out), *(["--retraction", args.retraction] if args.retraction else []),
                *args.overrides]
        return launch(nproc, rest, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    worker_started()
    try:
        rc = train(cfg, assignment, args.seed, retraction, out)
    except OSError as exc:  # the run's folder or lock before training (a run's own failures are train's)
        print(f"error: {write_failure(exc, 'the run')} (--out)", file=sys.stderr)
        rc = 1
    return worker_exit(rc)


def out_root(args, base: dict, cfg: dict, assignment: str, retraction: str | None) -> Path:
    """The results root of a hand run: ``--out``, else :data:`RESULTS_ROOT`. A run whose
    overrides change its identity is not the config's run of (assignment, seed): it goes to
    ``RESULTS_ROOT/HAND_FOLDER/<hash of the overridden config>`` (the same root for every run of
    those overrides, their list in ``overrides.json`` there) and is refused in RESULTS_ROOT,
    where it would replace the config's run that the report and the workflow read."""
    if not args.overrides:
        return Path(args.out or RESULTS_ROOT)
    own = config_run_identity(base, assignment, args.seed, retraction)
    diff = identity_diff(config_run_identity(cfg, assignment, args.seed, retraction), own)
    if not diff:
        return Path(args.out or RESULTS_ROOT)
    what = f"overrides {' '.join(args.overrides)} change the run ({'; '.join(diff)})"
    if args.out is None:
        root = hand_root(cfg)
        atomic_write_json(root / "overrides.json", {"config_file": args.config, "overrides": list(args.overrides)})
        print(f"{what}: it is not config {cfg['name']!r}'s run, so it goes to {root} "
              f"({config_dir('runs', cfg['name']).as_posix()}/ holds the config's own runs)", flush=True)
        return root
    if os.path.abspath(args.out) == os.path.abspath(RESULTS_ROOT):
        raise ConfigError(f"{what}: it is not config {cfg['name']!r}'s run (from {args.config}) and would replace "
                          f"that run in {config_dir('runs', cfg['name']).as_posix()}/; leave out --out (it then goes "
                          f"to {RESULTS_ROOT}/{HAND_FOLDER}/<hash>/), give another --out, or put the settings in the "
                          f"config (or a new config with its own name)")
    return Path(args.out)


if __name__ == "__main__":
    sys.exit(main())
