"""GPU check: the paper's model and batch, bf16, every assignment, in a few minutes.

For when a GPU is lent (``scripts/gpu_check.sh`` runs it). First, with no model, the DGram
retraction of the model's banks (``n_layer`` matrices of each hidden shape) in each form: the
released float32 SVD, and this code's with each polar solve (``train.dgram_polar``: ``eigh``,
the default, and the batched ``newton-schulz``), timed, with each one's error against a float64
SVD and which solve is the faster at the default's accuracy. Then, on one device, through the
package's own training step (``mwm.train.loop.Run.train_step`` on random token ids, nothing
read from disk but the config), one row per assignment, in the order of :data:`ASSIGNMENTS`
(by value: dgram and hetero first, none last but never cut): ``--warmup`` untimed steps, then
up to ``--steps`` timed ones. Printed per row:

- ms per step and its ratio to ``none`` (measured in the same process) beside the
  paper's H100 figures (Stiefel 5.8x, hetero 8.3x, DGram 13.6x) and this project's
  goal (at most half of those; the ADMM row at most 1.5x none);
- the optimizer's share of the step, peak memory, host-device syncs per step
  (:class:`mwm.measure.syncs.SyncCounter`: exact on CUDA, a proxy on CPU);
- the optimizer's matmul FLOPs per step, counted from the Muon matrices' shapes and
  the solver's iterations (:func:`optimizer_flops`), and the TFLOP/s they achieve in
  the optimizer's time, against the GPU's bf16 dense peak;
- the agreement of one Manifold Muon update with msign in bfloat16 (the released
  precision: native on a GPU, emulated on CPU) against the float32 control;
- with ``train.compile``: the compiled forward's loss against eager on the row's own model
  before its first step (:data:`COMPILE_TOL`; a disagreement fails the bench), and the compile's
  seconds (cold in the first row; dynamo is reset between rows, so none recompiles past its limit).

The rows: the five assignments and ``hetero-admm``, hetero with the ADMM inner solver
at the settings the solver study chose for GPT-2 small's shapes (:data:`ADMM_ROW`).
For one assignment (``--exercise``, default hetero) it also times ``evaluate`` (with
spectral and attention logging), ``save_checkpoint`` and a new ``Run``'s
``try_resume``, then trains one more step from the resumed state: the paths a
training job takes besides the step.

The model, batch and speed settings (``train.compile``, ``train.tf32``, dtype, msign
precision) come from ``--config`` (default config/paper.yaml: GPT-2 small, block 1024,
vocab 50304, batch 64, compile and TF32 on as the released train.py); the header
prints them. ``--layers/--embd/--heads/--block/--vocab/--batch`` shrink the model (a
tiny CPU run: ``--device cpu --layers 2 --embd 64 ... --no-compile``). A step that
runs out of GPU memory (PyTorch's OutOfMemoryError, or a cuBLAS/cuSOLVER allocation
failure) halves the micro-batch and doubles gradient accumulation (the same tokens
per step) and starts that assignment again. ``--budget-s`` (default 420) caps the
whole run (:func:`plan_next`, :func:`row_budget`): a row starts only when it and ``none`` fit,
a row takes its steps from what is left less ``none``'s share, and the rows cut are named with
the reason. With ``--json`` the results are written after every row, so a time-out keeps what
was measured.

    python benchmarks/bench_gpu.py --json out.json             # on a GPU node, ~5-7 min
    python benchmarks/bench_gpu.py --device cpu --layers 2 --embd 64 --heads 2 --block 64 \\
        --vocab 512 --batch 2 --steps 3 --warmup 1 --dual-steps 3 --no-compile
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
#: The rows in the order they run: by what they are for. DGram and hetero carry the paper's overhead
#: claims (13.6x, 8.3x) and this project's goal; ``none`` is every ratio's base, so it runs last but
#: is never cut (:func:`plan_next`): a row starts only when it and ``none`` both fit in what is left.
ASSIGNMENTS = ["dgram", "hetero", "hetero-admm", "stiefel", "hetero-inv", "none"]
#: A warm compile (the inductor's caches filled by the first compiled row) is taken as this share of
#: the cold one until a second row has measured its own: a scheduling guess, not a result.
WARM_COMPILE_SHARE = 0.25
#: The share of the budget kept for ``none`` before a row has measured a fixed cost: a warm compile
#: and its cheap steps (a guess for the first row only, then :func:`next_fixed` replaces it).
NONE_RESERVE = 0.1
#: The retraction row's share of the budget (it runs first, on banks, with no model).
RETRACTION_SHARE = 0.12
#: compiled against eager forward loss on the row's own model before training (relative): bfloat16
#: autocast's kernels differ in their roundings, float32's barely
COMPILE_TOL = {"bfloat16": 1e-2, "float32": 1e-4}
#: The ADMM row: hetero with ADMM at what the solver study chose at GPT-2 small's shapes
#: (config/widths.yaml; its table_solvers: 2 iterations, rho 2, warm start matched the
#: paper's e_W for Stiefel at 0.20x the cost).
ADMM_ROW = ("hetero", {"train.solver": "admm", "train.warm_start": True, "train.solver_max_steps": 2,
                       "train.admm_rho": 2.0})
#: ms/step relative to none on an H100, as the paper reports them
PAPER_RATIO = {"stiefel": 5.8, "hetero": 8.3, "dgram": 13.6}
#: this project's goal: at most half the paper's ratio; ADMM at most 1.5x none
GOAL_RATIO = {"stiefel": 2.9, "hetero": 4.2, "dgram": 6.8, "hetero-admm": 1.5}
#: dense bf16 tensor-core peaks (TFLOP/s, the vendor's figures), by a name in the device's
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1}
#: messages of allocation failures that are not torch.cuda.OutOfMemoryError
_OOM_TEXT = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED",
             "CUDNN_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation")


def row_spec(name: str) -> tuple[str, dict]:
    """The training assignment of a row and its config overrides."""
    return ADMM_ROW if name == "hetero-admm" else (name, {})


def make_config(args, micro_batch: int, accum: int, extra: dict | None = None) -> dict:
    from mwm.config import load_config

    over = {"train.device": args.device, "train.dtype": args.dtype, "train.batch_size": micro_batch,
            "train.grad_accum": accum, "train.capture_pairs_step": None,
            "train.eval_iters": 1, "train.probe_batch": 1, "train.log_interval": 10 ** 9, "grid.seeds": [0]}
    if args.compile is not None:
        over["train.compile"] = args.compile
    if args.dual_steps is not None:
        over["train.dual_ascent_steps"] = args.dual_steps
    shape = {"model.n_layer": args.layers, "model.n_embd": args.embd, "model.n_head": args.heads}
    if any(v is not None for v in shape.values()):
        over["model.size"] = None
        base = load_config(args.config)["model"]
        from mwm.train.model import SIZES

        named = SIZES.get(base["size"], {}) if base["size"] else {}
        for key, value in shape.items():
            over[key] = value if value is not None else named.get(key.split(".")[1], base[key.split(".")[1]])
    if args.block is not None:
        over["model.block_size"] = args.block
    if args.vocab is not None:
        over["model.vocab_size"] = args.vocab
    over.update(extra or {})
    return load_config(args.config, [f"{k}={json.dumps(v)}" for k, v in over.items()])


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a GPU allocation failure (OutOfMemoryError, or a RuntimeError
    from cuBLAS/cuSOLVER/cuDNN saying it could not allocate)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OOM_TEXT)


def msign_flops(m: int, n: int, steps: int, order: str = "direct") -> float:
    """Matmul FLOPs of one Polar Express msign of a tall ``m x n`` matrix: in the released
    (direct, wide) order per step ``S = X X^T``, ``S^2``, ``(...) X``; in the package's Gram
    order (:mod:`mwm.optim.msign`) ``X^T X`` twice and ``X Q`` twice (the restart and the end) and
    per step ``b R + c R^2``, ``Q y`` and ``R y y``."""
    if order == "gram":
        return 4 * 2.0 * m * n * n + steps * 4 * 2.0 * n ** 3
    return steps * (4.0 * m * n * n + 2.0 * n ** 3)


def dual_iteration_flops(m: int, n: int, msign_steps: int, order: str = "direct") -> float:
    """Matmul FLOPs of one dual-ascent iteration: direct, one msign with ``W S`` and ``W^T A``;
    Gram (:mod:`mwm.optim.dual_ascent`), ``D S``, ``K^T S``, ``S (D S)`` and ``(W^T M) Q_1`` in n x n,
    ``W S``, ``M Q_1`` and ``X^T X`` in m x n, the Polar Express steps in n x n and ``W^T X Q_2``."""
    prod = 2.0 * m * n * n
    if order == "gram":
        return 3 * prod + (4 + 1) * 2.0 * n ** 3 + msign_steps * 4 * 2.0 * n ** 3 + 2.0 * n ** 3
    return msign_flops(m, n, msign_steps) + 2 * prod


def update_flops(m: int, n: int, manifold: str, solver: str, iterations: int, msign_steps: int,
                 order: str = "direct") -> float:
    """Matmul FLOPs of one matrix's update: plain Muon one msign; Manifold Muon its inner
    solver's iterations (dual ascent: :func:`dual_iteration_flops`; ADMM: two msigns and five
    ``m x n x n`` products) and the retraction (Stiefel: one msign; DGram and Oblique: the
    Gram matrix and one product). ``order``: the msign order, ``direct`` (released) or ``gram``."""
    ms = msign_flops(m, n, msign_steps, order)
    if manifold == "none":
        return ms
    prod = 2.0 * m * n * n
    per_iter = {"dual_ascent": dual_iteration_flops(m, n, msign_steps, order), "admm": 2 * ms + 5 * prod}[solver]
    retract = ms if manifold == "stiefel" else 2 * prod
    return iterations * per_iter + retract


def optimizer_flops(muon) -> float:
    """Matmul FLOPs per step of a :class:`~mwm.optim.muon.ManifoldMuon` (0 without one),
    from its matrices' shapes and each group's solver, iteration cap and msign steps."""
    if muon is None:
        return 0.0
    total = 0.0
    for g in muon.param_groups:
        for p in g["params"]:
            m, n = max(p.shape), min(p.shape)
            total += update_flops(m, n, g["manifold"], g["solver"], g["dual_steps"], g["msign_steps"])
    return total


def agreement(captured: dict, cfg: dict, lr: float, device) -> dict:
    """One update per captured (W, U): the released bfloat16 msign against the float32 control.

    Both go through the package's own ``msign`` / ``manifold_muon_update`` with
    ``precision="bfloat16"`` (native bf16 on a GPU, the float32 emulation on CPU) and
    ``precision="float32"``. Returns the worst and median relative Frobenius difference
    of the weight change, over the matrices.
    """
    from mwm.optim.dual_ascent import manifold_muon_update
    from mwm.optim.msign import msign

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
            "max_rel_diff": vals[-1] if vals else math.nan,
            "median_rel_diff": statistics.median(vals) if vals else math.nan,
            "worst": worst}


def _peak_memory_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _reset_compiler() -> None:
    """Forget the compiled graphs of a row (each row compiles its own model): without it, rows
    pile up recompiles on the one forward code object until dynamo's limit (8) makes the rest run
    eager, silently. The on-disk caches stay, so a later row's compile is warm."""
    import torch

    torch._dynamo.reset()


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def exercise_run_paths(run, cfg, out: Path) -> dict:
    """``evaluate`` (with spectral and attention logging), ``save_checkpoint``, and a new
    ``Run`` on the same folder resuming from it and training one more step: their times,
    and whether the resumed run continued where the first stopped."""
    import torch

    import mwm.train.loop as T

    # evaluate's own spectral_stats call is the float64 CPU path, timed where it runs (not repeated)
    timed: list[float] = []
    stats = T.spectral_stats

    def timed_stats(*a, **k):
        t = time.perf_counter()
        try:
            return stats(*a, **k)
        finally:
            timed.append(time.perf_counter() - t)

    T.spectral_stats = timed_stats
    try:
        t0 = time.perf_counter()
        losses = run.evaluate()
        _sync(run.device)
        t1 = time.perf_counter()
    finally:
        T.spectral_stats = stats
    spectral = {"spectral_cpu64_s": sum(timed) if timed else None, **spectral_device32(run)}
    run.save_checkpoint()
    t2 = time.perf_counter()
    again = T.Run(cfg, run.assignment, run.seed, run.retraction, out, data=run.data)
    step = again.try_resume()
    again.open_logs(step)
    t3 = time.perf_counter()
    same = step == run.step and all(torch.equal(p.detach().cpu(), q.detach().cpu())
                                    for p, q in zip(again.model.parameters(), run.model.parameters()))
    loss = again.train_step()
    _sync(again.device)
    return {"eval_s": t1 - t0, "checkpoint_s": t2 - t1, "resume_s": t3 - t2, "resumed_at": step,
            "resumed_equal": bool(same), "loss_after_resume": loss, "val_loss": losses["val"], **spectral}


