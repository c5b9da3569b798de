"""Benchmark: the DGram retraction's two polar solves (``train.dgram_polar``) on one machine.

The paper's DGram retraction is the released code's ``(U V^T) diag(S)``: the polar factor scaled by the
sorted singular values. This code forms it from the float64 Gram of each weight (``mwm.optim.manifolds``),
with its inverse square root by one of two solves:

- ``eigh``: one eigendecomposition per matrix (the default; on a GPU one cuSOLVER call per matrix at
  n = 768, as its batched symmetric eigensolver stops at n = 32);
- ``eigvalsh``: the values alone, the per-matrix part that the other solve keeps (its floor);
- ``newton-schulz``: the values, then the coupled Newton-Schulz iteration in float64 on the whole bank,
  for as many steps as the bank's worst-conditioned matrix needs (the ``NS steps`` column).

On GPT-2 small's DGram shapes and in one process (ratios, not seconds). Weights: a DGram matrix whose
column norms spread ``kappa`` (1, 10, 100: the paper's failing runs reach about 100 in attention) after a
step of size 0.02. On a GPU, ``benchmarks/bench_gpu.py``'s retraction row compares the same solves.

    python benchmarks/bench_retraction.py [--bank 2] [--repeats 3] [--shape M N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mwm.optim.manifolds import get_manifold, newton_schulz_steps, retract_dgram_svd

# tall (m, n) forms of one GPT-2 small block's matrices
SHAPES = {"attn.c_attn": (2304, 768), "attn.c_proj": (768, 768), "mlp.c_fc": (3072, 768), "mlp.c_proj": (3072, 768)}


def dgram_weight(bank: int, shape: tuple[int, int], kappa: float, g: torch.Generator) -> torch.Tensor:
    """``bank`` tall float64 matrices: orthonormal columns scaled 1..kappa (log-spaced), plus a 0.02 step."""
    m, n = shape
    Q = torch.linalg.qr(torch.randn(bank, m, n, generator=g, dtype=torch.float64)).Q
    scale = torch.logspace(0, torch.log10(torch.tensor(float(kappa))).item(), n, dtype=torch.float64)
    step = get_manifold("stiefel").init(torch.randn(bank, m, n, generator=g, dtype=torch.float64))
    return Q * scale - 0.02 * step


def sorted_sigma(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(X.mT @ X).clamp_min(0).sqrt().flip(-1)


def candidates():
    """``{name: X -> (output, Newton-Schulz steps)}``: the two solves and the eigenvalue floor."""
    def solve(polar):
        def f(X):
            return get_manifold("dgram", "paper", polar).retract(X), 0
        return f

    def values(X):
        return sorted_sigma(X), 0

    def ns(X):
        sigma = sorted_sigma(X)
        steps = newton_schulz_steps(float((sigma[..., -1] / sigma[..., 0]).amin()) ** 2)
        return get_manifold("dgram", "paper", "newton-schulz").retract(X), steps

    return {"eigh": solve("eigh"), "eigvalsh": values, "newton-schulz": ns}


def trained_bank(bank: int, shape: tuple[int, int], g: torch.Generator, eta: float = 0.02) -> torch.Tensor:
    """``bank`` float32 weights of ``shape`` as training makes them at the paper's rates, before the DGram
    retraction: ``W - eta A``, ``W`` the DGram init of 0.02-scale noise and ``A`` a Stiefel point (the
    update's scale). ``bench_core`` and ``bench_gpu`` time the retraction on these."""
    W = get_manifold("dgram").init(torch.randn(bank, *shape, generator=g) * 0.02)
    return W - eta * get_manifold("stiefel").init(torch.randn(bank, *shape, generator=g))


def timed(f, X, repeats: int, sync=lambda: None):
    """The median seconds of ``repeats`` calls of ``f(X)`` after one untimed call, and the last output;
    ``sync()`` runs before and after each timed call (a device's queue drained)."""
    f(X)
    samples = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = f(X)
        sync()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples), out


def worst_error(Y: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative Frobenius distance from ``ref`` over a bank, in float64."""
    Y, ref = Y.double(), ref.double()
    return float(((Y - ref).norm(dim=(-2, -1)) / ref.norm(dim=(-2, -1))).amax())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", type=int, default=2, help="matrices per shape")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kappas", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    ap.add_argument("--shape", type=int, nargs=2, metavar=("M", "N"), help="one tall shape instead of GPT-2's")
    args = ap.parse_args(argv)
    shapes = {"shape": tuple(args.shape)} if args.shape else SHAPES
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    fns = candidates()
    print(f"threads {torch.get_num_threads()}, bank {args.bank} per shape; times relative to eigh")
    print(f"{'kappa':>6} {'shape':<13} {'eigh s':>8} {'eigvalsh':>9} {'newton-schulz':>14} {'NS steps':>9} "
          f"{'eigh err':>9} {'NS err':>9}")
    for kappa in args.kappas:
        tot = dict.fromkeys(fns, 0.0)
        for shape in shapes.values():
            X = dgram_weight(args.bank, shape, kappa, g)
            ref = retract_dgram_svd(X)
            res = {k: timed(f, X, args.repeats) for k, f in fns.items()}
            for k in fns:
                tot[k] += res[k][0]
            err = {k: worst_error(res[k][1][0], ref) for k in ("eigh", "newton-schulz")}
            t0 = res["eigh"][0]
            print(f"{kappa:>6g} {str(shape):<13} {t0:>8.3f} {res['eigvalsh'][0] / t0:>9.2f} "
                  f"{res['newton-schulz'][0] / t0:>14.2f} {res['newton-schulz'][1][1]:>9d} {err['eigh']:>9.1e} "
                  f"{err['newton-schulz']:>9.1e}")
        print(f"{kappa:>6g} {'block total':<13} {tot['eigh']:>8.3f} {tot['eigvalsh'] / tot['eigh']:>9.2f} "
              f"{tot['newton-schulz'] / tot['eigh']:>14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
