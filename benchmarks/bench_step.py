"""Where a training step of a config goes: forward+backward, optimizer, evaluation, per op.

For each assignment, one ``mwm.train.loop.Run`` of the config (its model, data, optimizer
settings) runs ``--steps`` training steps after a warm-up, then one evaluation; it prints

* per step: forward+backward and optimizer milliseconds (medians), the optimizer's share;
* per evaluation: the loss batches, the spectral logging (SVDs) and the attention logging,
  and the evaluation's share of the run (``max_iters / eval_interval + 1`` evaluations);
* the optimizer's ops over the measured steps (torch.profiler: calls per step, ms per step,
  share), and its banks: matrices, real and padded rows, the msign order, and the share
  of the optimizer's matmul FLOPs spent on zero padding (``bench_gpu.update_flops``, in the
  msign order each bank runs).

Times are of this process on this machine: compare assignments within one run, never
across machines (``farm-bench`` pairs two whole commands).

    python benchmarks/bench_step.py --config config/config.yaml --assignments stiefel,hetero
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from mwm.config import ConfigError, load_config
from mwm.train.diagnostics import attention_stats, spectral_stats
from mwm.optim.msign import choose_order
from mwm.optim.manifolds import to_tall
from mwm.plan.runs import run_config
from mwm.train.loop import Run
from mwm.train.schedule import learning_rates

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import update_flops  # noqa: E402  (one FLOP model for the benchmarks)


def banks_report(run: Run) -> list[str]:
    muon = run.opts.muon
    if muon is None:
        return ["  (no Muon matrices)"]
    lines, waste, total = [], 0.0, 0.0
    for entries in muon._plan():  # the optimizer's own banks (private: a benchmark may look inside)
        group = entries[0][0]
        kinds = {g["manifold"] for g, _ in entries}
        kind = kinds.pop() if len(kinds) == 1 else "mixed"
        shapes = [tuple(to_tall(p)[0].shape) for _, p in entries]
        m_pad, n = max(m for m, _ in shapes), shapes[0][1]
        order = choose_order(m_pad, n) if group["msign_precision"] == "float32" else "direct"

        def flops(m, manifold):  # a mixed bank: each matrix with its own manifold's retraction
            return update_flops(m, n, manifold, group["solver"], group["dual_steps"], group["msign_steps"], order)

        real = sum(flops(m, g["manifold"]) for (g, _), (m, _) in zip(entries, shapes))
        padded = sum(flops(m_pad, g["manifold"]) for g, _ in entries)
        waste += padded - real
        total += padded
        lines.append(f"  bank {kind:<8} {len(shapes):>2} x {m_pad}x{n} ({order}): "
                     f"rows real {sum(m for m, _ in shapes)}, "
                     f"padded {len(shapes) * m_pad}; {padded / 1e9:.3g} GFLOP a step, "
                     f"{100 * (padded - real) / padded:.0f}% on padding")
    lines.append(f"  optimizer matmuls: {total / 1e9:.3g} GFLOP a step, {100 * waste / max(total, 1):.1f}% on padding")
    return lines


def measure(cfg: dict, assignment: str, steps: int, warmup: int, out: Path, data=None) -> list[str]:
    """``data``: the run's token dataset (None: the config's prepared one)."""
    cfg = run_config(cfg, assignment)  # its grid.train_overrides (hetero-admm's solver), as mwm.train does
    run = Run(cfg, assignment, 0, cfg["train"]["dgram_retraction"], out, data=data)
    run.open_logs(0)
    fb, opt = [], []
    for i in range(warmup + steps):
        run.step = i
        run.opts.set_lr(*learning_rates(i, run.tc))  # as training does, outside the timed span
        t0 = time.perf_counter()
        run.forward_backward(i)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.tc["grad_clip"] or 1.0)
        t1 = time.perf_counter()
        run.opts.step()
        run.opts.zero_grad()
        t2 = time.perf_counter()
        if i >= warmup:
            fb.append(t1 - t0)
            opt.append(t2 - t1)
    run.forward_backward(warmup + steps)  # gradients again: the banks are planned from them
    banks = banks_report(run)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):  # the optimizer alone, on these gradients
            run.opts.step()
    run.opts.zero_grad()
    t0 = time.perf_counter()
    run.batches.losses(run.model, run.autocast)
    t1 = time.perf_counter()
    spectral_stats(run.model, run.opts.assignment, 0)
    t2 = time.perf_counter()
    attention_stats(run.model, run.batches.probe, 0)
    t3 = time.perf_counter()
    f, o = statistics.median(fb), statistics.median(opt)
    tc = run.tc
    evals = tc["max_iters"] // tc["eval_interval"] + 1
    ev = t3 - t0
    share_eval = evals * ev / (evals * ev + tc["max_iters"] * (f + o))
    lines = [f"{assignment}: fwd+bwd {1e3 * f:.1f} ms, optimizer {1e3 * o:.1f} ms "
             f"({100 * o / (f + o):.0f}% of the step); "
             f"evaluation {1e3 * ev:.0f} ms (losses {1e3 * (t1 - t0):.0f}, spectral {1e3 * (t2 - t1):.0f}, "
             f"attention {1e3 * (t3 - t2):.0f}) x {evals} = {100 * share_eval:.1f}% of the run"]
    if run.opts.muon is not None:
        per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for ev_ in prof.key_averages():
            per[ev_.key][0] += ev_.count
            per[ev_.key][1] += ev_.self_cpu_time_total / 1e3
        tot = sum(v[1] for v in per.values())
        lines.append(f"  optimizer ops over {steps} steps (self CPU time, top 8 of {len(per)}):")
        for key, (count, ms) in sorted(per.items(), key=lambda kv: -kv[1][1])[:8]:
            lines.append(f"    {key[:44]:<44} {count / steps:>7.0f} calls/step {ms / steps:>8.1f} ms/step "
                         f"{100 * ms / tot:>5.1f}%")
    lines += banks
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--assignments", default="none,stiefel,dgram,hetero",
                    help="comma-separated grid assignments (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, as a train job)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    print(f"torch {torch.__version__}, {args.threads} thread(s); config {cfg['name']} ({args.config}); "
          f"median of {args.steps} steps after {args.warmup}")
    with tempfile.TemporaryDirectory() as tmp:
        for a in args.assignments.split(","):
            try:
                print("\n".join(measure(cfg, a, args.steps, args.warmup, Path(tmp))), flush=True)
            except ConfigError as exc:  # no data yet, an unknown assignment: one line, not a traceback
                print(f"error: {exc}", file=sys.stderr)
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
