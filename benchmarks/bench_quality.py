"""Benchmark: the inner solve's quality against the weight scale, and what measuring it costs a run.

Prints, each measured in this process:

1. ``--scales``: the update's alignment with the momentum, tr(G^T A) / ||G||_*, of the paper's solve
   (20 iterations of dual ascent, alpha 0.1), the same 20 iterations on W / sigma_max
   (``train.solver_normalize``), 200 plain iterations, and the optimum (ADMM on W / sigma_max, 500
   iterations), on DGram pairs (m x n, column norms spread 10x, a rank-2 momentum plus noise) at weight
   scales 0.3 .. 100, float64, mean over ``--draws`` draws;
2. ``--cost``: one run of ``--config``'s model per ``--assignment`` (random token ids, one thread):
   the median training step against the solver-quality measurement (``mwm.optim.quality``) of a step, and the
   measurement's share of a run that measures at every ``train.eval_interval`` steps;
3. ``--solve-cost``: the normalized solve's cost against the paper's on one bank of DGram matrices
   (``--bank`` matrices of ``--shape``, grown weights and a training-sized momentum), the paper's
   settings and precision, timed alternately: the median ratio normalized / plain (and with ``--admm RHO
   STEPS`` the normalized ADMM's, round 3's solver arm);
4. ``--pairs NPZ ...``: the solver check's quantities per module kind (alignment share against the converged
   reference, tangent violation) of the paper's solve, the normalized dual ascent and (``--admm``) the
   normalized ADMM, on pairs a run captured (``train.capture_sequence``).

    python benchmarks/bench_quality.py --scales
    python benchmarks/bench_quality.py --solve-cost --shape 768 768 --bank 4
    python benchmarks/bench_quality.py --solve-cost --shape 256 64 --bank 8 --precision float32 --admm 1 10
    python benchmarks/bench_quality.py --pairs RUN/sequence/step_*.npz --precision float32 --admm 1 10
    python benchmarks/bench_quality.py --cost --config config/mechanism.yaml --assignment dgram hetero
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from mwm.optim.solvers import SolverSettings, solve

SCALES = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def dgram_pair(m: int, n: int, scale: float, gen: torch.Generator):
    Q, _ = torch.linalg.qr(torch.randn(m, n, generator=gen, dtype=torch.float64))
    d = torch.logspace(-1, 0, n, dtype=torch.float64)
    G = torch.randn(m, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, n, generator=gen, dtype=torch.float64)
    return Q * d * scale, (G + 0.1 * torch.randn(m, n, generator=gen, dtype=torch.float64)) * 1e-3


def scales_table(m: int, n: int, draws: int) -> None:
    solvers = {"paper (20 it.)": SolverSettings.defaults(),
               "20 it. on W / sigma_max": SolverSettings.defaults(normalize=True),
               "200 it.": SolverSettings.defaults(steps=200),
               "optimum (ADMM on W / sigma_max, 500 it.)": SolverSettings.defaults(solver="admm", steps=500,
                                                                                  normalize=True)}
    rows = {k: [] for k in solvers}
    for scale in SCALES:
        gen = torch.Generator().manual_seed(0)
        acc = {k: [] for k in solvers}
        for _ in range(draws):
            W, G = dgram_pair(m, n, scale, gen)
            nuc = float(torch.linalg.matrix_norm(G, "nuc"))
            for k, s in solvers.items():
                acc[k].append(float((G * solve(W, G, "dgram", s).A).sum()) / nuc)
        for k in solvers:
            rows[k].append(statistics.mean(acc[k]))
    print(f"alignment with the momentum, DGram {m} x {n}, mean of {draws} draws (float64)")
    print("| solver | " + " | ".join(f"scale {s:g}" for s in SCALES) + " |")
    print("| --- | " + " | ".join("---" for _ in SCALES) + " |")
    for k, vals in rows.items():
        print(f"| {k} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")


def cost(config: str, assignments: list[str], steps: int, repeats: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mwm.train.loop as T
    from bench_fullsize import RandomTokens
    from mwm.config import load_config
    from mwm.optim.quality import quality_rows

    torch.set_num_threads(1)
    cfg = load_config(config)
    data = RandomTokens(cfg["model"]["vocab_size"] or 2048, 200_000)
    every = cfg["train"]["eval_interval"]
    print(f"{config}: measuring at every {every} steps; one thread; {steps} timed steps, {repeats} measurements")
    for a in assignments:
        with tempfile.TemporaryDirectory() as tmp:
            run = T.Run(cfg, a, 0, cfg["train"]["dgram_retraction"], Path(tmp), data=data)
            run.open_logs(0)
            run.step = 1  # a step that measures nothing
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                run.train_step()
                times.append(time.perf_counter() - t0)
            q = []
            for _ in range(repeats):
                run.forward_backward(run.step)
                directions: dict = {}
                consumed = run.opts.step(inputs=True, directions=directions)
                run.opts.zero_grad()
                t0 = time.perf_counter()
                quality_rows(consumed, directions, run.step)
                q.append(time.perf_counter() - t0)
            step, meas = statistics.median(times[2:]), statistics.median(q)
            print(f"  {a}: step {1e3 * step:.0f} ms, measurement {1e3 * meas:.0f} ms = {meas / step:.2f} steps; "
                  f"share of a run: {100 * meas / (meas + every * step):.1f}%")


def solve_cost(m: int, n: int, bank: int, repeats: int, precision: str, admm: tuple | None = None) -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    W = torch.stack([dgram_pair(m, n, 30.0, gen)[0] for _ in range(bank)]).float()
    G = 1e-3 * torch.randn(bank, m, n, generator=gen)
    mf = "dgram"
    plain = SolverSettings.defaults(precision=precision)
    cands = {"plain": plain, "normalized": SolverSettings.defaults(precision=precision, normalize=True)}
    if admm:
        rho, steps = admm
        cands[f"normalized ADMM rho {rho:g}, {int(steps)} it."] = SolverSettings.defaults(
            precision=precision, normalize=True, solver="admm", rho=float(rho), steps=int(steps))
    times = {k: [] for k in cands}
    for i in range(repeats + 1):
        for label, st in list(cands.items())[:: 1 if i % 2 else -1]:
            t0 = time.perf_counter()
            solve(W, G, mf, st)
            if i:  # the first round warms every candidate up
                times[label].append(time.perf_counter() - t0)
    print(f"inner solve, {bank} x DGram {m}x{n}, the paper's {plain.steps} iterations of dual ascent against each, "
          f"{precision} msign, one thread, {repeats} alternating rounds:")
    for label in cands:
        ratios = [a / b for a, b in zip(times[label], times["plain"])]
        print(f"  {label}: {1e3 * statistics.median(times[label]):.0f} ms; / plain: median "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


def pairs_check(files: list[str], admm: tuple | None, precision: str) -> None:
    """The solver check's two quantities per module kind on captured pairs (``sequence/step_*.npz`` of a run
    with ``train.capture_sequence``): for each candidate solve, the median alignment share (its alignment over
    the converged reference's, :mod:`mwm.optim.quality`) and the median tangent violation, attention and MLP
    apart, banked by shape as the measurement banks them."""
    import numpy as np

    from mwm.optim.manifolds import to_tall
    from mwm.optim.quality import solve_quality

    torch.set_num_threads(1)
    cands = {"paper (20 it. dual ascent)": SolverSettings.defaults(precision=precision),
             "normalized dual ascent (20 it.)": SolverSettings.defaults(precision=precision, normalize=True)}
    if admm:
        rho, steps = admm
        cands[f"normalized ADMM rho {rho:g}, {int(steps)} it."] = SolverSettings.defaults(
            precision=precision, normalize=True, solver="admm", rho=float(rho), steps=int(steps))
    rows = {(c, k): ([], []) for c in cands for k in ("attn", "mlp")}
    for f in files:
        z = np.load(f)
        banks: dict = {}
        for i, (name, mf) in enumerate(zip(z["names"], z["manifolds"])):
            if str(mf) not in ("stiefel", "dgram"):
                continue
            W, G = (to_tall(torch.from_numpy(z[f"{k}_{i}"]).float())[0] for k in ("W", "G"))
            banks.setdefault(tuple(W.shape), []).append((str(name), str(mf), W, G))
        for bank in banks.values():
            W = torch.stack([b[2] for b in bank])
            G = torch.stack([b[3] for b in bank])
            mfs = [b[1] for b in bank]
            for c, st in cands.items():
                q = solve_quality(W, G, solve(W, G, mfs, st).A, mfs)
                for j, b in enumerate(bank):
                    kind = "attn" if ".attn." in b[0] else "mlp"
                    rows[c, kind][0].append(float(q["alignment"][j] / q["alignment_converged"][j]))
                    rows[c, kind][1].append(float(q["violation"][j]))
    print(f"the solver check's quantities on {len(files)} captured step(s), {precision} msign "
          "(median over matrices; the check: share >= 0.9, violation <= 0.02 per module kind)")
    print("| candidate | attention share | attention violation | MLP share | MLP violation |")
    print("| --- | --- | --- | --- | --- |")
    for c in cands:
        a, m = rows[c, "attn"], rows[c, "mlp"]
        print(f"| {c} | {statistics.median(a[0]):.3f} | {statistics.median(a[1]):.4f} | "
              f"{statistics.median(m[0]):.3f} | {statistics.median(m[1]):.4f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", action="store_true", help="the alignment table against the weight scale")
    ap.add_argument("--shape", type=int, nargs=2, default=(192, 64), metavar=("M", "N"))
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--cost", action="store_true", help="the measurement's share of a run")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--assignment", nargs="+", default=["dgram", "stiefel", "hetero"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--solve-cost", action="store_true", help="the normalized solve's cost against the paper's")
    ap.add_argument("--bank", type=int, default=4, help="--solve-cost: matrices in the bank")
    ap.add_argument("--pairs", nargs="+", metavar="NPZ",
                    help="the solver check per module kind on captured pairs (sequence/step_*.npz files)")
    ap.add_argument("--admm", type=float, nargs=2, metavar=("RHO", "STEPS"),
                    help="--solve-cost: also the normalized ADMM at this penalty and iteration count")
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"),
                    help="--solve-cost: msign precision (bfloat16: as released)")
    args = ap.parse_args(argv)
    if not (args.scales or args.cost or args.solve_cost or args.pairs):
        ap.error("give --scales, --cost, --solve-cost or --pairs")
    if args.scales:
        scales_table(*args.shape, args.draws)
    if args.cost:
        cost(args.config, args.assignment, args.steps, args.repeats)
    if args.solve_cost:
        solve_cost(*args.shape, args.bank, args.repeats, args.precision, args.admm)
    if args.pairs:
        pairs_check(args.pairs, args.admm, args.precision)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