def spectral_device32(run) -> dict:
    """The spectral logging's SVDs in float32 on the run's device (singular values and Gram
    diagonal of each hidden matrix, results moved once), timed: beside the float64 CPU path
    training takes (:func:`mwm.train.diagnostics.spectral_stats`, timed inside ``evaluate``),
    to choose between them at the model's shapes."""
    import torch

    from mwm.optim.assignments import module_kind

    t1 = time.perf_counter()
    with torch.no_grad():
        mats = [p for n, p in run.model.named_parameters() if module_kind(n, p) is not None]
        out = []
        for W in mats:
            T = W.float() if W.shape[0] >= W.shape[1] else W.float().T
            gram = T.T @ T
            out.append(torch.cat([torch.linalg.svdvals(T), gram.diagonal().sqrt()]))
        [o.cpu() for o in out]
    _sync(run.device)
    t2 = time.perf_counter()
    return {"spectral_device32_s": t2 - t1, "spectral_matrices": len(mats)}


def compile_agreement(run, cfg) -> dict:
    """The compiled and the eager forward's loss on one batch of ``run``'s model at its initial
    weights, under the run's autocast, and whether they agree within :data:`COMPILE_TOL`."""
    import torch

    x, y = run.batches.samplers["val"].batch(run.batches.ix["val"][0], run.device)
    with run.autocast:
        lc = run.fwd(x, y)[1].detach().double().item()  # with grad, as a step compiles it
        with torch.no_grad():
            le = run.model(x, y)[1].double().item()
    tol = COMPILE_TOL[cfg["train"]["dtype"]]
    rel = abs(lc - le) / max(abs(le), 1e-12)
    return {"compiled": lc, "eager": le, "rel_diff": rel, "tol": tol, "ok": bool(rel <= tol)}


