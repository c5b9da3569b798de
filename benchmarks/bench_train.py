"""Benchmark: ms per training step of the CPU mini config for the five assignments.

Same model, data and hyperparameters; the Muon part of the step either goes
through this project's batched optimizer or through the released code's
per-matrix loop (``released_path.ReleasedMuon``), measured in the same run.

    python benchmarks/bench_train.py --layers 4 --embd 64 --vocab 4096 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mwm.optim.assignments import OptimizerSettings, build_optimizers
from mwm.train.model import GPT, GPTConfig
from mwm.config.names import PAPER_ASSIGNMENTS
from mwm.optim.solvers import SolverSettings
from mwm.optim.vocab import PAPER_TRAIN

from released_path import ReleasedMuon


def build(args, assignment, path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                          n_embd=args.embd))
    opts = build_optimizers(model, assignment, OptimizerSettings.defaults(
        solver=SolverSettings.defaults(steps=args.dual_steps, alpha=0.1)))
    opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
    if path == "released" and opts.muon is not None:
        groups = [{"params": g["params"], "manifold": g["manifold"], "weight_decay": g["weight_decay"]}
                  for g in opts.muon.param_groups]
        opts.muon = ReleasedMuon(groups, lr=0.02, alpha=0.1, steps=args.dual_steps)
    return model, opts


def time_all(args, configs):
    """Median step time and optimizer share of each (assignment, path), measured in
    interleaved rounds (one step of every configuration per round), so a change in
    machine load during the run hits every configuration alike."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.block + 1), generator=g)
    setups = {c: build(args, *c) for c in configs}
    step_t = {c: [] for c in configs}
    opt_t = {c: [] for c in configs}
    for i in range(args.warmup + args.steps):
        for c in configs:
            model, opts = setups[c]
            t0 = time.perf_counter()
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            t1 = time.perf_counter()
            opts.step()
            opts.zero_grad()
            t2 = time.perf_counter()
            if i >= args.warmup:
                step_t[c].append(t2 - t0)
                opt_t[c].append(t2 - t1)
    return {c: (statistics.median(step_t[c]), statistics.median(opt_t[c]) / statistics.median(step_t[c]))
            for c in configs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dual-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; L{args.layers} n_embd {args.embd} "
          f"vocab {args.vocab} batch {args.batch}x{args.block}, dual ascent {args.dual_steps} steps; "
          f"median of {args.steps} steps")
    res = time_all(args, [(a, path) for a in PAPER_ASSIGNMENTS for path in ("ours", "released")])
    print(f"\n{'assignment':<11} {'ours ms':>8} {'opt share':>9} {'x none':>7} | {'released ms':>11} "
          f"{'opt share':>9} {'x none':>7} | {'speedup':>7}")
    for a in PAPER_ASSIGNMENTS:
        (o, os_), (r, rs) = res[a, "ours"], res[a, "released"]
        print(f"{a:<11} {1e3 * o:>8.1f} {100 * os_:>8.0f}% {o / res['none', 'ours'][0]:>6.2f}x | "
              f"{1e3 * r:>11.1f} {100 * rs:>8.0f}% {r / res['none', 'released'][0]:>6.2f}x | {r / o:>6.2f}x")
    worst = max(res[a, "ours"][0] / res["none", "ours"][0] for a in PAPER_ASSIGNMENTS[1:])
    print(f"\nworst manifold assignment / none (ours): {worst:.2f}x (target <= 2x; "
          f"released path: "
          f"{max(res[a, 'released'][0] / res['none', 'released'][0] for a in PAPER_ASSIGNMENTS[1:]):.2f}x)")


if __name__ == "__main__":
    main()
