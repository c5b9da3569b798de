"""Train one GPT-2 run under one manifold assignment.

    python -m mwm.train --config config/config.yaml --assignment hetero --seed 0 [key=value ...]

One run per call; its folder is ``results/runs/<config>/<variant>/seed<seed>/``
(see :mod:`mwm.runs`). Files, appended as the run goes and safe to read meanwhile:

``metrics.csv``   step, train_loss, lr, muon_lr, step_time, tokens_per_s, optimizer_time, optimizer_share
``eval.csv``      step, train_loss, val_loss (fixed batches, the same for every run of a config)
``spectral.csv``  per evaluation and hidden matrix (and W_Q, W_K, W_V): see :mod:`mwm.diagnostics`
``spectra/step_NNNNNN.npz``  full singular spectra and column norms per matrix
``sequence/step_NNNNNN.npz``  with ``train.capture_sequence``: (W, momentum direction) of
                  every Muon matrix at each step of the window, as ``pairs.npz``
``attention.csv`` per evaluation, layer and head, on a fixed probe batch
``summary.json``  status (completed / unstable / failed), final and best val loss,
                  onset step, mean step time, optimizer share, parameter count,
                  config hash, code version
``final.pt``      final model weights (when ``train.keep_final_checkpoint``)

Resume: a checkpoint (model, both optimizers, step, RNG and data-sampler state,
divergence state) is written atomically every ``checkpoint_interval`` steps
under ``results/checkpoints/...``; starting the same run again resumes from it
and truncates the logs to the checkpoint, so the result equals an uninterrupted
run. SIGTERM / SIGUSR1 (a scheduler's warning) write a checkpoint and exit with
status 75 (``EXIT_PREEMPTED``) for the workflow to retry.

Multi-process: launched by ``torchrun``, gradients are averaged with DDP (nccl on
GPU, gloo on CPU) and the Muon matrix banks are sharded across ranks.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .assignments import build_optimizers
from .config import ConfigError, config_hash, load_config, resolve_device
from .diagnostics import ATTENTION_COLUMNS, SPECTRAL_COLUMNS, attention_stats, spectral_stats
from .io import CsvLog, atomic_savez, atomic_torch_save, atomic_write, atomic_write_json
from .launch import launch, ranks_per_run, worker_exit, worker_started
from .model import GPT, SIZES, GPTConfig
from .runs import (assignment_spec, check_grid, checkpoint_dir, parse_variant, run_config, run_dir,
                   uses_dgram, variant_name)
from .schedule import learning_rates

__all__ = ["main", "train", "EXIT_PREEMPTED", "build_model_config", "resolve_data"]

EXIT_PREEMPTED = 75
METRIC_COLUMNS = ["step", "train_loss", "lr", "muon_lr", "step_time", "tokens_per_s", "optimizer_time",
                  "optimizer_share"]
EVAL_COLUMNS = ["step", "train_loss", "val_loss"]


# --------------------------------------------------------------------------------------
# set-up helpers
# --------------------------------------------------------------------------------------
def code_version() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return f"{__version__}+{out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return __version__


def resolve_data(cfg: dict):
    """The TokenDataset of the config's data section."""
    from .data import TokenDataset, dataset_dir

    folder = dataset_dir(cfg["data"])
    if not (folder / "meta.json").exists():
        raise ConfigError(f"data folder {folder} has no meta.json; run `python -m mwm.data prepare --config ...` first")
    ds = TokenDataset(folder)
    if ds.verify_cached():  # checksums and id range, once per data folder (cached by size+mtime)
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
    return GPTConfig(vocab_size=vocab, block_size=m["block_size"], bias=m["bias"], dropout=m["dropout"], **shape)


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
        rows = np.stack([np.asarray(self.data[i:i + self.block + 1], dtype=np.int64) for i in ix.tolist()])
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)


