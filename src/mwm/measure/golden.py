"""Golden outputs: the optimizer's math on fixed inputs, stored with the numerics version they belong to.

    python -m mwm.measure.golden --check            # every case against tests/golden/numerics-v<VERSION>.npz
    python -m mwm.measure.golden --write            # after a numerics change, with mwm.numerics.VERSION bumped

A change of code that moves one of these outputs beyond float rounding is a numerics change:
``tests/measure/test_golden.py`` fails on it until :data:`mwm.numerics.VERSION` is bumped and the file of
the new version written. Cases (:data:`CASES`): msign (float32 and float64 in direct and Gram order,
the released bfloat16 iteration, tall / square / wide / nearly low-rank), dual ascent and ADMM (Stiefel, DGram;
float32 and float64), every retraction (a DGram weight whose Gram eigh cannot resolve too), one step
of the model and both optimizers per assignment, the model's loss and the learning-rate schedule.

Inputs come from NumPy's PCG64 stream (the same numbers on every machine), not from torch's
samplers, whose vectorized kernels differ between CPUs.

Tolerances (:data:`TOLERANCE`) are on the relative Frobenius distance from the stored output and
set per arithmetic: float64 cases, where rounding is far below any real change, are the sensitive
ones; float32 and bfloat16 cases guard their own code paths with room for other CPUs' kernels. Each
is far above what one code gives on different CPUs and thread counts (measured by
:func:`spread`, which reruns the cases under ``ATEN_CPU_CAPABILITY`` = default / avx2,
``MKL_ENABLE_INSTRUCTIONS`` = SSE4_2 / AVX2 and one or two threads), and far below what a real
change moves (a Polar Express coefficient changed by 1e-3 moves the float32 and float64 cases that use
it by about 2e-3, the float64 model steps by 3e-5 to 2e-3).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from mwm.io import atomic_savez
from mwm.numerics import VERSION

__all__ = ["CASES", "TOLERANCE", "golden_path", "compute", "compare", "spread", "main"]

#: Relative Frobenius tolerance per arithmetic of a case.
TOLERANCE = {"float64": 1e-9, "float32": 1e-3, "bfloat16": 3e-2}
GOLDEN_DIR = Path(__file__).resolve().parents[3] / "tests" / "golden"


def golden_path(version: int = VERSION, folder: Path = GOLDEN_DIR) -> Path:
    return folder / f"numerics-v{version}.npz"


def _normal(seed: int, *shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape)).to(dtype)


def _low_rank(seed: int, m: int, n: int, rank: int = 2, noise: float = 1e-3, dtype=torch.float32) -> torch.Tensor:
    return (_normal(seed, m, rank, dtype=torch.float64) @ _normal(seed + 1, rank, n, dtype=torch.float64)
            + noise * _normal(seed + 2, m, n, dtype=torch.float64)).to(dtype)


def _on(name: str, W: torch.Tensor) -> torch.Tensor:
    from mwm.optim.manifolds import get_manifold

    return get_manifold(name).init(W)


def _spread_columns(W: torch.Tensor, spread: float) -> torch.Tensor:
    """``W`` with column norms spread over ``spread`` (log-spaced): DGram weights as training makes them."""
    n = W.shape[-1]
    return W * torch.logspace(0, np.log10(spread), n, dtype=W.dtype)


# -- the cases -----------------------------------------------------------------------------------


def _msign(shape, method, precision="float32", seed=11, low_rank=False, dtype=torch.float32):
    from mwm.optim.msign import msign

    G = _low_rank(seed, *shape, dtype=dtype) if low_rank else _normal(seed, *shape, dtype=dtype)
    return lambda: msign(G, method=method, precision=precision)


def _solve(kind, manifold, dtype, seed=21, spread=1.0, m=24, n=8):
    from mwm.optim.dual_ascent import dual_ascent
    from mwm.optim.solvers import admm

    W = _spread_columns(_on(manifold, _normal(seed, m, n, dtype=dtype)), spread)
    G = _normal(seed + 1, m, n, dtype=dtype)
    fn = dual_ascent if kind == "dual_ascent" else admm
    return lambda: fn(W, G, manifold).A


def _normalized_solve(kind, manifold, dtype, seed=25, m=24, n=8):
    """The scale-normalized solve on a grown DGram weight (column norms 30 to 300) and a training-sized
    momentum (entries ~1e-3), where it differs most from the plain solve."""
    from mwm.optim.solvers import SolverSettings, solve

    W = _on(manifold, _normal(seed, m, n, dtype=dtype))
    W = _spread_columns(W, 10.0) * 30.0 if manifold == "dgram" else W
    G = 1e-3 * _normal(seed + 1, m, n, dtype=dtype)
    s = SolverSettings.defaults(solver=kind, normalize=True)
    return lambda: solve(W, G, manifold, s).A


def _retract(manifold, retraction, dtype, precision="float32", seed=31, singular=False):
    from mwm.optim.manifolds import get_manifold

    W = _low_rank(seed, 24, 8, rank=3, noise=1e-6, dtype=dtype) if singular else _normal(seed, 24, 8, dtype=dtype)
    mf = get_manifold(manifold, retraction)
    return lambda: mf.retract(W, precision=precision)


def _retract_bank(retraction, seed=33):
    """A DGram bank whose middle matrix eigh cannot resolve: it alone is retracted by SVD."""
    from mwm.optim.manifolds import get_manifold

    W = torch.stack([_normal(seed, 24, 8, dtype=torch.float32),
                     _low_rank(seed + 1, 24, 8, rank=3, noise=1e-6, dtype=torch.float32),
                     _normal(seed + 2, 24, 8, dtype=torch.float32)])
    mf = get_manifold("dgram", retraction)
    return lambda: mf.retract(W)


def _model(assignment: str | None, precision: str = "float32", dtype=torch.float32, seed=41):
    """The loss of a tiny GPT on fixed tokens (``assignment`` None), else its weights after one step of
    both optimizers of ``assignment`` (AdamW and Manifold Muon, the paper's settings), in ``dtype``."""
    def run():
        from mwm.optim.assignments import OptimizerSettings, build_optimizers
        from mwm.train.model import GPT, GPTConfig
        from mwm.optim.solvers import SolverSettings
        from mwm.optim.vocab import PAPER_TRAIN

        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)).to(dtype)
        with torch.no_grad():
            for i, (_, p) in enumerate(sorted(model.named_parameters())):
                p.copy_(0.2 * _normal(seed + i, *p.shape, dtype=dtype))
        tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, 32, (2, 9)))
        x, y = tokens[:, :-1], tokens[:, 1:]
        if assignment is None:
            return model(x, y)[1].detach().reshape(1)
        settings = OptimizerSettings.defaults(solver=SolverSettings.defaults(precision=precision))
        opts = build_optimizers(model, assignment, settings)
        opts.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])  # the paper's peak rates
        opts.zero_grad()
        model(x, y)[1].backward()
        opts.step()
        # a square Stiefel update is decided by rounding (Lambda_0 already solves it; docs/findings.md):
        # one step leaves every other weight independent of it, so those are the output
        return torch.cat([p.detach().reshape(-1) for name, p in sorted(model.named_parameters())
                          if not (opts.assignment.get(name) == "stiefel" and p.shape[-1] == p.shape[-2])])
    return run