def measure(args, name: str, batch: int, accum: int, budget_s: float, out: Path, exercise: bool, data) -> dict:
    """One row: a Run of ``name``'s assignment on ``data``, warm-up, timed steps, syncs, agreement."""
    import torch

    import mwm.train.loop as T
    from mwm.measure.syncs import SyncCounter

    assignment, extra = row_spec(name)
    cfg = make_config(args, batch, accum, extra)
    t_start = time.perf_counter()
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(args.device))
    run = T.Run(cfg, assignment, 0, cfg["train"]["dgram_retraction"], out / name, data=data)
    run.open_logs(0)
    setup_s = time.perf_counter() - t_start  # model, optimizers, the manifold init: outside any step
    # the compiled forward against eager on this model, before any step (the compile is the one the
    # steps use: the same shapes, with grad); the tier's own compile test is left to a second call
    t_compile = time.perf_counter()
    compiled = compile_agreement(run, cfg) if cfg["train"]["compile"] else None
    t_compile = time.perf_counter() - t_compile  # the forward's compile; the backward's is in step 1
    # from step 1: step 0 counts as "after an evaluation" and measures every solve against a converged one
    # (solver.csv), a fixed cost outside the budget that is no part of a training step
    run.step = 1
    for _ in range(args.warmup):
        run.train_step()
        run.step += 1
    est = statistics.median(run.step_times[1:] or run.step_times)
    # the compile: the agreement's forward, and the first step's excess over the others (the
    # backward's compile and first-call allocations)
    compile_s = (t_compile + max(0.0, run.step_times[0] - est)) if len(run.step_times) > 1 else None
    left = budget_s - (time.perf_counter() - t_start) - 3 * est  # syncs, capture, agreement
    steps = max(1, min(args.steps, int(left / est))) if left > 0 else 1
    n0 = len(run.step_times)
    for _ in range(steps):
        run.train_step()
        run.step += 1
    _sync(run.device)
    times, shares = run.step_times[n0:], run.opt_shares[n0:]
    with SyncCounter(run.device) as syncs:
        run.train_step()
    run.step += 1
    captured: dict = {}
    run.train_step(inputs=captured)  # also returns what the Muon updates consumed
    run.step += 1
    peak = _peak_memory_gib(run.device)
    # at the peak Muon learning rate (the last step's is still in warm-up)
    agree = agreement(captured, cfg, cfg["train"]["muon_lr"], run.device) if captured else None
    ms = 1e3 * statistics.median(times)
    opt_share = statistics.median(shares)
    flops = optimizer_flops(run.opts.muon)
    res = {"assignment": name, "trains": assignment, "overrides": extra, "params": run.model.num_params(),
           "micro_batch": batch, "grad_accum": accum, "tokens_per_step": batch * accum * run.mcfg.block_size,
           "timed_steps": len(times), "ms_per_step": ms, "ms_min": 1e3 * min(times), "opt_share": opt_share,
           "peak_gib": peak, "syncs_per_step": syncs.count, "syncs_kind": syncs.kind,
           "optimizer_gflop_per_step": flops / 1e9,
           "optimizer_tflops": flops / (ms * opt_share / 1e3) / 1e12 if flops and opt_share > 0 else None,
           "agreement": agree, "device": str(run.device), "dtype": cfg["train"]["dtype"], "setup_s": setup_s,
           "compile_s": compile_s, "compiled_vs_eager": compiled}
    if exercise:
        res["exercise"] = exercise_run_paths(run, cfg, out / name)
    res["wall_s"] = time.perf_counter() - t_start
    return res


