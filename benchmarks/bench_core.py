"""Benchmark: one Manifold Muon step on GPT-2 small's hidden matrices.

Compares this project's batched optimizer with the released code's per-matrix
path (``released_path.py``) in the same run, for the assignments none,
stiefel, dgram and hetero, and times the DGram retractions against full SVD.

    python benchmarks/bench_core.py --layers 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from mwm.optim.dual_ascent import dual_ascent
from mwm.optim.manifolds import get_manifold, retract_dgram_svd
from mwm.config.names import NAMED_ASSIGNMENTS
from mwm.optim.muon import ManifoldMuon
from mwm.optim.solvers import SolverSettings

from bench_retraction import timed, trained_bank, worst_error
from released_path import released_step

# nn.Linear weight shapes (out, in) of one GPT-2 small block
SHAPES = {
    "attn.c_attn": (2304, 768),
    "attn.c_proj": (768, 768),
    "mlp.c_fc": (3072, 768),
    "mlp.c_proj": (768, 3072),
}


def make_problem(layers, assignment, seed=0):
    attn_mf, mlp_mf = NAMED_ASSIGNMENTS[assignment]
    g = torch.Generator().manual_seed(seed)
    names, weights, grads, mfs = [], [], [], []
    for layer in range(layers):
        for key, shape in SHAPES.items():
            mf = attn_mf if key.startswith("attn") else mlp_mf
            W = torch.randn(*shape, generator=g) * 0.02
            if mf != "none":
                W = get_manifold(mf).init(W)
            names.append(f"h.{layer}.{key}")
            weights.append(W)
            grads.append(torch.randn(*shape, generator=g) * 1e-3)
            mfs.append(mf)
    return names, weights, grads, mfs


def muon_groups(names, weights, mfs):
    """Fresh parameters of ``weights`` and one ManifoldMuon param group per manifold
    (weight decay 0.1 on plain Muon only, as the released code)."""
    params = [nn.Parameter(w.clone()) for w in weights]
    groups = {}
    for n, p, mf in zip(names, params, mfs):
        groups.setdefault(mf, {"params": [], "names": [], "manifold": mf,
                               "weight_decay": 0.1 if mf == "none" else 0.0})
        groups[mf]["params"].append(p)
        groups[mf]["names"].append(n)
    return params, list(groups.values())


def step_times(setups, x, warmup, steps):
    """Wall time of each timed training step of every ``(model, opts)`` in ``setups``,
    in interleaved rounds (machine load hits every configuration alike)."""
    times = {c: [] for c in setups}
    for i in range(warmup + steps):
        for c, (model, opts) in setups.items():
            t0 = time.perf_counter()
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opts.step()
            opts.zero_grad()
            if i >= warmup:
                times[c].append(time.perf_counter() - t0)
    return times


def time_ours(names, weights, grads, mfs, lr, steps):
    params, groups = muon_groups(names, weights, mfs)
    opt = ManifoldMuon(groups, lr=lr, init_on_manifold=False, solver=SolverSettings.defaults(steps=steps, alpha=0.1))
    for p, g in zip(params, grads):
        p.grad = g.clone()
    t = time.perf_counter()
    opt.step()
    return time.perf_counter() - t, [p.detach() for p in params]


def time_released(weights, grads, mfs, lr, steps):
    bufs = [torch.zeros_like(g) for g in grads]
    t = time.perf_counter()
    out = released_step(weights, grads, bufs, mfs, lr, alpha=0.1, steps=steps)
    return time.perf_counter() - t, out


def rel(a, b):
    return (a - b).norm().item() / b.norm().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1, help="GPT-2 blocks (shapes stay GPT-2 small's)")
    ap.add_argument("--dual-steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the retraction timings")
    ap.add_argument("--step-repeats", type=int, default=2,
                    help="alternating repeats of each optimizer-step timing (the fastest counts)")
    ap.add_argument("--retractions-only", action="store_true", help="time the DGram retractions alone")
    ap.add_argument("--bank", type=int, default=1, help="matrices per shape in the retraction timings (GPT-2 "
                    "small's banks hold 12)")
    args = ap.parse_args()
    if args.retractions_only:
        time_retractions(args.repeats, args.bank)
        return
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, layers {args.layers}, "
          f"dual-ascent steps {args.dual_steps}, alpha 0.1, lr {args.lr}, fastest of {args.step_repeats} "
          f"alternating timings per step")

    # warm-up (allocator, BLAS threads)
    n, w, g, m = make_problem(1, "stiefel")
    time_ours(n[:2], w[:2], g[:2], m[:2], args.lr, 2)

    print("\n== one optimizer step on the Muon-managed matrices ==")
    print("rel dW: max relative Frobenius difference of the new weights, ours vs released path;")
    print("floor: the released path against itself with G perturbed by 1e-7 (relative), the")
    print("float32 sensitivity of the problem. Square matrices are ill-conditioned (see below).")
    print(f"{'assignment':<11} {'released s':>10} {'ours s':>8} {'speedup':>8} "
          f"{'rel dW tall':>12} {'rel dW square':>14} {'floor square':>13}")
    ours_t, ref_t = {}, {}
    for assignment in ("none", "stiefel", "dgram", "hetero"):
        names, weights, grads, mfs = make_problem(args.layers, assignment)
        t_ref = t_ours = float("inf")
        for _ in range(args.step_repeats):  # alternate, keep the fastest of each
            t, ref = time_released(weights, grads, mfs, args.lr, args.dual_steps)
            t_ref = min(t_ref, t)
            t, ours = time_ours(names, weights, grads, mfs, args.lr, args.dual_steps)
            t_ours = min(t_ours, t)
        ours_t[assignment], ref_t[assignment] = t_ours, t_ref
        square = [i for i, w in enumerate(weights) if w.shape[0] == w.shape[1]]
        tall = [i for i in range(len(weights)) if i not in square]
        d_tall = max(rel(ours[i], ref[i]) for i in tall)
        d_sq = max(rel(ours[i], ref[i]) for i in square)
        noisy = [g * (1 + 1e-7 * torch.randn(g.shape, generator=torch.Generator().manual_seed(9)))
                 if i in square else g for i, g in enumerate(grads)]
        _, ref_noisy = time_released([weights[i] for i in square], [noisy[i] for i in square],
                                     [mfs[i] for i in square], args.lr, args.dual_steps)
        floor = max(rel(a, ref[i]) for a, i in zip(ref_noisy, square))
        ok = "OK" if d_tall < 1e-3 and (d_sq < 1e-3 or d_sq <= 3 * floor) else "MISMATCH"
        print(f"{assignment:<11} {t_ref:>10.2f} {t_ours:>8.2f} {t_ref / t_ours:>7.2f}x "
              f"{d_tall:>12.2e} {d_sq:>14.2e} {floor:>13.2e}  {ok}")

    print("\n== float64 check on the square attn.c_proj (768 x 768) ==")
    print("M = G + 2 W S is nearly singular for square W (W^T M tends to skew(W^T G)), where the")
    print("polar factor is ill-conditioned: 20 iterations amplify any rounding to the same level.")
    for mf in ("stiefel", "dgram"):
        names, weights, grads, mfs = make_problem(1, mf)
        i = names.index("h.0.attn.c_proj")
        w64, g64 = weights[i].double(), grads[i].double()
        _, ref64 = time_released([w64], [g64], [mf], args.lr, args.dual_steps)
        _, ours64 = time_ours([names[i]], [w64], [g64], [mf], args.lr, args.dual_steps)
        g_noisy = g64 * (1 + 1e-14 * torch.randn(g64.shape, generator=torch.Generator().manual_seed(9),
                                                  dtype=torch.float64))
        _, ref64_noisy = time_released([w64], [g_noisy], [mf], args.lr, args.dual_steps)
        print(f"  {mf:<8} ours vs released path: rel dW {rel(ours64[0], ref64[0]):.2e}; released path vs "
              f"itself with G perturbed by 1e-14: rel dW {rel(ref64_noisy[0], ref64[0]):.2e}")

    print("\n== ill-conditioned momentum (what training produces) on the tall attn.c_attn (2304 x 768) ==")
    print("Our default order there is the restarted Gram one; the released path iterates on the matrix.")
    print("float64: the released path run in float64, the reference both float32 results are measured against.")
    print("||A||_2: largest singular value of our update direction (Polar Express keeps it <= 1).")
    g = torch.Generator().manual_seed(2)
    m, n = SHAPES["attn.c_attn"]
    U, _ = torch.linalg.qr(torch.randn(m, n, generator=g))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=g))
    hard = {"rank 2 + 1e-3 noise": torch.randn(m, 2, generator=g) @ torch.randn(2, n, generator=g)
            + 1e-3 * torch.randn(m, n, generator=g),
            "power-law spectrum i^-2": (U * torch.arange(1, n + 1).float() ** -2.0) @ V.T}
    for label, G in hard.items():
        for mf in ("stiefel", "dgram"):
            W = get_manifold(mf).init(torch.randn(m, n, generator=g) * 0.02)
            _, ref = time_released([W], [G], [mf], args.lr, args.dual_steps)
            _, ours = time_ours(["h.0.attn.c_attn"], [W], [G], [mf], args.lr, args.dual_steps)
            _, ref64 = time_released([W.double()], [G.double()], [mf], args.lr, args.dual_steps)
            a_norm = float(torch.linalg.matrix_norm(dual_ascent(W, G, mf, steps=args.dual_steps).A, 2))
            print(f"  {label:<24} {mf:<8} rel dW {rel(ours[0], ref[0]):.2e}  released vs float64 "
                  f"{rel(ref[0].double(), ref64[0]):.2e}  ours vs float64 {rel(ours[0].double(), ref64[0]):.2e}  "
                  f"||A||_2 {a_norm:.4f}")

    manifold_speed = sum(ref_t[a] for a in ("stiefel", "dgram", "hetero")) / sum(
        ours_t[a] for a in ("stiefel", "dgram", "hetero"))
    print(f"\nmanifold step speedup over the released per-matrix path (stiefel+dgram+hetero): {manifold_speed:.2f}x "
          f"(target >= 1.5x)")
    print("\nstep cost relative to 'none' (optimizer only; paper: whole training steps on an H100 "
          "5.8x stiefel, 8.3x hetero, 13.6x dgram)")
    for a in ("stiefel", "hetero", "dgram"):
        print(f"  {a:<8} ours {ours_t[a] / ours_t['none']:6.1f}x   released path {ref_t[a] / ref_t['none']:6.1f}x")

    time_retractions(args.repeats, args.bank)


def _singular_like(shape, g, decades=6.0):
    """A weight with singular values log-spaced over ``decades`` (Gram spread 10^(2 decades)): a square
    DGram ``c_proj`` at high rates, past what eigh resolves, so the SVD path is what is timed."""
    m, n = shape
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    return ((U * torch.logspace(0, -decades, k, dtype=torch.float64)) @ V.mT).float()


def time_retractions(repeats, bank=1):
    """The DGram retractions of GPT-2 small's banks (``bank`` matrices of each shape, stacked as the
    optimizer holds them) against the released code's float32 SVD form, in time and in accuracy against
    the same form by a float64 SVD. Two kinds of weight: ``W - eta A`` on the manifold (what training
    makes at the paper's rates) and a nearly singular one (Gram spread 1e12: the SVD path). The eigh of
    a float32 Gram (numerics version 3's form) is timed to price the float64 one."""
    from mwm.optim.manifolds import retract_dgram_paper

    print(f"\n== DGram retraction of GPT-2 small's banks ({bank} per shape) vs the released float32 SVD ==")
    g = torch.Generator().manual_seed(1)
    fns = {"svd": retract_dgram_svd, "paper": get_manifold("dgram", "paper").retract,
           "colnorm": get_manifold("dgram", "colnorm").retract,
           "paper-f32": lambda X: retract_dgram_paper(X.mT if X.shape[-2] < X.shape[-1] else X)}
    print(f"{'weights':<9} {'shape':<12} {'svd s':>8} {'paper s':>8} {'colnorm s':>10} {'f32 Gram s':>11} "
          f"{'svd err':>8} {'paper err':>10}")
    for kind in ("trained", "singular"):
        totals = dict.fromkeys(fns, 0.0)
        errs = {"svd": [], "paper": []}
        for key, shape in SHAPES.items():
            if kind == "trained":
                X = trained_bank(bank, shape, g)
            else:
                X = torch.stack([_singular_like(shape, g) for _ in range(bank)])
            t = {}
            for k, f in fns.items():
                t[k] = timed(f, X, repeats)[0]
                totals[k] += t[k]
            ref = retract_dgram_svd(X.double())
            e = {k: worst_error(fns[k](X), ref) for k in errs}
            for k in errs:
                errs[k].append(e[k])
            print(f"{kind:<9} {str(shape):<12} {t['svd']:>8.4f} {t['paper']:>8.4f} {t['colnorm']:>10.4f} "
                  f"{t['paper-f32']:>11.4f} {e['svd']:>8.1e} {e['paper']:>10.1e}")
        print(f"{kind:<9} {'all four':<12} {totals['svd']:>8.4f} {totals['paper']:>8.4f} {totals['colnorm']:>10.4f} "
              f"{totals['paper-f32']:>11.4f} {max(errs['svd']):>8.1e} {max(errs['paper']):>10.1e}")
        print(f"{kind}: speedup over the released SVD: paper {totals['svd'] / totals['paper']:.2f}x, colnorm "
              f"{totals['svd'] / totals['colnorm']:.2f}x; the float64 paper form costs "
              f"{totals['paper'] / totals['paper-f32']:.2f}x the float32-Gram one; worst error against a float64 "
              f"SVD: released {max(errs['svd']):.1e}, paper {max(errs['paper']):.1e}")


if __name__ == "__main__":
    main()
