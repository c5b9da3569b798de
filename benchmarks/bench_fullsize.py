"""Benchmark: GPT-2 small's widths on CPU, through the package's own training path.

GPT-2 small's shapes (n_embd 768, 12 heads, block 1024, vocab 50304, no biases as in
the released train.py) with few layers (default 2) and batch 1, so a handful of
steps per assignment fits on a CPU. Each of the five assignments runs in its own
process (so its peak memory is its own) through ``mwm.train.loop.Run``:

1. a run to ``--resume-at`` steps that is then preempted as SIGTERM would do
   (checkpoint written by ``Run.save_checkpoint``, exit 75), with the (W, G) pairs
   captured at step 1 (the real Muon banks: 768x2304, 768x3072, 768x768, 3072x768);
2. a fresh ``Run`` on the same folder that resumes from that checkpoint and trains
   to ``--steps``, evaluating (and so logging spectra and attention at T = block) at
   step 0 and at the last step.

Printed per assignment: median ms per training step and the optimizer's share of
it, the evaluation (2 x eval_iters batches) and the logging (``spectral_stats`` and
``attention_stats``) times, the logging share of the run's wall time, checkpoint
size and save/load times, peak resident memory; the ratio of each assignment's step
time to ``none``'s, measured in the same run.

    nice python benchmarks/bench_fullsize.py [--layers 2] [--steps 4] [--resume-at 2]
        [--dual-steps 20] [--data prepared|random] [--threads N] [--assignments ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENTS = ["none", "stiefel", "dgram", "hetero", "hetero-inv"]


class RandomTokens:
    """Uniform random token ids in place of a prepared dataset (``--data random``)."""

    def __init__(self, vocab: int, n: int, seed: int = 0):
        import numpy as np

        r = np.random.default_rng(seed)
        self.vocab_size = vocab
        self._s = {"train": r.integers(0, vocab, n).astype(np.uint16),
                   "val": r.integers(0, vocab, max(n // 10, 4096)).astype(np.uint16)}
        self.meta = {"vocab_size": vocab}

    def split(self, s):
        return self._s[s]


def make_config(args) -> dict:
    """The run's config: config/ci.yaml with the full-size model and these steps, validated."""
    from mwm.config import load_config

    # with --data prepared the corpus keeps the full GPT-2 vocabulary (50257 ids)
    data = {"data.vocab_size": None} if args.data == "prepared" else {}
    over = {
        **data,
        "model.n_layer": args.layers, "model.n_head": args.heads, "model.n_embd": args.embd,
        "model.block_size": args.block, "model.vocab_size": args.vocab, "model.bias": args.bias,
        "train.batch_size": args.batch, "train.grad_accum": 1, "train.max_iters": args.steps,
        "train.warmup_iters": 1, "train.lr_decay_iters": args.steps, "train.eval_interval": args.steps,
        "train.eval_iters": args.eval_iters, "train.probe_batch": args.batch,
        "train.checkpoint_interval": args.steps + 1, "train.log_interval": 1,
        "train.dual_ascent_steps": args.dual_steps, "train.capture_pairs_step": 1,
        "train.keep_final_checkpoint": False, "train.device": "cpu", "train.dtype": "float32",
        "grid.seeds": [0],
    }
    return load_config(ROOT / "config" / "ci.yaml",
                       [f"{k}={json.dumps(v)}" for k, v in over.items()])


def _data(args, cfg):
    """The token data the runs take (``Run(data=...)``): random ids, or None after preparing the
    config's data with mwm.data into <workdir>/data (the run then reads it)."""
    if args.data == "random":
        return RandomTokens(min(args.vocab, 50257), 200_000)
    from mwm.data import dataset_dir, prepare_dataset

    if not (dataset_dir(cfg["data"]) / "meta.json").exists():
        prepare_dataset(cfg["data"], num_proc=1)
    return None