def bench_assignment(args, name: str, budget_s: float, out: Path, exercise: bool = False) -> dict:
    """:func:`measure` on random token ids, halving the micro-batch on a GPU allocation
    failure at any step (the same tokens per step through gradient accumulation)."""
    from bench_fullsize import RandomTokens

    batch, accum = load_batch(args) if args.batch is None else (args.batch, 1)
    cfg0 = make_config(args, batch, accum)
    # the model's vocabulary (50304 for the paper: GPT-2's 50257 ids, padded); random ids below 50257
    vocab = cfg0["model"]["vocab_size"] or 50257
    data = RandomTokens(min(vocab, 50257), max(1_000_000, 4 * (cfg0["model"]["block_size"] + 2)))
    while True:
        try:
            return measure(args, name, batch, accum, budget_s, out, exercise, data)
        except Exception as exc:  # noqa: BLE001 - only allocation failures are retried
            if not is_oom(exc) or batch == 1:
                raise
            print(f"  {name}: out of GPU memory ({type(exc).__name__}); micro-batch {batch // 2} x "
                  f"grad_accum {accum * 2}", flush=True)
            batch, accum = batch // 2, accum * 2
        finally:
            _free()  # the run (model, optimizer state, activations) is gone before the next
            _reset_compiler()


def load_batch(args) -> tuple[int, int]:
    """The config's (batch_size, grad_accum), or --batch with accumulation 1."""
    from mwm.config import load_config

    tc = load_config(args.config)["train"]
    return tc["batch_size"], tc["grad_accum"]


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def bf16_peak(name: str) -> float | None:
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)