class Preempted(Exception):
    pass


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------
class Run:
    def __init__(self, cfg: dict, assignment: str, seed: int, retraction: str, out_root: Path,
                 rank: int = 0, world: int = 1):
        self.cfg, self.tc = cfg, cfg["train"]
        self.assignment, self.seed, self.retraction = assignment, seed, retraction
        self.rank, self.world, self.master = rank, world, rank == 0
        self.variant = variant_name(assignment, retraction, cfg["grid"].get("custom"))
        self.dir = run_dir(out_root, cfg["name"], self.variant, seed)
        self.ckpt_dir = checkpoint_dir(out_root, cfg["name"], self.variant, seed)
        self.ckpt_path = self.ckpt_dir / "ckpt.pt"
        tc = self.tc
        dev = resolve_device(tc["device"], "train.device")
        if tc["dtype"] == "bfloat16" and dev.type != "cuda":
            raise ConfigError("train.dtype=bfloat16 is allowed on GPU only; use float32 on CPU")
        if world > 1 and dev.type == "cuda":
            dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
            torch.cuda.set_device(dev)
        self.device = dev
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if tc["dtype"] == "bfloat16"
                         else nullcontext())

        self.data = resolve_data(cfg)
        self.mcfg = build_model_config(cfg, self.data.vocab_size)
        torch.manual_seed(seed)
        self.model = GPT(self.mcfg).to(self.device)
        self.opts = build_optimizers(
            self.model, assignment_spec(cfg["grid"], assignment), adamw_lr=tc["learning_rate"], betas=(tc["beta1"], tc["beta2"]),
            weight_decay=tc["weight_decay"], muon_lr=tc["muon_lr"], momentum=tc["muon_momentum"],
            alpha=tc["dual_ascent_alpha"], dual_steps=tc["solver_max_steps"] or tc["dual_ascent_steps"],
            dgram_retraction=retraction, msign_steps=tc["msign_steps"], msign_precision=tc["msign_precision"],
            solver=tc["solver"], solver_tol=tc["solver_tol"], warm_start=tc["warm_start"], rho=tc["admm_rho"],
        )
        if self.opts.muon is not None and world > 1:
            self.opts.muon.shard(rank, world)
        self.ddp = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.ddp = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.fwd = self.ddp if self.ddp is not None else self.model
        if tc["compile"]:
            self.fwd = torch.compile(self.fwd)

        block = self.mcfg.block_size
        self.train_sampler = Sampler(self.data.split("train"), block, seed=10_000 + seed)
        # evaluation and probe batches: fixed by eval_seed, identical for every run of the config
        eval_gen = torch.Generator().manual_seed(tc["eval_seed"])
        self.eval_data = {s: self.data.split(s) for s in ("train", "val")}
        self.eval_ix = {}
        for split, arr in self.eval_data.items():
            if len(arr) <= block + 1:
                raise ConfigError(f"{split} split has {len(arr)} tokens, fewer than block_size + 2 = {block + 2}")
            self.eval_ix[split] = torch.randint(len(arr) - block - 1, (tc["eval_iters"], tc["batch_size"]),
                                                generator=eval_gen)
        probe_ix = torch.randint(len(self.eval_data["val"]) - block - 1, (tc["probe_batch"],), generator=eval_gen)
        self.probe = Sampler(self.eval_data["val"], block, 0).batch(probe_ix, self.device)[0]

        self.step = 0
        self.best_val = math.inf
        self.last_val = None
        self.status = "completed"
        self.onset = None
        self.streak_start = None
        self.streak = 0
        self.step_times: list[float] = []
        self.opt_shares: list[float] = []
        self.stop_flag = False

    # -- logs ---------------------------------------------------------------------------
    def open_logs(self, resume_step: int):
        if not self.master:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs = {
            "metrics": CsvLog(self.dir / "metrics.csv", METRIC_COLUMNS),
            "eval": CsvLog(self.dir / "eval.csv", EVAL_COLUMNS),
            "spectral": CsvLog(self.dir / "spectral.csv", SPECTRAL_COLUMNS),
            "attention": CsvLog(self.dir / "attention.csv", ATTENTION_COLUMNS),
        }
        for log in self.logs.values():
            log.truncate_from(resume_step)

    # -- checkpoint -----------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "step": self.step, "model": self.model.state_dict(), "optimizers": self.opts.state_dict(),
            "best_val": self.best_val, "last_val": self.last_val, "status": self.status, "onset": self.onset,
            "streak_start": self.streak_start, "streak": self.streak,
            "step_times": self.step_times, "opt_shares": self.opt_shares,
            "rng_torch": torch.get_rng_state(), "sampler": self.train_sampler.gen.get_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "config_hash": config_hash(self._identity()),
        }

    def _identity(self) -> dict:
        return {"model": self.cfg["model"], "train": self.cfg["train"], "data": self.cfg.get("data"),
                "assignment": self.assignment, "seed": self.seed, "retraction": self.retraction}

    def save_checkpoint(self):
        if self.master:
            atomic_torch_save(self.ckpt_path, self.state())
            self._mirror(self.dir, self.ckpt_dir / "logs")

    def _mirror(self, src: Path, dst: Path) -> None:
        """Copy the run's logs and spectra from ``src`` to ``dst``.

        The workflow deletes a failed job's declared outputs (the logs) before it
        retries; the copy beside the checkpoint lets the retry resume anyway.
        """
        import shutil

        for name in ("metrics.csv", "eval.csv", "spectral.csv", "attention.csv", "pairs.npz"):
            if (src / name).exists():
                atomic_write(dst / name, lambda p, name=name: shutil.copyfile(src / name, p))
        for sub in ("spectra", "sequence"):
            if (src / sub).is_dir():
                for f in sorted((src / sub).glob("step_*.npz")):
                    if not (dst / sub / f.name).exists() or src != self.dir:
                        atomic_write(dst / sub / f.name, lambda p, f=f: shutil.copyfile(f, p))

    def _logs_reach(self, step: int) -> bool:
        """Whether metrics.csv holds every step below ``step`` (so a resume can continue it)."""
        from .io import read_csv_rows

        path = self.dir / "metrics.csv"
        if not path.exists():
            return False
        try:
            steps = [int(r["step"]) for r in read_csv_rows(path)]
        except (KeyError, ValueError):
            return False
        return set(range(step)) <= set(steps)

    def try_resume(self) -> int:
        if not self.ckpt_path.exists():
            return 0
        try:  # tensors and plain containers only: a planted pickle cannot run code
            ck = torch.load(self.ckpt_path, map_location=self.device, weights_only=True)
        except Exception as exc:
            raise ConfigError(f"checkpoint {self.ckpt_path} cannot be loaded as weights only ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); it is damaged or not written by "
                              f"mwm.train: delete it to start the run afresh") from exc
        if not self._logs_reach(ck["step"]) and (self.ckpt_dir / "logs" / "metrics.csv").exists():
            self.log("run logs missing or short (a retried job); restoring them from the checkpoint's copy")
            self._mirror(self.ckpt_dir / "logs", self.dir)
        if not self._logs_reach(ck["step"]):
            self.log(f"checkpoint at step {ck['step']} but the run's logs do not reach it; starting afresh")
            return 0
        if ck["config_hash"] != config_hash(self._identity()):
            raise ConfigError(
                f"checkpoint {self.ckpt_path} belongs to a different configuration; "
                "delete it or restore the config it was written with"
            )
        self.model.load_state_dict(ck["model"])
        self.opts.load_state_dict(ck["optimizers"])
        for k in ("step", "best_val", "last_val", "status", "onset", "streak_start", "streak", "step_times",
                  "opt_shares"):
            setattr(self, k, ck[k])
        torch.set_rng_state(ck["rng_torch"])
        self.train_sampler.gen.set_state(ck["sampler"])
        if ck["rng_cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["rng_cuda"])
        return self.step

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self):
        # the optimizers refuse to write diverged weights; this makes sure no
        # diagnostic (svdvals, eigh) ever sees one, whatever path the weights took
        bad = [n for n, p in self.model.named_parameters() if not bool(torch.isfinite(p.float().square().sum()))]
        if bad:
            raise FloatingPointError(f"weights {bad[:4]} hold NaN, Inf or overflowing values at step {self.step}")
        self.model.eval()
        losses = {}
        for split, ix in self.eval_ix.items():
            sampler = Sampler(self.eval_data[split], self.mcfg.block_size, 0)
            tot = 0.0
            for b in ix:
                x, y = sampler.batch(b, self.device)
                with self.autocast:
                    _, loss = self.model(x, y)
                tot += loss.item()
            losses[split] = tot / len(ix)
        self.model.train()
        if not self.master:
            return losses
        step = self.step
        self.logs["eval"].write(dict(step=step, train_loss=losses["train"], val_loss=losses["val"]))
        rows, arrays = spectral_stats(self.model, self.opts.assignment, step)
        self.logs["spectral"].write(rows)
        atomic_savez(self.dir / "spectra" / f"step_{step:06d}.npz", arrays)
        self.logs["attention"].write(attention_stats(self.model, self.probe, step))
        return losses

    def check_divergence(self, val: float):
        div = self.tc["divergence"]
        if not math.isfinite(val):
            self._mark_unstable(self.step)
            return True
        if val < self.best_val:
            self.best_val = val
        if val > self.best_val + div["threshold"]:
            if self.streak == 0:
                self.streak_start = self.step
            self.streak += 1
            if self.streak >= div["patience"]:
                self._mark_unstable(self.streak_start)
                return div["stop"]
        else:
            self.streak, self.streak_start = 0, None
        return False

    def _mark_unstable(self, onset: int):
        if self.status != "unstable":
            self.status, self.onset = "unstable", onset
            self.log(f"run marked unstable, onset step {onset}")

    # -- training -------------------------------------------------------------------------
    def log(self, msg: str):
        if self.master:
            print(f"[{self.variant} seed{self.seed}] {msg}", flush=True)

    def train_step(self) -> float:
        tc = self.tc
        it = self.step
        lr, mlr = learning_rates(it, tc)
        self.opts.set_lr(lr, mlr)
        t0 = time.perf_counter()
        accum = tc["grad_accum"]
        bs = tc["batch_size"]
        # one global draw per step: every rank sees the same indices and takes its share,
        # so a run on k ranks with grad_accum a matches one rank with grad_accum k * a
        ix = self.train_sampler.indices(bs * accum * self.world).view(self.world, accum, bs)[self.rank]
        total = 0.0
        for micro in range(accum):
            x, y = self.train_sampler.batch(ix[micro], self.device)
            sync = nullcontext()
            if self.ddp is not None and micro < accum - 1:
                sync = self.ddp.no_sync()
            with sync:
                with self.autocast:
                    _, loss = self.fwd(x, y)
                (loss / accum).backward()
            total += loss.item() / accum
        if self.world > 1:
            t = torch.tensor([total], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t)
            total = t.item() / self.world
        if not math.isfinite(total):
            self._mark_unstable(it)
            raise FloatingPointError(f"training loss is {total} at step {it}")
        if tc["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc["grad_clip"])
        seq = tc["capture_sequence"]
        in_seq = seq is not None and seq["start"] <= it < seq["start"] + seq["length"]
        capture = ((tc["capture_pairs_step"] is not None and it == tc["capture_pairs_step"]) or in_seq) \
            and self.opts.muon is not None
        t1 = time.perf_counter()
        consumed = self.opts.step(inputs=capture)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        self.opts.zero_grad()
        if capture:
            if tc["capture_pairs_step"] is not None and it == tc["capture_pairs_step"]:
                self.save_pairs(consumed)
            if in_seq:
                self.save_pairs(consumed, self.dir / "sequence" / f"step_{it:06d}.npz")
        dt, opt_t = t2 - t0, t2 - t1
        self.step_times.append(dt)
        self.opt_shares.append(opt_t / dt)
        if self.master:
            tokens = bs * accum * self.world * self.mcfg.block_size
            self.logs["metrics"].write(dict(step=it, train_loss=total, lr=lr, muon_lr=mlr, step_time=dt,
                                            tokens_per_s=tokens / dt, optimizer_time=opt_t,
                                            optimizer_share=opt_t / dt))
            if it % tc["log_interval"] == 0:
                recent = self.step_times[-tc["log_interval"]:]
                eta = (tc["max_iters"] - it - 1) * sum(recent) / len(recent)
                self.log(f"step {it}/{tc['max_iters']} loss {total:.4f} lr {lr:.2e} "
                         f"{1000 * sum(recent) / len(recent):.1f} ms/step {tokens / dt:,.0f} tok/s "
                         f"opt {100 * opt_t / dt:.0f}% eta "
                         + (f"{eta / 3600:.1f} h" if eta >= 3600 else f"{eta / 60:.1f} min" if eta >= 60 else f"{eta:.0f} s"))
        return total

    def save_pairs(self, captured: dict, path: Path | None = None):
        if not self.master:
            return
        names = sorted(captured)
        arrays = {"names": np.array(names), "manifolds": np.array([captured[n][0] for n in names]),
                  "captured": np.array(True), "step": np.array(self.step), "reason": np.array("")}
        for i, n in enumerate(names):
            arrays[f"W_{i}"] = captured[n][1].float().cpu().numpy()
            arrays[f"G_{i}"] = captured[n][2].float().cpu().numpy()
        atomic_savez(path or self.dir / "pairs.npz", arrays)
        if path is None:
            self.log(f"saved {len(names)} (W, G) pairs at step {self.step}")

    def pairs_not_captured(self) -> str | None:
        """Why this run holds no pairs at ``capture_pairs_step`` (None: it does, or none asked)."""
        cs = self.tc["capture_pairs_step"]
        if cs is None or (self.dir / "pairs.npz").exists():
            return None
        if self.opts.muon is None:
            return f"assignment {self.assignment} has no Muon matrices"
        if cs >= self.tc["max_iters"]:
            return f"capture_pairs_step {cs} is not below max_iters {self.tc['max_iters']}"
        if self.status == "unstable" and self.step <= cs:
            return f"the run became unstable at step {self.onset} and stopped at step {self.step}, before step {cs}"
        return f"no pairs were saved at step {cs} (the run stopped at step {self.step})"

    def save_no_pairs(self, reason: str):
        """The declared pairs output of a run that has none: an explicit, empty file."""
        if not self.master:
            return
        atomic_savez(self.dir / "pairs.npz", {
            "names": np.array([], dtype=str), "manifolds": np.array([], dtype=str), "captured": np.array(False),
            "step": np.array(self.tc["capture_pairs_step"]), "reason": np.array(reason)})
        self.log(f"no (W, G) pairs: {reason}")

    def write_summary(self, status: str | None = None, error: str | None = None):
        if not self.master:
            return
        ev = self._eval_rows()
        summary = {
            "status": status or self.status, "onset_step": self.onset, "steps_done": self.step,
            "max_iters": self.tc["max_iters"], "final_val_loss": self.last_val,
            "best_val_loss": None if not math.isfinite(self.best_val) else self.best_val,
            "final_train_loss": ev[-1]["train_loss"] if ev else None,
            "mean_step_time": float(np.mean(self.step_times[1:] or self.step_times)) if self.step_times else None,
            "optimizer_share": float(np.mean(self.opt_shares[1:] or self.opt_shares)) if self.opt_shares else None,
            "n_params": self.model.num_params(), "model": self.model.export_config(),
            "assignment": self.assignment, "retraction": self.retraction, "variant": self.variant,
            "seed": self.seed, "config": self.cfg["name"], "config_hash": config_hash(self._identity()),
            "code_version": code_version(), "device": str(self.device), "world_size": self.world,
        }
        if error:
            summary["error"] = error
        atomic_write_json(self.dir / "summary.json", summary)

    def _eval_rows(self):
        from .io import read_csv_rows

        p = self.dir / "eval.csv"
        rows = read_csv_rows(p) if p.exists() else []
        return [{k: float(v) for k, v in r.items()} for r in rows]

    def invalidate_products(self, start: int) -> None:
        """Before the logs are cut back to ``start``: remove the summary and the products a
        finished run leaves (final.pt; pairs.npz and spectra not before ``start``), so an
        interrupted rerun never looks complete (the summary comes back at the end)."""
        if not self.master:
            return
        (self.dir / "summary.json").unlink(missing_ok=True)
        (self.dir / "final.pt").unlink(missing_ok=True)
        cap = self.tc["capture_pairs_step"]
        if cap is None or cap >= start:
            (self.dir / "pairs.npz").unlink(missing_ok=True)
        for f in (self.dir / "spectra").glob("step_*.npz"):
            if int(f.stem.split("_")[1]) >= start:
                f.unlink()

    def run(self) -> int:
        start = self.try_resume()
        self.invalidate_products(start)
        self.open_logs(start)
        if start:
            self.log(f"resumed from {self.ckpt_path} at step {start}")
        else:
            self.log(f"{self.model.num_params():,} parameters; assignment {self.assignment} "
                     f"({self.retraction} DGram retraction) on {self.device}")
        tc = self.tc
        stopped = False
        try:
            while True:
                if self.step % tc["eval_interval"] == 0 or self.step == tc["max_iters"]:
                    losses = self.evaluate()
                    self.last_val = losses["val"]
                    self.log(f"eval step {self.step}: train {losses['train']:.4f} val {losses['val']:.4f}")
                    if self.check_divergence(losses["val"]):
                        stopped = True
                        break
                if self.step >= tc["max_iters"]:
                    break
                self.train_step()
                self.step += 1
                if self.world > 1:  # every rank stops at the same step, whichever got the signal
                    flag = torch.tensor([float(self.stop_flag)], device=self.device)
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                    self.stop_flag = bool(flag.item())
                if self.stop_flag:
                    raise Preempted()
                if self.step % tc["checkpoint_interval"] == 0:
                    self.save_checkpoint()
        except Preempted:
            self.save_checkpoint()
            self.log(f"preempted: checkpoint at step {self.step}, exiting with {EXIT_PREEMPTED}")
            return EXIT_PREEMPTED
        except FloatingPointError as exc:
            self.log(f"non-finite values: {exc}")
            self._mark_unstable(self.step)
            stopped = True
        missing = self.pairs_not_captured()
        if missing:
            self.save_no_pairs(missing)
        if self.master and tc["keep_final_checkpoint"]:
            atomic_torch_save(self.dir / "final.pt", self.model.state_dict())
        self.write_summary()
        if self.master and self.ckpt_path.exists():
            import shutil

            self.ckpt_path.unlink()  # the run is complete: nothing left to resume
            shutil.rmtree(self.ckpt_dir / "logs", ignore_errors=True)
        self.log(f"done: status {self.status}" + (" (stopped at onset)" if stopped else ""))
        return 0


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
    if world > 1:
        backend = "nccl" if torch.cuda.is_available() and cfg["train"]["device"] != "cpu" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    try:
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

        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # Ctrl-C checkpoints too
            signal.signal(sig, on_signal)
        from .lock import RunLock, RunLocked

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
        except Exception as exc:
            run.write_summary(status="failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if lock is not None:
                lock.release()
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config YAML (validated against the schema)")
    ap.add_argument("--assignment", required=True,
                    help="assignment name (none, stiefel, dgram, hetero, hetero-inv, oblique, adamw) or a "
                         "variant with -colnorm suffix")
    ap.add_argument("--seed", type=_int_at_least(0), required=True)
    ap.add_argument("--retraction", choices=["paper", "colnorm"], default=None,
                    help="DGram retraction (default: train.dgram_retraction of the config)")
    ap.add_argument("--out", default="results", help="results root (default: results)")
    ap.add_argument("--threads", type=_int_at_least(1), default=None,
                    help="torch CPU threads of the run, split across its ranks (default: torch's choice)")
    ap.add_argument("--nproc", type=_int_at_least(1), default=None,
                    help="DDP ranks for this run (default: the config's, see mwm.launch.ranks_per_run); more "
                         "than 1 relaunches this command as that many ranks under torchrun (mwm.launch)")
    ap.add_argument("overrides", nargs="*", help="config overrides, dotted.key=value")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        check_grid(cfg["grid"])
        assignment, suffix_retraction = parse_variant(args.assignment)
        assignment_spec(cfg["grid"], assignment)
        retraction = args.retraction or (suffix_retraction if args.assignment.endswith("-colnorm") else None)
        if suffix_retraction == "colnorm" and not uses_dgram(assignment, cfg["grid"].get("custom")):
            raise ConfigError(f"--assignment {args.assignment}: the colnorm retraction only exists for assignments "
                              f"that use DGram; {assignment!r} does not (train {assignment!r} instead)")
        nproc = args.nproc or ranks_per_run(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        rest = ["--config", args.config, "--assignment", args.assignment, "--seed", str(args.seed),
                "--out", args.out, *(["--retraction", args.retraction] if args.retraction else []),
                *args.overrides]
        return launch(nproc, rest, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    worker_started()
    return worker_exit(train(cfg, assignment, args.seed, retraction, args.out))


if __name__ == "__main__":
    sys.exit(main())
