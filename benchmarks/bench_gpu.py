"""GPU check: the paper's model and batch, bf16, the five assignments, in a few minutes.

For when a GPU is lent. On one device, through the package's own training step
(``mwm.train.Run.train_step`` on random token ids, nothing read from disk but the
config), for each assignment: ``--warmup`` untimed steps, then up to ``--steps``
timed ones; printed: ms per step, its ratio to ``none`` (measured in the same run)
beside the paper's H100 figures (Stiefel 5.8x, hetero 8.3x, DGram 13.6x), the
optimizer's share of the step, peak memory, and the agreement of one Manifold Muon
update computed with msign in bfloat16 (the released code's precision,
``precision="bfloat16"``: native on a GPU, emulated on CPU) against the float32 control,
on the weights and momentum captured at the last step and at the peak Muon learning rate.

The model and batch come from ``--config`` (default config/paper.yaml: GPT-2 small,
block 1024, vocab 50304, batch 64); ``--layers/--embd/--heads/--block/--vocab/--batch``
shrink them (a tiny CPU run: ``--device cpu --layers 2 --embd 64 ...``). If a step runs
out of GPU memory the micro-batch is halved and gradient accumulation doubled (the
same tokens per step). ``--budget-s`` (default 450) caps the whole run: each
assignment's timed steps are cut to fit its share of what is left.

    python benchmarks/bench_gpu.py                      # on a GPU node, ~5-8 min
    python benchmarks/bench_gpu.py --device cpu --layers 2 --embd 64 --heads 2 --block 64 \\
        --vocab 512 --batch 2 --steps 3 --warmup 1 --dual-steps 3
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
ASSIGNMENTS = ["none", "stiefel", "dgram", "hetero", "hetero-inv"]
#: ms/step relative to none on an H100, as the paper reports them
PAPER_RATIO = {"stiefel": 5.8, "hetero": 8.3, "dgram": 13.6}


def make_config(args, micro_batch: int, accum: int) -> dict:
    from mwm.config import load_config

    over = {"train.device": args.device, "train.dtype": args.dtype, "train.batch_size": micro_batch,
            "train.grad_accum": accum, "train.compile": False, "train.capture_pairs_step": None,
            "train.eval_iters": 1, "train.probe_batch": 1, "train.log_interval": 10 ** 9, "grid.seeds": [0]}
    if args.dual_steps is not None:
        over["train.dual_ascent_steps"] = args.dual_steps
    shape = {"model.n_layer": args.layers, "model.n_embd": args.embd, "model.n_head": args.heads}
    if any(v is not None for v in shape.values()):
        over["model.size"] = None
        base = load_config(args.config)["model"]
        from mwm.model import SIZES

        named = SIZES.get(base["size"], {}) if base["size"] else {}
        for key, value in shape.items():
            over[key] = value if value is not None else named.get(key.split(".")[1], base[key.split(".")[1]])
    if args.block is not None:
        over["model.block_size"] = args.block
    if args.vocab is not None:
        over["model.vocab_size"] = args.vocab
    return load_config(args.config, [f"{k}={json.dumps(v)}" for k, v in over.items()])


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def agreement(captured: dict, cfg: dict, lr: float, device) -> dict:
    """One update per captured (W, U): the released bfloat16 msign against the float32 control.

    Both go through the package's own ``msign`` / ``manifold_muon_update`` with
    ``precision="bfloat16"`` (native bf16 on a GPU, the float32 emulation on CPU) and
    ``precision="float32"``. Returns the worst and median relative Frobenius difference
    of the weight change, over the matrices.
    """
    from mwm.dual_ascent import manifold_muon_update
    from mwm.msign import msign

    tc = cfg["train"]
    diffs = {}
    for name, (manifold, W, U) in sorted(captured.items()):
        W, U = W.float().to(device), U.float().to(device)
        out = {}
        for prec in ("float32", "bfloat16"):
            if manifold == "none":
                new = W - lr * msign(U, steps=tc["msign_steps"], precision=prec)
            else:
                new = manifold_muon_update(W, U, manifold, lr, alpha=tc["dual_ascent_alpha"],
                                           steps=tc["dual_ascent_steps"], msign_steps=tc["msign_steps"],
                                           dgram_retraction=tc["dgram_retraction"], precision=prec)
            out[prec] = new.float() - W
        ref = out["float32"]
        diffs[name] = float((out["bfloat16"] - ref).norm() / ref.norm().clamp_min(1e-30))
    vals = sorted(diffs.values())
    worst = max(diffs, key=diffs.get) if diffs else None
    return {"low": "bfloat16", "matrices": len(vals),
            "max_rel_diff": vals[-1] if vals else math.nan, "median_rel_diff": statistics.median(vals) if vals else math.nan,
            "worst": worst}


def bench_assignment(args, assignment: str, budget_s: float, out: Path) -> dict:
    import torch

    import mwm.train as T
    from bench_fullsize import RandomTokens

    batch, accum = load_batch(args) if args.batch is None else (args.batch, 1)
    cfg0 = make_config(args, batch, accum)
    # the model's vocabulary (50304 for the paper: GPT-2's 50257 ids, padded); random ids below 50257
    vocab = cfg0["model"]["vocab_size"] or 50257
    data = RandomTokens(min(vocab, 50257), max(1_000_000, 4 * (cfg0["model"]["block_size"] + 2)))
    resolve = T.resolve_data
    T.resolve_data = lambda cfg: data
    t_start = time.perf_counter()
    try:
        while True:
            cfg = make_config(args, batch, accum)
            run = T.Run(cfg, assignment, 0, cfg["train"]["dgram_retraction"], out)
            run.open_logs(0)
            if run.device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(run.device)
            try:
                run.train_step()
                run.step += 1
                break
            except torch.cuda.OutOfMemoryError:
                if batch == 1:
                    raise
                del run
                torch.cuda.empty_cache()
                batch, accum = batch // 2, accum * 2
                print(f"  {assignment}: out of memory; micro-batch {batch} x grad_accum {accum}", flush=True)
        for _ in range(args.warmup - 1):
            run.train_step()
            run.step += 1
        warm = run.step_times[1:] or run.step_times
        est = statistics.median(warm)
        left = budget_s - (time.perf_counter() - t_start) - 2 * est  # the capture step and the agreement check
        steps = max(1, min(args.steps, int(left / est))) if left > 0 else 1
        n0 = len(run.step_times)
        captured, opts_step = {}, run.opts.step
        for i in range(steps):
            if i == steps - 1 and run.opts.muon is not None:  # the last step also returns its Muon inputs
                run.opts.step = lambda inputs=False: captured.update(opts_step(inputs=True))
            run.train_step()
            run.step += 1
        run.opts.step = opts_step
        _sync(run.device)
        times, shares = run.step_times[n0:], run.opt_shares[n0:]
        peak = (torch.cuda.max_memory_allocated(run.device) / 2 ** 30 if run.device.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20)
        # at the peak Muon learning rate (the last step's is still in warm-up)
        agree = agreement(captured, cfg, cfg["train"]["muon_lr"], run.device) if captured else None
        res = {"assignment": assignment, "params": run.model.num_params(), "micro_batch": batch, "grad_accum": accum,
               "tokens_per_step": batch * accum * run.mcfg.block_size, "timed_steps": len(times),
               "ms_per_step": 1e3 * statistics.median(times), "ms_min": 1e3 * min(times),
               "opt_share": statistics.median(shares), "peak_gib": peak, "agreement": agree,
               "wall_s": time.perf_counter() - t_start, "device": str(run.device),
               "dtype": cfg["train"]["dtype"]}
        del run
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return res
    finally:
        T.resolve_data = resolve


def load_batch(args) -> tuple[int, int]:
    """The config's (batch_size, grad_accum), or --batch with accumulation 1."""
    from mwm.config import load_config

    tc = load_config(args.config)["train"]
    return tc["batch_size"], tc["grad_accum"]