def settings(args) -> dict:
    """What the numbers were measured under (the header of the table)."""
    import torch

    cfg = make_config(args, *(load_batch(args) if args.batch is None else (args.batch, 1)))
    tc = cfg["train"]
    name = device_name(args.device)
    return {"device": args.device, "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "config": args.config,
            "dtype": tc["dtype"], "compile": tc["compile"], "tf32": tc["tf32"],
            "msign_precision": tc["msign_precision"], "msign_steps": tc["msign_steps"],
            "dual_ascent_steps": tc["dual_ascent_steps"], "alpha": tc["dual_ascent_alpha"],
            "bf16_peak_tflops": args.peak_tflops or bf16_peak(name)}


def row_line(r: dict, base: float | None, peak: float | None) -> str:
    """One assignment's line of the table (``base``: none's ms/step, when measured)."""
    ratio = f"{r['ms_per_step'] / base:.2f}x" if base else "-"
    paper = f"{PAPER_RATIO[r['assignment']]}x" if r["assignment"] in PAPER_RATIO else "-"
    goal = f"<={GOAL_RATIO[r['assignment']]}x" if r["assignment"] in GOAL_RATIO else "-"
    tf = r["optimizer_tflops"]
    ag = r["agreement"]
    agtxt = (f"{ag['max_rel_diff']:.2e} / {ag['median_rel_diff']:.2e} ({ag['matrices']} matrices, worst "
             f"{ag['worst']})") if ag else "-"
    return (f"{r['assignment']:<12}{str(r['micro_batch']) + 'x' + str(r['grad_accum']):>8}{r['timed_steps']:>6}"
            f"{r['ms_per_step']:>10.1f}{ratio:>8}{paper:>7}{goal:>7}{100 * r['opt_share']:>7.1f}"
            f"{r['peak_gib']:>6.2f} GiB{r['syncs_per_step']:>7}{r['optimizer_gflop_per_step']:>11.1f}"
            f"{tf if tf is not None else float('nan'):>9.2f}"
            f"{100 * tf / peak if tf is not None and peak else float('nan'):>8.1f}  {agtxt}")


#: Matrices of each bank checked against the float64 SVD reference in the retraction row: enough to
#: see the error, few enough that the reference SVDs stay seconds at GPT-2 small's shapes.
RETRACTION_CHECKED = 2


