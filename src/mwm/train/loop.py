"""The training loop of one run, read top to bottom: :class:`Run` builds the model, optimizers and
batches of a run, then steps, evaluates and logs until the run ends (completed, unstable or
preempted), writing its products. Its parts live beside it: the data (:mod:`mwm.train.batches`), the
divergence rule (:mod:`mwm.train.divergence`), pair capture (:mod:`mwm.train.capture`), the device
(:mod:`mwm.train.device`), checkpoint and resume (:mod:`mwm.train.checkpoint`, mixed in); the command
line that calls it is :mod:`mwm.train.cli` (``python -m mwm.train``, which lists the run's files).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from mwm.config import config_hash
from mwm.config.names import variant_name
from mwm.io import atomic_savez, atomic_torch_save, atomic_write_json
from mwm.numerics import code_version
from mwm.optim.assignments import OptimizerSettings, build_optimizers, nonfinite
from mwm.optim.quality import QUALITY_COLUMNS, quality_rows
from mwm.plan.ranks import accum_per_rank
from mwm.plan.runs import capture_window, run_identity
from mwm.plan.variants import assignment_spec
from mwm.train.batches import FixedBatches, Sampler, build_model_config, resolve_data
from mwm.train.capture import PairCapture
from mwm.train.checkpoint import Resumable
from mwm.train.device import resolve_train_device, set_matmul_precision
from mwm.train.diagnostics import ATTENTION_COLUMNS, SPECTRAL_COLUMNS, attention_stats, spectral_stats
from mwm.train.divergence import DivergenceMonitor, Preempted
from mwm.train.folder import RunFolder
from mwm.train.manipulation import run_checks
from mwm.train.model import GPT
from mwm.train.schedule import learning_rates

__all__ = ["Run", "EXIT_PREEMPTED", "METRIC_COLUMNS", "EVAL_COLUMNS", "LOG_COLUMNS"]

EXIT_PREEMPTED = 75
METRIC_COLUMNS = ["step", "train_loss", "lr", "muon_lr", "step_time", "tokens_per_s", "optimizer_time",
                  "optimizer_share"]
EVAL_COLUMNS = ["step", "train_loss", "val_loss"]


def _printer(master: bool, prefix: str):
    """A log function printing ``prefix msg`` on the master rank, silent on the others."""
    def say(msg: str) -> None:
        if master:
            print(f"{prefix} {msg}", flush=True)

    return say


LOG_COLUMNS = {"metrics": METRIC_COLUMNS, "eval": EVAL_COLUMNS, "spectral": SPECTRAL_COLUMNS,
               "attention": ATTENTION_COLUMNS, "solver": QUALITY_COLUMNS}


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------
class Run(Resumable):
    """One training run: built from a config, an assignment, a seed and a DGram retraction, with its
    folder under ``out_root``; ``data`` (default: the config's dataset) is the token source."""

    def __init__(self, cfg: dict, assignment: str, seed: int, retraction: str, out_root: Path,
                 rank: int = 0, world: int = 1, data=None):
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

        self.data = resolve_data(cfg) if data is None else data
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

    def _identity(self) -> dict:
        return run_identity(self.cfg, self.assignment, self.seed, self.retraction)

    def open_logs(self, resume_step: int):
        if self.master:
            self.logs = self.folder.open_logs(LOG_COLUMNS, resume_step)
            names = self.cfg.get("workflow", {}).get("loggers") or []
            if names:  # live curves (mwm.train.live), rebuilt from the CSVs just cut back to resume_step
                from mwm.train.live import LiveLogs, TeeLog

                self.live = LiveLogs(names, self.dir, {k: log.path for k, log in self.logs.items()},
                                     params=self._identity())
                self.logs = {k: TeeLog(log, k, self.live) for k, log in self.logs.items()}

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
            agreed = bool(flag.item())
            # the handler may run after the vote: its flag must carry to the next vote, never be voted away
            self.stop_flag = self.stop_flag or agreed
            return agreed
        return self.stop_flag
