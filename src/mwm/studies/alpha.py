"""The dual-ascent step-size study and the convergence curves.

For each msign precision of ``studies.precisions`` (the first, bfloat16 by
default, is the faithful protocol: the released code's msign; float32 is the
control), each manifold variant and size ``n``: ``seeds`` random square pairs ``(W, G)``
(see :func:`mwm.studies.common.random_pairs`), plus tall ``aspect n x n`` pairs at
``tall_sizes`` (GPT-2's c_attn 3:1 and c_fc 4:1), and dual ascent for ``iterations``
iterations (linear decay) at every alpha of a log-spaced grid plus the reference
alphas (Bernstein's 0.01, the paper's 0.1). All alphas and seeds of one size go
into one batched call (tensor-valued alpha), cut into chunks of at most
``studies.max_batch_elements`` entries.

Outputs under ``--out``:

Every CSV row carries ``precision`` and ``m`` (``m = n``: square) before ``n``.

``alpha_trajectories.csv``
    ``manifold, init, precision, m, n, alpha, on_grid, seed, iteration, violation``: the tangent
    violation ``||H_t||_RMS`` of every iterate (iteration 1 is ``Lambda_0``'s).
``alpha_final.csv``
    ``manifold, init, n, alpha, on_grid, seed, init_residual, initial_violation,
    final_violation`` (``init_residual``: the constraint residual of the initial W).
``alpha_summary.csv``
    ``manifold, init, n, alpha, on_grid, seeds, mean, std, median, min, max,
    initial_mean`` over seeds of the final violation.
``alpha_derived.json``
    alpha_opt per size, the power-law fit, the n = 16 outlier, the default alpha
    against the best, the universal alpha's ratio to the optimum, the convergence
    curve statistics, the exact-init control (``manifolds``: the faithful protocol's
    square study; ``protocols``: every precision, square and ``tall``; ``floor``: the
    control's best violation against the faithful one's).

Run ``python -m mwm.studies.alpha --config config/ci.yaml --out results/studies/ci``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from mwm import paper
from mwm.optim.dual_ascent import dual_ascent
from mwm.studies.common import (chunks, main_for, random_pairs, resolve_device, run_meta, variant_manifold,
                     write_csv, write_json)
from mwm.workflow.stages import STAGES

#: This study's output files (mwm.workflow.stages): the writers name them by key.
FILES = STAGES["alpha"]

__all__ = ["alpha_grid", "power_law_fit", "run_alpha", "derive_alpha", "main"]

#: The paper's alpha-study numbers (from :mod:`mwm.paper`, one source of truth).
PAPER = paper.alpha_numbers()


def alpha_grid(spec: dict) -> list[float]:
    """The log-spaced grid ``min * (max/min)^(k/(num-1))``, ``k = 0..num-1``."""
    lo, hi, num = float(spec["min"]), float(spec["max"]), int(spec["num"])
    if not 0 < lo <= hi:
        raise ValueError(f"studies.alpha.alpha_grid needs 0 < min <= max, got min={lo}, max={hi}")
    if num == 1:
        return [lo]
    return [lo * (hi / lo) ** (k / (num - 1)) for k in range(num)]


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def run_alphas(sec: dict) -> tuple[list[float], list[bool]]:
    """All alphas run (grid first, then the reference / default / universal ones) and
    whether each is on the grid."""
    grid = alpha_grid(sec["alpha_grid"])
    alphas, on_grid = list(grid), [True] * len(grid)
    for a in list(sec["reference_alphas"]) + [sec["default_alpha"], sec["universal_alpha"]]:
        if not any(_same(a, b) for b in alphas):
            alphas.append(float(a))
            on_grid.append(False)
    return alphas, on_grid


def _index_of(alphas: Sequence[float], a: float) -> int | None:
    for i, b in enumerate(alphas):
        if _same(a, b):
            return i
    return None


def power_law_fit(ns: Sequence[float], ys: Sequence[float]) -> dict:
    """Least-squares fit of ``log y = log c + p log n``: exponent ``p``, prefactor ``c``
    and ``r2`` (coefficient of determination on the log scale)."""
    x = np.log(np.asarray(ns, dtype=np.float64))
    y = np.log(np.asarray(ys, dtype=np.float64))
    out = {"exponent": None, "prefactor": None, "r2": None, "points": int(len(x))}
    if len(x) < 2 or np.ptp(x) == 0:
        sizes = sorted(set(np.exp(x).round().astype(int).tolist()))
        out["reason"] = f"a power-law fit needs at least two distinct sizes, got {sizes}"
        return out
    p, logc = np.polyfit(x, y, 1)
    resid = y - (p * x + logc)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out["exponent"] = float(p)
    out["prefactor"] = float(math.exp(logc))
    if ss_tot == 0.0:
        out["reason"] = "r2 undefined: alpha_opt is the same at every fitted size"
    else:
        out["r2"] = float(1.0 - float((resid**2).sum()) / ss_tot)
    return out


@torch.no_grad()
def _sweep(variant: str, init: str, n: int, alphas: Sequence[float], seeds: int, iters: int,
           base_seed: int, device: torch.device, max_elements: int, precision: str = "float32",
           m: int | None = None) -> dict:
    """Violation trajectories ``(iters, len(alphas), seeds)`` of one ``m x n`` shape, batched."""
    mf = variant_manifold(variant)
    m = n if m is None else m
    W, G = random_pairs("alpha", variant, n, seeds, base_seed, stiefel_init=init if init != "retraction" else "msign",
                        m=m, precision=precision)
    residual = mf.constraint_residual(W).double().numpy()
    A, S = len(alphas), seeds
    a_idx = torch.arange(A * S) // S
    s_idx = torch.arange(A * S) % S
    alpha_vec = torch.tensor(list(alphas), dtype=torch.float64)[a_idx]
    traj = torch.empty(iters, A * S, dtype=torch.float64)
    for sl in chunks(A * S, m * n, max_elements):
        Wc = W[s_idx[sl]].to(device)
        Gc = G[s_idx[sl]].to(device)
        res = dual_ascent(Wc, Gc, mf, alpha=alpha_vec[sl].to(device), steps=iters, record_violations=True,
                          precision=precision)
        traj[:, sl] = res.violations.double().cpu()
    return {"traj": traj.reshape(iters, A, S).numpy(), "residual": residual}


def run_alpha(cfg: dict, out: str | Path, config_path: str | None = None, log=print) -> dict:
    """Run the alpha study of ``cfg['studies']['alpha']`` and write its outputs under ``out``."""
    studies = cfg["studies"]
    sec = studies["alpha"]
    device = resolve_device(studies["device"])
    out = Path(out)
    t0 = time.perf_counter()
    alphas, on_grid = run_alphas(sec)
    iters, seeds = int(sec["iterations"]), int(sec["seeds"])
    ui = _index_of(alphas, sec["universal_alpha"])

    arms: list[tuple[str, str, list[float], list[bool]]] = []  # (variant, init, alphas, on_grid)
    for variant in sec["manifolds"]:
        if variant == "stiefel":
            arms.append((variant, sec["stiefel_init"], alphas, on_grid))
            if sec["stiefel_init"] == "msign" and sec["exact_init_control"]:
                arms.append((variant, "exact", [alphas[ui]], [on_grid[ui]]))
        else:
            arms.append((variant, "retraction", alphas, on_grid))

    shapes = [(n, n) for n in sec["sizes"]]
    shapes += [(k * n, n) for n in sec["tall_sizes"] for k in sec["tall_aspects"]]
    results = {}
    traj_rows, final_rows, summary_rows = [], [], []
    for prec in studies["precisions"]:
        for variant, init, arm_alphas, arm_grid in arms:
            for m, n in shapes:
                if m != n and init == "exact":
                    continue  # the exact-init control is about square W
                t1 = time.perf_counter()
                r = _sweep(variant, init, n, arm_alphas, seeds, iters, studies["seed"], device,
                           studies["max_batch_elements"], precision=prec, m=m)
                results[(variant, init, prec, m, n)] = (arm_alphas, arm_grid, r)
                log(f"alpha: {prec:<8} {variant:>13} init={init:<10} {m}x{n:<5} {len(arm_alphas)} alphas x {seeds} "
                    f"seeds x {iters} it: {time.perf_counter() - t1:.1f} s")
                tr, res_ = r["traj"], r["residual"]
                key = (variant, init, prec, m, n)
                for ai, (a, g) in enumerate(zip(arm_alphas, arm_grid)):
                    fin = tr[-1, ai, :]
                    for s in range(seeds):
                        for it in range(iters):
                            traj_rows.append((*key, a, g, s, it + 1, float(tr[it, ai, s])))
                        final_rows.append((*key, a, g, s, float(res_[s]), float(tr[0, ai, s]), float(fin[s])))
                    summary_rows.append((*key, a, g, seeds, float(fin.mean()),
                                         float(fin.std(ddof=1)) if seeds > 1 else 0.0, float(np.median(fin)),
                                         float(fin.min()), float(fin.max()), float(tr[0, ai, :].mean())))
    wall = time.perf_counter() - t0

    base = ["manifold", "init", "precision", "m", "n", "alpha", "on_grid"]
    write_csv(out / FILES.file("trajectories"), base + ["seed", "iteration", "violation"], traj_rows)
    write_csv(out / FILES.file("final"), base + ["seed", "init_residual", "initial_violation", "final_violation"],
              final_rows)
    write_csv(out / FILES.file("summary"),
              base + ["seeds", "mean", "std", "median", "min", "max", "initial_mean"], summary_rows)
    derived = derive_alpha(sec, results, studies["precisions"])
    derived["meta"] = run_meta(sec, device, wall, config_path, studies["precisions"])
    write_json(out / FILES.file("derived"), derived)
    return derived


def _null(reason: str, **keys) -> dict:
    return {**{k: None for k in keys}, "reason": reason} if keys else {"value": None, "reason": reason}


def derive_alpha(sec: dict, results: dict, precisions: Sequence[str] = ("float32",)) -> dict:
    """Derived numbers from ``{(variant, init, precision, m, n): (alphas, on_grid, {"traj", "residual"})}``.

    ``manifolds`` is the faithful protocol's (``precisions[0]``) square study;
    ``protocols[p]`` holds every precision's square study and its ``tall`` shapes;
    ``floor`` compares each control's best violation with the faithful one's.
    """
    precisions = list(precisions)
    out = {"grid": alpha_grid(sec["alpha_grid"]), "alphas_run": run_alphas(sec)[0],
           "iterations": sec["iterations"], "seeds": sec["seeds"], "paper": PAPER,
           "faithful": precisions[0], "precisions": precisions, "universal_alpha": sec["universal_alpha"],
           "default_alpha": sec["default_alpha"], "protocols": {}}
    for p in precisions:
        square = {(v, i, n): r for (v, i, pp, m, n), r in results.items() if pp == p and m == n}
        proto = _derive_square(sec, square)
        proto["tall"] = _derive_tall(sec, {(v, i, m, n): r for (v, i, pp, m, n), r in results.items()
                                           if pp == p and m != n})
        out["protocols"][p] = proto
    out["manifolds"] = out["protocols"][precisions[0]]["manifolds"]
    out["floor"] = _floor(out, precisions)
    return out


def _floor(out: dict, precisions: list[str]) -> dict:
    """Per control precision and size: best violation of the control against the
    faithful protocol's (Stiefel, square), and their ratio."""
    faithful = out["protocols"][precisions[0]]["manifolds"].get("stiefel")
    res = {}
    for p in precisions[1:]:
        ctrl = out["protocols"][p]["manifolds"].get("stiefel")
        if faithful is None or ctrl is None:
            continue
        fb = {r["n"]: r["best_violation"] for r in faithful["per_size"]}
        rows = []
        for r in ctrl["per_size"]:
            f = fb.get(r["n"])
            rows.append({"n": r["n"], "faithful_best": f, "control_best": r["best_violation"],
                         "ratio": f / r["best_violation"] if f is not None and r["best_violation"] > 0 else None})
        res[p] = rows
    return res