def retraction_forms() -> dict:
    """The DGram retractions the row times: the released code's float32 SVD, and this code's paper
    form with each of its polar solves (``train.dgram_polar``)."""
    from mwm.optim.manifolds import POLARS, get_manifold, retract_dgram_svd

    return {"released-svd": retract_dgram_svd,
            **{polar: get_manifold("dgram", "paper", polar).retract for polar in POLARS}}


def retraction_row(args, cfg: dict, deadline: float = math.inf) -> dict:
    """The DGram retraction of the model's banks (``n_layer`` matrices of each hidden shape, batched
    as the optimizer stacks them) on the device, in each form of :func:`retraction_forms`: timed
    (median of 3 after one untimed call), and each one's worst relative error on the first
    ``RETRACTION_CHECKED`` matrices against the float64 SVD of the released form. ``W - eta A`` on the
    manifold, as training makes it. Shapes stop starting at ``deadline`` (a ``time.perf_counter``
    value); those done are listed in ``shapes``, the others in ``cut``."""
    import torch

    from bench_retraction import timed, trained_bank, worst_error
    from mwm.optim.manifolds import retract_dgram_svd

    dev = torch.device(args.device)
    from mwm.train.model import SIZES

    m = SIZES[cfg["model"]["size"]] if cfg["model"]["size"] else cfg["model"]
    e, layers = m["n_embd"], m["n_layer"]
    g = torch.Generator().manual_seed(7)
    forms = retraction_forms()
    out = {"bank": layers, "shapes": [], "s": dict.fromkeys(forms, 0.0), "err": dict.fromkeys(forms, 0.0)}
    shapes = ((3 * e, e), (e, e), (4 * e, e), (e, 4 * e))
    out["cut"] = [list(sh) for sh in shapes]
    for shape in shapes:
        if time.perf_counter() >= deadline:
            break
        X = trained_bank(layers, shape, g).to(dev)
        k = min(layers, RETRACTION_CHECKED)
        ref = retract_dgram_svd(X[:k].double())
        for name, f in forms.items():
            seconds, Y = timed(f, X, 3, lambda: _sync(dev))
            out["s"][name] += seconds
            out["err"][name] = max(out["err"][name], worst_error(Y[:k], ref))
        out["shapes"].append(list(shape))
        out["cut"].pop(0)
    out["choice"] = polar_choice(out)
    return out


#: float32's unit roundoff: a form meets the default's accuracy when its worst error is within one
#: float32 place of the default's
_F32_PLACE = 2.0 ** -24


def polar_choice(rr: dict) -> dict | None:
    """Which polar solve the measured shapes favour: the faster of ``eigh`` and ``newton-schulz``
    among those within one float32 place of ``eigh``'s worst error (None when no shape was timed)."""
    if not rr["shapes"]:
        return None
    s, err = rr["s"], rr["err"]
    meets = {p: err[p] <= err["eigh"] + _F32_PLACE for p in ("eigh", "newton-schulz")}
    best = min((p for p in meets if meets[p]), key=lambda p: s[p])
    return {"polar": best, "speedup": s["eigh"] / s[best], "meets": meets}


def retraction_line(rr: dict) -> str:
    s, err = rr["s"], rr["err"]
    cut = f"; cut by the budget: {rr['cut']}" if rr.get("cut") else ""
    if not rr["shapes"]:
        return f"DGram retraction: no shape timed{cut}"
    per = ", ".join(f"{name} {1e3 * s[name]:.1f} ms ({err[name]:.1e})" for name in s)
    ch = rr["choice"]
    verdict = (f"faster at the default's accuracy: {ch['polar']}, {ch['speedup']:.2f}x eigh's speed"
               + (" (train.dgram_polar: newton-schulz would take it)" if ch["polar"] == "newton-schulz" else
                  " (the default stays)"))
    return (f"DGram retraction of {rr['bank']}-matrix banks {rr['shapes']}, the step's seconds (worst error "
            f"against a float64 SVD): {per}; {verdict}{cut}")


