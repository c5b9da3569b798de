"""Benchmark: msign precision. Prints, measured in the same run,

1. msign time per call for true bfloat16 tensors (``native``), the float32
   emulation of a bf16 GEMM (``emulated``, what ``precision="bfloat16"`` runs) and
   the float32 iteration (``float32``), with the emulation's distance from true
   bf16 and each one's distance from the exact polar factor;
2. ms per training step of the CPU mini config (default config's model) with
   ``msign_precision`` float32 and bfloat16, interleaved, for two assignments.

    python benchmarks/bench_precision.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mwm.optim.assignments import OptimizerSettings, build_optimizers
from mwm.train.model import GPT, GPTConfig
from mwm.optim.solvers import SolverSettings
from mwm.optim.msign import msign, msign_bf16, polar_exact
from mwm.optim.vocab import PAPER_TRAIN

from bench_core import step_times


def _time(f, reps):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


def bench_msign(shapes, reps):
    print("shape            native ms  emulated ms  float32 ms | emul-vs-native  native-vs-exact  emul-vs-exact  "
          "fp32-vs-exact (relative Frobenius)")
    for shape in shapes:
        G = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        ex = polar_exact(G)
        nat, emu, f32 = msign_bf16(G, native=True), msign_bf16(G), msign(G, method="direct")
        emu_cpu = msign_bf16(G, scalars="bfloat16")

        def rel(a, b):
            return float((a - b).norm() / b.norm())

        tn = _time(lambda: msign_bf16(G, native=True), reps)
        te = _time(lambda: msign_bf16(G), reps)
        tf = _time(lambda: msign(G, method="direct"), reps)
        print(f"{str(tuple(shape)):<16} {tn:9.2f}  {te:11.2f}  {tf:10.2f} | {rel(emu_cpu, nat):.2e} (cpu scalars) "
              f"{rel(emu, nat):.2e} (gpu scalars)  {rel(nat, ex):.2e}  {rel(emu, ex):.2e}  {rel(f32, ex):.2e}")


def bench_train(args):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.block + 1), generator=g)
    setups = {}
    for assignment in ("stiefel", "hetero"):
        for prec in ("float32", "bfloat16"):
            torch.manual_seed(0)
            model = GPT(GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers,
                                  n_head=args.heads, n_embd=args.embd))
            settings = OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=20, alpha=0.1, precision=prec))
            opts = build_optimizers(model, assignment, settings)
            opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
            setups[(assignment, prec)] = (model, opts)
    times = step_times(setups, x, args.warmup, args.steps)
    for a in ("stiefel", "hetero"):
        f, b = statistics.median(times[(a, "float32")]), statistics.median(times[(a, "bfloat16")])
        print(f"train step {a:<8} float32 {f * 1e3:7.1f} ms  bfloat16 {b * 1e3:7.1f} ms  ratio {b / f:.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=2049)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_msign([(8, 64, 64), (16, 192, 64), (16, 256, 64), (4, 256, 256)], args.reps)
    bench_train(args)


if __name__ == "__main__":
    main()