def _schedule():
    from mwm.train.schedule import learning_rates

    train = {"learning_rate": 6e-4, "min_lr": 6e-5, "warmup_iters": 10, "lr_decay_iters": 90, "max_iters": 100,
             "muon_lr": 0.02}

    def run():
        return torch.tensor([learning_rates(it, train) for it in range(0, 101, 7)], dtype=torch.float64)
    return run


def _cases() -> dict[str, tuple[str, Callable[[], torch.Tensor]]]:
    from mwm.config.names import PAPER_ASSIGNMENTS

    cases: dict[str, tuple[str, Callable]] = {}
    for shape, label in (((24, 8), "tall"), ((8, 8), "square"), ((8, 24), "wide")):
        for method in ("direct", "gram"):
            cases[f"msign/{label}/{method}"] = ("float32", _msign(shape, method))
            cases[f"msign/{label}/{method}/float64"] = ("float64", _msign(shape, method, dtype=torch.float64))
        cases[f"msign/{label}/bfloat16"] = ("bfloat16", _msign(shape, "direct", "bfloat16"))
    cases["msign/low_rank/gram"] = ("float32", _msign((32, 8), "gram", low_rank=True))
    cases["msign/low_rank/direct"] = ("float32", _msign((32, 8), "direct", low_rank=True))
    for method in ("direct", "gram"):
        cases[f"msign/low_rank/{method}/float64"] = ("float64", _msign((32, 8), method, low_rank=True,
                                                                        dtype=torch.float64))
    for kind in ("dual_ascent", "admm"):
        for mf in ("stiefel", "dgram"):
            for dtype, label in ((torch.float32, "float32"), (torch.float64, "float64")):
                cases[f"{kind}/{mf}/{label}"] = (label, _solve(kind, mf, dtype))
        # Spread columns amplify rounding (ADMM's float32 output moves ~3e-4 between CPU kernels), so
        # this case guards the spread behaviour in float64; the float32 path has its own cases above.
        cases[f"{kind}/dgram/spread10/float64"] = ("float64", _solve(kind, "dgram", torch.float64, spread=10.0))
        for mf in ("stiefel", "dgram"):
            for dtype, label in ((torch.float32, "float32"), (torch.float64, "float64")):
                cases[f"{kind}/{mf}/normalized/{label}"] = (label, _normalized_solve(kind, mf, dtype))
    for mf, retraction in (("stiefel", "paper"), ("dgram", "paper"), ("dgram", "colnorm"), ("oblique", "paper")):
        for dtype, label in ((torch.float32, "float32"), (torch.float64, "float64")):
            cases[f"retract/{mf}-{retraction}/{label}"] = (label, _retract(mf, retraction, dtype))
    cases["retract/stiefel-paper/bfloat16"] = ("bfloat16", _retract("stiefel", "paper", torch.float32, "bfloat16"))
    cases["retract/dgram-paper/nearly_singular"] = ("float32", _retract("dgram", "paper", torch.float32,
                                                                         singular=True))
    for retraction in ("paper", "colnorm"):
        cases[f"retract/dgram-{retraction}/mixed_bank"] = ("float32", _retract_bank(retraction))
    cases["model/loss"] = ("float32", _model(None))
    for a in PAPER_ASSIGNMENTS:
        cases[f"step/{a}"] = ("float32", _model(a))
        cases[f"step/{a}/float64"] = ("float64", _model(a, dtype=torch.float64))
    cases["step/hetero/bfloat16"] = ("bfloat16", _model("hetero", "bfloat16"))
    cases["schedule"] = ("float64", _schedule())
    return cases