def table(results: list[dict], st: dict) -> str:
    base = next((r["ms_per_step"] for r in results if r["assignment"] == "none"), None)
    r0 = results[0]
    peak = st["bf16_peak_tflops"]
    tf32_scope = "the optimizer's float32 matmuls too" if st["device"].startswith("cuda") else "no effect on CPU"
    lines = [f"device {st['device']} ({st['device_name']}), torch {st['torch']} (CUDA {st['cuda']}), "
             f"python {st['python']}",
             f"settings: dtype {st['dtype']}, compile {st['compile']}, tf32 {st['tf32']} ({tf32_scope}), "
             f"msign {st['msign_precision']} x {st['msign_steps']} steps, dual ascent {st['dual_ascent_steps']} "
             f"steps alpha {st['alpha']}",
             f"model: {r0['params']:,} params, {r0['tokens_per_step']:,} tokens/step; syncs: {r0['syncs_kind']}; "
             f"bf16 peak {peak if peak else '-'} TFLOP/s",
             f"{'assignment':<12}{'batch':>8}{'steps':>6}{'ms/step':>10}{'x none':>8}{'paper':>7}{'goal':>7}"
             f"{'opt %':>7}{'peak':>10}{'syncs':>7}{'opt GFLOP':>11}{'TFLOP/s':>9}{'% peak':>8}"
             f"  msign bf16 vs float32 (one update, rel. Frobenius diff: max / median)"]
    lines += [row_line(r, base, peak) for r in results]
    lines.append("outside the timed steps, per row: build + manifold init / whole row: "
                 + ", ".join(f"{r['assignment']} {r['setup_s']:.1f} / {r['wall_s']:.0f} s" for r in results))
    comp = [r for r in results if r["compile_s"] is not None]
    if comp:
        lines.append("compile (the agreement's forward and the first step's excess; cold in the first row): "
                     + ", ".join(f"{r['assignment']} {r['compile_s']:.1f} s" for r in comp))
    agree = [r for r in results if r["compiled_vs_eager"]]
    if agree:
        lines.append("compiled vs eager forward loss at init (rel. diff, tol "
                     f"{agree[0]['compiled_vs_eager']['tol']:g}): "
                     + ", ".join(f"{r['assignment']} {r['compiled_vs_eager']['rel_diff']:.1e}"
                                 + ("" if r["compiled_vs_eager"]["ok"] else " FAILED") for r in agree))
    if st.get("cut"):
        lines.append(f"cut by --budget-s before they started: {' '.join(st['cut'])} ({st['cut_why']})")
    if base is None:
        lines.append("no ratios: the none row did not run")
    for r in results:
        ex = r.get("exercise")
        if ex:
            lines.append(f"{r['assignment']}: evaluate (spectral + attention logging) {ex['eval_s']:.2f} s, "
                         f"save_checkpoint {ex['checkpoint_s']:.2f} s, new Run + try_resume {ex['resume_s']:.2f} s "
                         f"(resumed at step {ex['resumed_at']}, weights equal: {ex['resumed_equal']}), "
                         f"next step loss {ex['loss_after_resume']:.4f}")
            cpu64 = "-" if ex["spectral_cpu64_s"] is None else f"{ex['spectral_cpu64_s']:.2f}"
            lines.append(f"{r['assignment']}: spectral logging's SVDs as trained (float64 on the CPU) "
                         f"{cpu64} s, the same {ex['spectral_matrices']} hidden matrices in "
                         f"float32 on {r['device']} {ex['spectral_device32_s']:.2f} s (without the Q/K/V slices)")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "config" / "paper.yaml"), help="model, batch and optimizer settings")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                    help="default: bfloat16 autocast on a GPU, float32 on CPU")
    ap.add_argument("--compile", dest="compile", action="store_true", default=None,
                    help="torch.compile the forward (default: the config's train.compile)")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per assignment (fewer if the budget says)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens there)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock cap of the whole run in seconds")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--embd", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="micro-batch (default: the config's batch_size)")
    ap.add_argument("--dual-steps", type=int, default=None, help="default: the config's dual_ascent_steps")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--assignments", nargs="+", default=ASSIGNMENTS, choices=ASSIGNMENTS)
    ap.add_argument("--exercise", default="hetero", choices=ASSIGNMENTS + ["none-of-them"],
                    help="the row that also exercises evaluate, save_checkpoint and try_resume")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's bf16 dense peak (default: looked up from its name)")
    ap.add_argument("--out", default=None, help="folder for the runs' files (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file, after every assignment")
    ap.add_argument("--plan", action="store_true",
                    help="print the order and shares this command line would run with, and exit (no torch)")
    ap.add_argument("--no-retraction", dest="retraction", action="store_false",
                    help="skip the DGram retraction row (the model's banks, against the released float32 SVD)")
    args = ap.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1")
    return args


def fixed_cost(r: dict) -> float:
    """What a row spent outside its timed steps: build, compile, warm-up, checks."""
    return r["wall_s"] - r["timed_steps"] * r["ms_per_step"] / 1e3


def next_fixed(results: list[dict]) -> float:
    """The fixed cost to expect of the next row: the largest a warm row (one after the first) has
    spent; before there is one, the first row's less the cold part of its compile."""
    if len(results) > 1:
        return max(fixed_cost(r) for r in results[1:])
    if results:
        r = results[0]
        return fixed_cost(r) - (1 - WARM_COMPILE_SHARE) * (r["compile_s"] or 0.0)
    return 0.0