def run_one(args, assignment: str, out: Path) -> dict:
    """One assignment: train to resume_at, preempt, resume in a new Run, train to steps."""
    import torch

    import mwm.train.loop as T

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = make_config(args)
    data = _data(args, cfg)
    timers = {"spectral": 0.0, "attention": 0.0, "eval": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] += time.perf_counter() - t0
        return wrapper

    spectral, attention, evaluate = T.spectral_stats, T.attention_stats, T.Run.evaluate
    T.spectral_stats, T.attention_stats = timed("spectral", spectral), timed("attention", attention)
    T.Run.evaluate = timed("eval", evaluate)
    retraction = cfg["train"]["dgram_retraction"]
    try:
        wall0 = time.perf_counter()
        run = T.Run(cfg, assignment, 0, retraction, out, data=data)
        banks = sorted({tuple(p.shape) for g in (run.opts.muon.param_groups if run.opts.muon else [])
                        for p in g["params"]})
        train_step = run.train_step

        def step_then_preempt():
            loss = train_step()
            if run.step + 1 == args.resume_at:
                run.stop_flag = True  # what the SIGTERM handler sets
            return loss

        run.train_step = step_then_preempt
        t0 = time.perf_counter()
        code = run.run()
        if code != T.EXIT_PREEMPTED or not run.ckpt_path.exists():
            raise RuntimeError(f"{assignment}: the first leg ended with {code}, no checkpoint at {run.ckpt_path}")
        ckpt_mb = run.ckpt_path.stat().st_size / 2 ** 20
        t0 = time.perf_counter()
        run.save_checkpoint()  # timed alone: the same save the preemption made
        save_s = time.perf_counter() - t0

        run2 = T.Run(cfg, assignment, 0, retraction, out, data=data)
        t0 = time.perf_counter()
        start = run2.try_resume()
        load_s = time.perf_counter() - t0
        if start != args.resume_at:
            raise RuntimeError(f"{assignment}: resumed at step {start}, expected {args.resume_at}")
        run2.try_resume = lambda: start  # run() resumes again otherwise; the state is loaded
        if run2.run() != 0:
            raise RuntimeError(f"{assignment}: the resumed leg failed")
        wall = time.perf_counter() - wall0
        summary = json.loads((run2.dir / "summary.json").read_text())
        if summary["status"] != "completed" or summary["steps_done"] != args.steps:
            raise RuntimeError(f"{assignment}: summary {summary['status']} after {summary['steps_done']} steps")
        spectral_rows = (run2.dir / "spectral.csv").read_text().splitlines()
        attention_rows = (run2.dir / "attention.csv").read_text().splitlines()
    finally:
        T.spectral_stats, T.attention_stats, T.Run.evaluate = spectral, attention, evaluate
    steps = run2.step_times
    return {
        "assignment": assignment, "params": run2.model.num_params(), "banks": banks,
        "steps": len(steps), "step_ms": 1e3 * statistics.median(steps),
        "step_ms_all": [round(1e3 * s, 1) for s in steps],
        "opt_share": statistics.median(run2.opt_shares),
        "eval_s": timers["eval"] - timers["spectral"] - timers["attention"],
        "spectral_s": timers["spectral"], "attention_s": timers["attention"],
        "logging_share": (timers["spectral"] + timers["attention"]) / wall, "wall_s": wall,
        "ckpt_mb": ckpt_mb, "save_s": save_s, "load_s": load_s, "resumed_at": start,
        "spectral_rows": len(spectral_rows) - 1, "attention_rows": len(attention_rows) - 1,
        "final_val": summary["final_val_loss"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _table(results: list[dict], args) -> str:
    base = next((r["step_ms"] for r in results if r["assignment"] == "none"), None)
    lines = [f"GPT-2 widths on CPU: n_embd {args.embd}, {args.heads} heads, block {args.block}, vocab {args.vocab}, "
             f"bias {args.bias}, {args.layers} layers, batch {args.batch}, {args.dual_steps} dual-ascent steps, "
             f"torch threads {args.threads or 'default'}",
             f"{'assignment':<11}{'ms/step':>10}{'x none':>8}{'opt %':>7}{'eval s':>8}{'spectral s':>11}"
             f"{'attn s':>8}{'log %':>7}{'ckpt MB':>9}{'save s':>8}{'load s':>8}{'peak MB':>9}"]
    for r in results:
        ratio = f"{r['step_ms'] / base:.2f}" if base else "-"
        lines.append(f"{r['assignment']:<11}{r['step_ms']:>10.0f}{ratio:>8}{100 * r['opt_share']:>7.1f}"
                     f"{r['eval_s']:>8.1f}{r['spectral_s']:>11.2f}{r['attention_s']:>8.2f}"
                     f"{100 * r['logging_share']:>7.1f}{r['ckpt_mb']:>9.0f}{r['save_s']:>8.2f}{r['load_s']:>8.2f}"
                     f"{r['peak_rss_mb']:>9.0f}")
    for r in results:
        lines.append(f"  {r['assignment']}: {r['params']:,} params; Muon weight shapes {r['banks']}; step times (ms) "
                     f"{r['step_ms_all']}; resumed at step {r['resumed_at']}; rows spectral "
                     f"{r['spectral_rows']}, attention {r['attention_rows']}; final val loss {r['final_val']:.4f}")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--bias", action="store_true", help="biases in Linear/LayerNorm (the released code has none)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4, help="training steps per assignment")
    ap.add_argument("--resume-at", type=int, default=2, help="step of the checkpoint the second leg resumes from")
    ap.add_argument("--eval-iters", type=int, default=1)
    ap.add_argument("--dual-steps", type=int, default=20, help="dual-ascent steps (the paper's 20)")
    ap.add_argument("--data", choices=["prepared", "random"], default="prepared",
                    help="prepared: the ci config's corpus with the full GPT-2 vocabulary, via mwm.data; "
                         "random: uniform random ids")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--assignments", nargs="+", default=ASSIGNMENTS, choices=ASSIGNMENTS)
    ap.add_argument("--workdir", default=None, help="folder for data/ and results (default: a temp folder)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: one assignment, JSON out
    args = ap.parse_args(argv)
    if not 1 <= args.resume_at < args.steps:
        ap.error(f"--resume-at must be in 1..{args.steps - 1} (got {args.resume_at})")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_fullsize-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # dataset_dir and results are relative to the working folder
    if args.one:
        result = json.dumps(run_one(args, args.one, work / "results"))
        (work / f"bench_fullsize-{args.one}.json").write_text(result + "\n")  # kept if the parent is stopped
        print("RESULT " + result, flush=True)
        return 0
    if args.data == "prepared":  # once, before the children
        _data(args, make_config(args))
    results = []
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for assignment in args.assignments:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, *passthrough, "--workdir", str(work), "--one", assignment],
                              capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{assignment} failed (exit {proc.returncode})")
        results.append(json.loads(line[-1][7:]))
        print(f"{assignment}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(_table(results, args))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