def table(results: list[dict], args) -> str:
    base = next((r["ms_per_step"] for r in results if r["assignment"] == "none"), None)
    r0 = results[0]
    lines = [f"device {r0['device']} ({_device_name(r0['device'])}), dtype {r0['dtype']}, {r0['params']:,} params, "
             f"{r0['tokens_per_step']:,} tokens/step",
             f"{'assignment':<11}{'batch':>10}{'steps':>6}{'ms/step':>10}{'x none':>8}{'paper H100':>11}"
             f"{'opt %':>7}{'peak':>9}  msign {results[0]['agreement']['low'] if any(r['agreement'] for r in results) else '-'}"
             f" vs float32 (one update, rel. Frobenius diff: max / median)"]
    for r in results:
        ratio = f"{r['ms_per_step'] / base:.2f}x" if base else "-"
        paper = f"{PAPER_RATIO[r['assignment']]}x" if r["assignment"] in PAPER_RATIO else "-"
        unit = "GiB"
        ag = r["agreement"]
        agtxt = (f"{ag['max_rel_diff']:.2e} / {ag['median_rel_diff']:.2e} ({ag['matrices']} matrices, worst "
                 f"{ag['worst']})") if ag else "-"
        lines.append(f"{r['assignment']:<11}{str(r['micro_batch']) + 'x' + str(r['grad_accum']):>10}"
                     f"{r['timed_steps']:>6}{r['ms_per_step']:>10.1f}{ratio:>8}{paper:>11}"
                     f"{100 * r['opt_share']:>7.1f}{r['peak_gib']:>6.2f} {unit}  {agtxt}")
    return "\n".join(lines)


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return platform.processor() or platform.machine()


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "config" / "paper.yaml"), help="model, batch and optimizer settings")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                    help="default: bfloat16 autocast on a GPU, float32 on CPU")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per assignment (fewer if the budget says)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one also finds the batch)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock cap of the whole run in seconds")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--embd", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="micro-batch (default: the config's batch_size)")
    ap.add_argument("--dual-steps", type=int, default=None, help="default: the config's dual_ascent_steps")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--assignments", nargs="+", default=ASSIGNMENTS, choices=ASSIGNMENTS)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1")
    return args


def run(args) -> list[dict]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --device cpu (and a tiny model) to test the script")
        # no TF32 switch here: mwm.train does not set one, and this measures its step as it is
    t0 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        for i, assignment in enumerate(args.assignments):
            left = args.budget_s - (time.perf_counter() - t0)
            share = left / (len(args.assignments) - i)
            r = bench_assignment(args, assignment, share, Path(tmp))
            results.append(r)
            print(f"{assignment}: {r['timed_steps']} timed steps, {r['ms_per_step']:.1f} ms/step, "
                  f"{r['wall_s']:.0f} s", flush=True)
    return results


def main(argv=None) -> int:
    args = parse(argv)
    results = run(args)
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