def _derive_tall(sec: dict, results: dict) -> dict:
    """Per variant and tall shape: alpha_opt, best violation, the violations at the
    default and universal alphas, and ``H(Lambda_0)`` (the first iterate's violation)."""
    d_a, u_a = sec["default_alpha"], sec["universal_alpha"]
    out: dict = {}
    for (variant, init, m, n), (alphas, on_grid, r) in sorted(results.items()):
        fin = r["traj"][-1]
        mean = fin.mean(axis=1)
        grid_idx = [i for i, g in enumerate(on_grid) if g]
        k = min(grid_idx, key=lambda i: mean[i])
        di, ui = _index_of(alphas, d_a), _index_of(alphas, u_a)
        out.setdefault(variant, []).append({
            "m": m, "n": n, "aspect": m / n, "init": init, "alpha_opt": alphas[k], "best_violation": float(mean[k]),
            "violation_at_default": float(mean[di]), "violation_at_universal": float(mean[ui]),
            "initial_violation_mean": float(r["traj"][0, ui].mean())})
    return out


def _derive_square(sec: dict, results: dict) -> dict:
    """The square study's derived numbers from ``{(variant, init, n): (alphas, on_grid, {...})}``."""
    out: dict = {"manifolds": {}}
    sizes = sorted(sec["sizes"])
    d_a, u_a = sec["default_alpha"], sec["universal_alpha"]
    for variant in sec["manifolds"]:
        init = sec["stiefel_init"] if variant == "stiefel" else "retraction"
        per_size = {}
        for n in sizes:
            alphas, on_grid, r = results[(variant, init, n)]
            fin = r["traj"][-1]  # (A, S)
            mean = fin.mean(axis=1)
            med = np.median(fin, axis=1)
            grid_idx = [i for i, g in enumerate(on_grid) if g]
            k = min(grid_idx, key=lambda i: mean[i])
            km = min(grid_idx, key=lambda i: med[i])
            di, ui = _index_of(alphas, d_a), _index_of(alphas, u_a)
            per_size[n] = {
                "n": n,
                "alpha_opt": alphas[k],
                "best_violation": float(mean[k]),
                "alpha_opt_by_median": alphas[km],
                "violation_at_default": float(mean[di]),
                "violation_at_universal": float(mean[ui]),
                "ratio_universal_to_best": float(mean[ui] / mean[k]) if mean[k] > 0 else None,
                "alpha_ratio_universal_to_opt": u_a / alphas[k],
                "initial_violation_mean": float(r["traj"][0, k].mean()),
                "init_residual_mean": float(r["residual"].mean()),
                "init_residual_max": float(r["residual"].max()),
            }
        m = {"init": init, "per_size": list(per_size.values())}

        # power-law fit over n >= fit_min_n
        fit_ns = [n for n in sizes if n >= sec["fit_min_n"]]
        fit = power_law_fit(fit_ns, [per_size[n]["alpha_opt"] for n in fit_ns])
        fit["min_n"] = sec["fit_min_n"]
        fit["sizes"] = fit_ns
        m["fit"] = fit
        for n in sizes:
            per_size[n]["predicted_alpha_opt"] = (
                fit["prefactor"] * n ** fit["exponent"] if fit["exponent"] is not None else None)

        # the small-size outlier
        on = sec["outlier_n"]
        if on not in per_size:
            m["outlier"] = _null(f"outlier size n={on} is not among studies.alpha.sizes {sizes}",
                                 n=None, observed_alpha_opt=None, predicted_alpha_opt=None, ratio=None)
            m["outlier"]["n"] = on
        elif fit["exponent"] is None:
            m["outlier"] = {"n": on, "observed_alpha_opt": per_size[on]["alpha_opt"], "predicted_alpha_opt": None,
                            "ratio": None, "reason": "no power-law fit: " + fit.get("reason", "")}
        else:
            pred = per_size[on]["predicted_alpha_opt"]
            m["outlier"] = {"n": on, "observed_alpha_opt": per_size[on]["alpha_opt"], "predicted_alpha_opt": pred,
                            "ratio": per_size[on]["alpha_opt"] / pred, "in_fit": on >= sec["fit_min_n"]}

        # default alpha against the grid best
        dvb = {}
        for n in sec["compare_sizes"]:
            if n not in per_size:
                dvb[str(n)] = _null(f"size n={n} is not among studies.alpha.sizes {sizes}",
                                    violation_at_default=None, best_violation=None, ratio=None, alpha_opt=None)
            else:
                ps = per_size[n]
                dvb[str(n)] = {"alpha": d_a, "violation_at_default": ps["violation_at_default"],
                               "best_violation": ps["best_violation"], "alpha_opt": ps["alpha_opt"],
                               "ratio": ps["violation_at_default"] / ps["best_violation"]
                               if ps["best_violation"] > 0 else None}
        m["default_vs_best"] = dvb

        # universal alpha's distance to the per-size optimum
        rng = [n for n in sizes if n >= sec["fit_min_n"]]
        if not rng:
            m["universal_ratio"] = _null(f"no size >= fit_min_n={sec['fit_min_n']}",
                                         max_violation_ratio=None, within_2x=None)
        else:
            vr = [per_size[n]["ratio_universal_to_best"] for n in rng]
            ar = [per_size[n]["alpha_ratio_universal_to_opt"] for n in rng]
            m["universal_ratio"] = {
                "alpha": u_a, "sizes": rng,
                "max_violation_ratio": max(v for v in vr if v is not None) if any(v is not None for v in vr) else None,
                "within_2x": all(v is not None and v <= 2.0 for v in vr),
                "alpha_ratio_min": min(ar), "alpha_ratio_max": max(ar),
                "alpha_within_2x": all(0.5 <= a <= 2.0 for a in ar),
            }

        # convergence curves at the universal alpha (seed mean)
        conv = {}
        for n in sizes:
            alphas, _, r = results[(variant, init, n)]
            curve = r["traj"][:, _index_of(alphas, u_a), :].mean(axis=1)
            T = len(curve)
            i80 = max(1, round(0.8 * T))
            peak = int(np.argmax(curve))
            conv[str(n)] = {"alpha": u_a, "initial": float(curve[0]), "peak": float(curve[peak]),
                            "peak_iteration": peak + 1, "final": float(curve[-1]),
                            "median_first_80pct": float(np.median(curve[:i80])),
                            "at_80pct": float(curve[i80 - 1]), "iteration_80pct": i80,
                            "drop_last_20pct": float(curve[i80 - 1] / curve[-1]) if curve[-1] > 0 else None}
        m["convergence"] = conv

        # exact-init control (Stiefel only)
        if variant == "stiefel":
            ctrl = {}
            for n in sizes:
                key = (variant, "exact", n)
                if key in results:
                    _, _, r = results[key]
                    ctrl[str(n)] = {"alpha": u_a, "initial_violation_mean": float(r["traj"][0].mean()),
                                    "final_violation_mean": float(r["traj"][-1].mean()),
                                    "init_residual_mean": float(r["residual"].mean())}
            if ctrl:
                m["exact_init_control"] = {
                    "note": "W exactly orthogonal (SVD polar factor): for square W the initial multiplier "
                            "Lambda_0 = -P(W^T G + G^T W)/4 already makes A = msign(skew(W^T G)) tangent, so the "
                            "violation starts at float32 rounding and alpha has nothing to do",
                    "per_size": ctrl}
        out["manifolds"][variant] = m
    return out


def main(argv=None) -> int:
    return main_for("python -m mwm.studies.alpha",
                    "Dual-ascent alpha study on random square (W, G) pairs: final violation and trajectory per "
                    "(manifold, n, alpha, seed); alpha_opt, power-law fit and convergence statistics.",
                    run_alpha, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
