"""Benchmark: faster inner solvers at the paper's accuracy.

Prints, each measured in this run against its baseline:

1. on (W, momentum) sequences captured in training (``--sequence RUN_DIR ...`` with a
   ``sequence/`` folder, or captured now by a short training of ``--config``'s model,
   ``studies.solvers``): e_W / e_A of each candidate against a cold
   ``reference_iterations`` dual ascent, its cost in msign-equivalents and wall time
   relative to the paper's cold 20-step dual ascent, and whether the cheapest
   candidate that matches the paper's e_W (mean and worst step) costs <= 1/2;
2. step time of hetero / hetero-inv against the single-manifold assignments and
   against hetero with its banks forced apart per manifold, on the mini model;
3. the manifold update on GPT-2 small's shapes relative to a plain Muon update, with
   the paper's solver and with the chosen fast one (warm-started after a few steps of
   slowly varying synthetic gradients).

    python benchmarks/bench_solver.py --config config/config.yaml --sequence RUN_DIR [RUN_DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from mwm.optim.assignments import OptimizerSettings, build_optimizers
from mwm.config import load_config
from mwm.train.model import GPT, GPTConfig
from mwm.optim.muon import ManifoldMuon
from mwm.optim.solvers import SolverSettings
from mwm.studies.solvers import (candidates, capture_sequences, load_sequence, measure_sequence, parse_candidate,
                                 summarise)
from mwm.optim.vocab import PAPER_TRAIN

from bench_core import make_problem, muon_groups, step_times


def part_sequences(args, cfg):
    sec = cfg["studies"]["solvers"]
    base = parse_candidate(f"da-cold-T{sec['baseline_steps']}")
    cands = [base] + ([parse_candidate(c) for c in args.candidates.split(",")] if args.candidates
                      else candidates(sec)[1:])
    runs = [Path(s) for s in args.sequence] if args.sequence else capture_sequences(
        cfg, sec, Path(args.work) / "_train", log=lambda *a: None)
    rows = []
    for run in runs:
        seq = load_sequence(run)[: args.max_steps]
        print(f"  {run}: {len(seq)} consecutive steps ({seq[0]['step']}..{seq[-1]['step']})")
        rows.extend(measure_sequence(seq, cands, sec, cfg["train"]["dgram_retraction"], torch.device("cpu"),
                                     log=lambda *a: None))
    summary, derived = summarise(rows, base["name"])
    print(f"\n{'manifold':<8} {'candidate':<28} {'e_W':>9} {'worst':>9} {'e_A':>8} {'msign':>6} {'x base':>7} "
          f"{'wall x':>7}  match")
    for r in summary:
        print(f"{r[6]:<8} {r[0]:<28} {r[8]:>9.2e} {r[11]:>9.2e} {r[9]:>8.3f} {r[13]:>6.1f} {r[15]:>7.2f} "
              f"{r[16]:>7.2f}  {'yes' if r[17] else 'no'}")
    print()
    for man, e in derived["by_manifold"].items():
        best = e["cheapest_matching"]
        if best is None:
            print(f"{man}: no candidate matches the paper's e_W {e['baseline_e_W']:.2e} "
                  f"(worst step {e['baseline_e_W_worst_step']:.2e}); target NOT met")
        else:
            print(f"{man}: paper's e_W {e['baseline_e_W']:.2e} at {e['baseline_msign_eq']:.0f} msign; cheapest "
                  f"matching {best['candidate']} e_W {best['e_W']:.2e}: {best['msign_ratio']:.2f}x msign, "
                  f"{best['wall_ratio']:.2f}x wall -> target <= 0.5x {'MET' if best['half_cost_met'] else 'NOT met'}")
    return derived


def _mini(args, assignment, solver, separate=False):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers_mini, n_head=4,
                          n_embd=args.embd))
    opts = build_optimizers(model, assignment, OptimizerSettings.defaults(solver=_settings(solver)))
    opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
    if separate:  # one bank per manifold, the unmerged layout (a distinct group key keeps them apart)
        for g in opts.muon.param_groups:
            g["bank_tag"] = g["manifold"]
    return model, opts


def _settings(c):
    return SolverSettings.defaults(solver=c["solver"], steps=c["steps"], warm_start=c["warm"], tol=c["tol"],
                                   rho=c["rho"] or 1.0)


def part_hetero(args, base):
    configs = [(a, False) for a in ("none", "stiefel", "dgram", "hetero", "hetero-inv")] + [("hetero", True)]
    setups = {c: _mini(args, c[0], base, separate=c[1]) for c in configs}
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.block + 1), generator=g)
    times = step_times(setups, x, args.warmup, args.steps)
    med = {c: statistics.median(v) for c, v in times.items()}
    for c in configs:
        label = c[0] + (" (banks per manifold)" if c[1] else "")
        print(f"  {label:<22} {1e3 * med[c]:8.1f} ms/step  {med[c] / med[('none', False)]:5.2f}x none")
    slower = max(med[("stiefel", False)], med[("dgram", False)])
    for a in ("hetero", "hetero-inv"):
        print(f"  {a} / slower single-manifold: {med[(a, False)] / slower:.2f} (target <= 1)")
    print(f"  hetero / hetero with banks forced per manifold: {med[('hetero', False)] / med[('hetero', True)]:.2f} "
          "(1 where no equal-height banks of both manifolds exist; else the merge's gain)")


def part_gpt2(args, solvers):
    def opt_for(assignment, solver):
        names, weights, grads, mfs = make_problem(args.layers, assignment)
        params, groups = muon_groups(names, weights, mfs)
        opt = ManifoldMuon(groups, lr=0.02, init_on_manifold=False, solver=_settings(solver))
        return opt, params, grads

    gen = torch.Generator().manual_seed(3)
    res = {}
    plan = [("none", solvers[0])] + [(a, s) for a in args.gpt2_assignments.split(",") for s in solvers]
    for assignment, solver in plan:
        opt, params, grads = opt_for(assignment, solver)
        samples = []
        for k in range(args.gpt2_warm + args.gpt2_steps):
            for p, g in zip(params, grads):  # slowly varying gradients: a momentum-like sequence
                p.grad = g + 0.3 * g.std() * torch.randn(g.shape, generator=gen)
            t0 = time.perf_counter()
            opt.step()
            if k >= args.gpt2_warm:
                samples.append(time.perf_counter() - t0)
        res[assignment, solver["name"]] = min(samples)
    none = res["none", solvers[0]["name"]]
    print(f"  {'none (plain Muon)':<34} {none:8.3f} s")
    for (a, s), t in res.items():
        if a != "none":
            print(f"  {a + ' ' + s:<34} {t:8.3f} s  {t / none:6.1f}x plain Muon")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--sequence", nargs="+", default=None, help="run folders with sequence/ (else capture now)")
    ap.add_argument("--work", default="results/bench_solver", help="folder for capture trainings")
    ap.add_argument("--max-steps", type=int, default=None, help="use the first N captured steps of each run")
    ap.add_argument("--candidates", default=None,
                    help="comma-separated candidate names (default: the config's studies.solvers grid)")
    ap.add_argument("--fast", default=None,
                    help="the fast solver for parts 2-3 (default: the cheapest matching one of part 1, per Stiefel)")
    ap.add_argument("--layers", type=int, default=1, help="GPT-2 small blocks in part 3")
    ap.add_argument("--gpt2-assignments", default="stiefel,dgram,hetero", help="assignments timed in part 3")
    ap.add_argument("--gpt2-warm", type=int, default=2)
    ap.add_argument("--gpt2-steps", type=int, default=1)
    ap.add_argument("--layers-mini", type=int, default=4)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip (1,2,3)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("overrides", nargs="*", help="config overrides, dotted.key=value")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    skip = set(args.skip.split(",")) - {""}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    base = parse_candidate(f"da-cold-T{cfg['studies']['solvers']['baseline_steps']}")
    fast = parse_candidate(args.fast) if args.fast else None
    if "1" not in skip:
        print("\n== 1. in-training sequences: accuracy vs cost (baseline: the paper's cold dual ascent) ==")
        derived = part_sequences(args, cfg)
        if fast is None:
            picks = [e["cheapest_matching"]["candidate"] for e in derived["by_manifold"].values()
                     if e["cheapest_matching"]]
            fast = parse_candidate(picks[0]) if picks else None
    if "2" not in skip:
        print(f"\n== 2. step time on the mini model ({base['name']}), median of {args.steps} interleaved steps ==")
        part_hetero(args, base)
    if "3" not in skip:
        solvers = [base] + ([fast] if fast is not None else [])
        print(f"\n== 3. optimizer step on GPT-2 small's shapes ({args.layers} block(s)), fastest of "
              f"{args.gpt2_steps} after {args.gpt2_warm} warm-up steps ==")
        part_gpt2(args, solvers)
        print("  (stretch target: the fast manifold update within 5x a plain Muon update)")


if __name__ == "__main__":
    main()