def plan_next(rows: list[str], results: list[dict], left: float) -> tuple[str | None, list[str], str]:
    """The row to run next out of ``rows`` (those not yet run, in order), the rows this cuts, and why:
    the first row always starts; ``none`` (the base of every ratio) starts whenever it is next or
    nothing else fits; any other row only when it and ``none`` both fit in ``left`` seconds."""
    if not rows:
        return None, [], ""
    est = next_fixed(results)
    keep_none = "none" in rows[1:]
    need = est * (2 if keep_none else 1)
    if not results or left >= need:
        return rows[0], [], ""
    why = (f"{left:.0f} s left, a row's fixed cost about {est:.0f} s"
           + (" and none's kept for the ratios" if keep_none else ""))
    if keep_none and left >= est:
        return "none", [r for r in rows if r != "none"], why
    return None, list(rows), why


def row_budget(after: list[str], results: list[dict], left: float, budget: float) -> float:
    """The seconds a row may take (its fixed part and its timed steps, up to ``--steps``): all that
    is left, less what ``none`` needs when it is still to run (``after``): a row's fixed cost, and at
    least :data:`NONE_RESERVE` of the budget before any row has measured one. Rows run by value, so
    an earlier row takes its steps and a later one is cut, not the other way round."""
    if "none" not in after:
        return left
    return max(0.0, left - max(next_fixed(results), NONE_RESERVE * budget))


def run(args) -> tuple[dict, list[dict]]:
    import tempfile

    import torch

    from mwm.io import atomic_write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu (and a tiny model) to test the script")
    st = settings(args)
    t0 = time.perf_counter()
    results: list[dict] = []

    def save():
        if args.json:
            atomic_write_json(Path(args.json), {"settings": st, "results": results})

    st["cut"], st["cut_why"] = [], ""
    if args.retraction:  # first: it needs no model, and it is the cost DGram's rows are mostly made of
        st["retraction"] = retraction_row(args, make_config(args, 1, 1), t0 + RETRACTION_SHARE * args.budget_s)
        print(retraction_line(st["retraction"]), flush=True)
        save()
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        rows = list(args.assignments)
        while rows:
            left = args.budget_s - (time.perf_counter() - t0)
            name, cut, why = plan_next(rows, results, left)
            if cut:
                st["cut"] += cut
                st["cut_why"] = why
                print(f"cut by --budget-s ({why}): {' '.join(cut)}", flush=True)
            if name is None:
                break
            rows = [r for r in rows if r != name and r not in cut]
            r = bench_assignment(args, name, row_budget(rows, results, left, args.budget_s), out,
                                 exercise=name == args.exercise)
            results.append(r)
            base = next((x["ms_per_step"] for x in results if x["assignment"] == "none"), None)
            # the table's line at once, so a run cut by its time limit still shows every finished row
            print(f"{row_line(r, base, st['bf16_peak_tflops'])}   [{r['wall_s']:.0f} s]", flush=True)
            save()
    save()  # with the rows cut, if any
    return st, results


def plan_line(args) -> str:
    """The schedule in one line, from the constants :func:`run` follows (``scripts/gpu_check.sh`` prints
    it before anything runs)."""
    first = (f"the DGram retraction row (eigh and newton-schulz, at most {RETRACTION_SHARE:.0%} of the "
             f"budget), then " if args.retraction else "")
    rows = " ".join(args.assignments)
    kept = ", each started only when it and none (every ratio's base) both fit" if "none" in args.assignments else ""
    exercise = (f"; the exercise row with {args.exercise}" if args.exercise in args.assignments
                else "; no exercise row")
    return f"{first}the rows {rows}{kept}; up to {args.steps} timed steps a row after {args.warmup} warm-up{exercise}"


def main(argv=None) -> int:
    args = parse(argv)
    if args.plan:
        print(plan_line(args))
        return 0
    st, results = run(args)
    print("bench_gpu summary:")  # scripts/gpu_check.sh copies from here into its summary
    if "retraction" in st:
        print(retraction_line(st["retraction"]))
    if results:
        print(table(results, st))
    bad = [r["assignment"] for r in results if r["compiled_vs_eager"] and not r["compiled_vs_eager"]["ok"]]
    if bad:
        print(f"FAILED: the compiled forward disagrees with eager beyond {COMPILE_TOL} in {' '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