CASES = tuple(_cases())


#: Outputs longer than this are stored as a fixed random projection to this many numbers (a sketch:
#: the distance of two sketches is that of the outputs within about 25%), so the file stays small.
SKETCH = 32


def _sketch(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    if flat.size <= SKETCH:
        return flat
    R = np.random.default_rng(flat.size).standard_normal((SKETCH, flat.size)) / np.sqrt(SKETCH)
    return R @ flat


def compute(names=None, threads: int | None = 1) -> dict[str, np.ndarray]:
    """Every case's output (float64, sketched: :data:`SKETCH`), on the CPU, with ``threads`` torch threads."""
    if threads:
        torch.set_num_threads(threads)
    table = _cases()
    return {n: _sketch(table[n][1]().detach().to("cpu", torch.float64).numpy()) for n in (names or CASES)}


def compare(got: dict[str, np.ndarray], gold: dict[str, np.ndarray]) -> list[str]:
    """One line per case that moved beyond its tolerance, is missing or is new, naming how far."""
    table = _cases()
    out = []
    for name in sorted(set(got) | set(gold)):
        if name not in gold:
            out.append(f"{name}: not in the golden file")
            continue
        if name not in got:
            out.append(f"{name}: in the golden file, no longer computed")
            continue
        a, b = got[name], gold[name]
        if a.shape != b.shape:
            out.append(f"{name}: shape {a.shape}, golden {b.shape}")
            continue
        tol = TOLERANCE[table[name][0]]
        dist = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
        if not np.isfinite(dist) or dist > tol:
            out.append(f"{name}: moved {dist:.3g} (relative Frobenius; tolerance {tol:g} for {table[name][0]})")
    return out


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def spread(settings=None) -> dict[str, float]:
    """Per case, the largest relative distance between this code's outputs under different CPU
    kernels and thread counts (each setting in a fresh process): what one code gives on machines."""
    settings = settings or [
        {"ATEN_CPU_CAPABILITY": "default", "threads": "1"},
        {"ATEN_CPU_CAPABILITY": "avx2", "threads": "1"},
        {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "threads": "1"},
        {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "threads": "2"},
    ]
    import tempfile

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(settings):
            env = dict(os.environ, **{k: v for k, v in s.items() if k != "threads"})
            out = Path(tmp) / f"{i}.npz"
            proc = subprocess.run([sys.executable, "-m", "mwm.measure.golden", "--write", "--force", "--out", str(out),
                                   "--threads", s.get("threads", "1")], env=env, capture_output=True, text=True)
            if proc.returncode != 0:  # e.g. a kernel this CPU lacks
                print(f"skipped {s}: exit {proc.returncode}", file=sys.stderr)
                continue
            results.append(load(out))
    worst = {}
    for name in results[0]:
        ref = results[0][name]
        worst[name] = max(float(np.linalg.norm(r[name] - ref) / max(np.linalg.norm(ref), 1e-30)) for r in results)
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mwm.measure.golden", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="compare every case with the golden file")
    g.add_argument("--write", action="store_true", help="write the golden file of this numerics version")
    g.add_argument("--spread", action="store_true",
                   help="per case, how far this code's outputs differ across CPU kernels and threads")
    p.add_argument("--out", help="the file to write or check (default: tests/golden/numerics-v<VERSION>.npz)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--force", action="store_true", help="with --write: replace an existing file")
    args = p.parse_args(argv)
    path = Path(args.out) if args.out else golden_path()
    if args.spread:
        table = _cases()
        print(json.dumps({n: {"spread": f"{v:.2g}", "tolerance": TOLERANCE[table[n][0]]}
                          for n, v in spread().items()}, indent=1))
        return 0
    if args.write and path.exists() and not args.force:
        print(f"error: {path} exists: a golden file is written once per numerics version; bump "
              f"mwm.numerics.VERSION (a numerics change) or pass --force", file=sys.stderr)
        return 2
    got = compute(threads=args.threads)
    if args.write:
        atomic_savez(path, got)
        print(f"wrote {len(got)} cases to {path}")
        return 0
    if not path.is_file():
        print(f"error: no golden file {path} for numerics version {VERSION}: write it with "
              f"`python -m mwm.measure.golden --write` (after a numerics change only)", file=sys.stderr)
        return 2
    moved = compare(got, load(path))
    for line in moved:
        print(line)
    print(f"{len(got) - len(moved)} of {len(got)} cases as in {path.name}" if not moved else
          f"{len(moved)} case(s) moved while the numerics version is {VERSION}: a numerics change must bump "
          f"mwm.numerics.VERSION and write a new golden file", file=sys.stderr if moved else sys.stdout)
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
