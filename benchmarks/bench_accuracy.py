"""Benchmark: the optimizer's fast paths against the released protocol's accuracy.

On (W, U) pairs captured from real trainings (U: the Nesterov momentum the update consumed), every
Stiefel, DGram and plain-Muon matrix's update is computed

* ``training``: as training computes it: this project's optimizer, built from the run's config, on
  its banks (small matrices zero-padded to their bank's height), evaluation order ``auto``, the
  eigh DGram retraction, float32 (the config's msign precision);
* ``direct`` / ``gram``: the same solve per matrix, unpadded, in one fixed evaluation order
  (``mwm.optim.dual_ascent``; plain Muon: ``mwm.optim.msign``), float32;
* ``released``: the released protocol: per matrix, bfloat16 msign (emulated, ``mwm.optim.msign.msign_bf16``),
  the direct order, DGram retracted by a float32 SVD, Stiefel by the bfloat16 msign;

and each against a float64 reference of the same computation (the same iterations in float64, the
direct order, retraction by float64 SVD; Stiefel's retraction is msign, so its reference is msign
in float64). Errors are relative Frobenius distances per matrix, of the step direction ``A`` and of
the retracted weight ``retract(W - eta A)`` at the config's ``eta`` and at ``eta = 1`` (where the
direction's error is not hidden by a small step), and the absolute difference of the direction's
alignment with the momentum, tr(U^T A) / ||U||_* (``align``: printed, judged by no rule). The
retraction forms are also measured alone:
each DGram form (eigh ``paper`` as ``R``, eigh ``colnorm`` as ``Rc``, each beside the same form by a
float32 SVD) and each Stiefel msign order on the same float32 input ``W - eta A_ref``, against that
form by a float64 SVD (DGram) or float64 msign (Stiefel).

``auto`` is the per-matrix solve in the order ``auto`` picks for the unpadded shape: ``training``
beside it is what the bank padding does (a padded square matrix is solved in the Gram order).

Rule, fixed before the first measurement of these captures: a fast path (``training``, ``auto``,
``gram``, each DGram retraction form and each Stiefel msign order) is held to the released protocol
per manifold, over every captured well-posed matrix of that manifold: its median and its maximum
error of ``A`` and of the weight at ``eta = 1`` (a retraction form: of its output at ``eta = 1``)
must each be at most the released protocol's on the same matrices (a retraction form: the released
retraction's, float32 SVD or bfloat16 msign, on the same input). A path that exceeds either is
reported ``EXCEEDS``: it is fixed or stops being chosen automatically (a numerics change,
:mod:`mwm.numerics`). Ill-posed matrices are those whose float64 solve moves by more than
:data:`ILL_POSED` when its float32 inputs move by one rounding (``sensitivity``): no float32 path can
be judged there, so their errors are printed apart (``A(ill-posed)``) and take no part in a verdict.
Square Stiefel ``c_proj`` pairs are such matrices (130% between float32 and float64 in every order on
the default runs' step-200 pairs); the split, like the rule, precedes these captures.

Captures: ``capture`` trains, with ``python -m mwm.train`` into ``--workdir`` (reused when there),
seed 0 of every assignment of ``config/config.yaml`` and saves the pairs early (step 10, in the
warmup) and late (step 390 of 400), and a high-rate DGram run (``config/mechanism.yaml``, eta 5.12,
seed 10; pairs at step 150, where such runs stall). The data must be prepared (``snakemake --cores 2
data`` or any run of the default DAG).

    python benchmarks/bench_accuracy.py --workdir /tmp/mwm-accuracy [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Source:
    """One training whose pairs are captured: ``steps`` maps a label to the step."""

    label: str
    config: str
    assignment: str
    seed: int
    steps: dict
    overrides: tuple = ()


DEFAULT_ASSIGNMENTS = ("none", "stiefel", "dgram", "hetero", "hetero-inv", "hetero-admm")
SOURCES = tuple(Source(a, "config/config.yaml", a, 0, {"early": 10, "late": 390}) for a in DEFAULT_ASSIGNMENTS) + (
    Source("dgram-eta5.12", "config/mechanism.yaml", "dgram", 10, {"stall": 150}, ("train.muon_lr=5.12",)),)


# -- capture ----------------------------------------------------------------------------------------
def _pair_files(src: Source, workdir: Path) -> dict[str, Path]:
    return {label: workdir / "pairs" / f"{src.label}-{label}.npz" for label in src.steps}


def capture(src: Source, workdir: Path, threads: int) -> dict[str, Path]:
    """Train ``src`` (once) and keep its pairs under ``workdir/pairs``."""
    want = _pair_files(src, workdir)
    if all(p.exists() for p in want.values()):
        return want
    steps = sorted(src.steps.values())
    first, *rest = steps
    if len(rest) > 1:
        raise ValueError("a source captures at most two steps (pairs step and one sequence step)")
    over = [f"train.capture_pairs_step={first}"]
    if rest:
        over += [f"train.capture_sequence={{start: {rest[0]}, length: 1}}", "studies.solvers.source=own"]
    over += ["train.eval_interval=100000", "train.keep_final_checkpoint=false", *src.overrides]
    out = workdir / "runs" / src.label
    cmd = [sys.executable, "-m", "mwm.train", "--config", src.config, "--assignment", src.assignment,
           "--seed", str(src.seed), "--out", str(out), "--threads", str(threads), *over]
    log = workdir / f"{src.label}.log"
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"capture of {src.label} failed (exit {rc}); see {log}")
    run = next(out.rglob("pairs.npz")).parent
    found = {first: run / "pairs.npz"}
    if rest:
        found[rest[0]] = run / "sequence" / f"step_{rest[0]:06d}.npz"
    want[next(iter(want))].parent.mkdir(parents=True, exist_ok=True)
    for label, step in src.steps.items():
        os.replace(found[step], want[label])
    return want


# -- the paths --------------------------------------------------------------------------------------
def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def _released_retract(name: str, X: torch.Tensor, retraction: str) -> torch.Tensor:
    from mwm.optim.manifolds import retract_dgram_svd
    from mwm.optim.msign import msign

    if name == "stiefel":
        return msign(X, precision="bfloat16")
    if retraction != "paper":
        raise ValueError("the released code has the paper's DGram retraction only")
    return retract_dgram_svd(X)


def _svd_retract(X: torch.Tensor, form: str) -> torch.Tensor:
    """A DGram retraction form by an SVD in ``X``'s own dtype (the released code's way, float32)."""
    from mwm.optim.manifolds import retract_dgram_svd, to_tall

    if form == "paper":
        return retract_dgram_svd(X)
    T, tr = to_tall(X)
    d = T.norm(dim=-2, keepdim=True)
    U, _, Vh = torch.linalg.svd(T / d, full_matrices=False)
    out = (U @ Vh) * d
    return out.mT if tr else out


def _ref_retract(name: str, X64: torch.Tensor, retraction: str) -> torch.Tensor:
    from mwm.optim.msign import msign

    if name == "stiefel":
        return msign(X64, method="direct")
    return _svd_retract(X64, retraction)


def _alignment(A: torch.Tensor, U64: torch.Tensor) -> float:
    """tr(U^T A) / ||U||_*: how much of the momentum the step direction takes (1: msign(U))."""
    return float((U64 * A.double()).sum() / torch.linalg.matrix_norm(U64, "nuc"))


#: float32's unit roundoff: the size of the perturbation :func:`_nudged` applies.
_U32 = 2.0 ** -24
#: A matrix whose float64 solve moves by more than this when its float32 inputs are nudged by one
#: rounding is ill-posed at float32 input: every float32 path's error there is the solve's, not the path's.
ILL_POSED = 1e-2


def _nudged(W64: torch.Tensor, U64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``W`` and ``U`` with every entry moved by one float32 rounding, signs drawn from a fixed seed."""
    g = torch.Generator().manual_seed(0)

    def nudge(X):
        return X * (1.0 + _U32 * (2.0 * torch.randint(0, 2, X.shape, generator=g, dtype=X.dtype) - 1.0))

    return nudge(W64), nudge(U64)


def measure_file(path: Path, src: Source, etas: tuple[float, ...], data=None) -> list[dict]:
    """One row per matrix: its errors on every path. ``data``: the token dataset of the run built for its
    optimizer's groups (None: the config's prepared one)."""
    import mwm.train.loop as T
    from mwm.config import load_config
    from mwm.optim.manifolds import get_manifold
    from mwm.optim.msign import msign
    from mwm.optim.solvers import SolverSettings, solve

    cfg = load_config(str(ROOT / src.config), list(src.overrides))
    z = np.load(path)
    if "captured" in z and not bool(z["captured"]):
        raise SystemExit(f"{path} holds no pairs: {z['reason']}")
    names = [str(n) for n in z["names"]]
    pairs = {n: (torch.from_numpy(z[f"W_{i}"]), torch.from_numpy(z[f"G_{i}"])) for i, n in enumerate(names)}
    rows = {n: {"source": src.label, "capture": path.stem, "name": n, "shape": list(pairs[n][0].shape)}
            for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        run = T.Run(cfg, src.assignment, src.seed, cfg["train"]["dgram_retraction"], Path(tmp), data=data)
        muon = run.opts.muon
        params = {g["names"][i]: (g, p) for g in muon.param_groups for i, p in enumerate(g["params"])}
        for eta in etas:
            for n, (g, p) in params.items():
                W, U = pairs[n]
                p.data.copy_(W)
                # a fresh buffer gives the Nesterov direction (1 + mu) g: g = U / (1 + mu)
                p.grad = U / (1.0 + g["momentum"]) if g["nesterov"] else U.clone()
                g["lr"] = eta
            muon.state.clear()
            directions: dict = {}
            consumed = muon.step_with_inputs(directions)
            for n, (g, p) in params.items():
                manifold, W, U = consumed[n]
                row = rows[n]
                row["manifold"] = manifold
                row.setdefault("consumed", (W, U))
                row.setdefault("A_training", directions[n])
                row[f"W_training@{eta:g}"] = p.detach().clone()
                row["group"] = {k: g[k] for k in SolverSettings.GROUP_KEYS.values()} | {
                    "dgram_retraction": g["dgram_retraction"], "weight_decay": g["weight_decay"]}
    out = []
    for n, row in rows.items():
        W, U = row.pop("consumed")
        A_tr = row.pop("A_training")
        name, group = row["manifold"], row.pop("group")
        W64, U64 = W.double(), U.double()
        if name == "none":
            # plain Muon: A = msign(U); the weight moves to W (1 - eta wd) - eta A
            A = {"reference": msign(U64, method="direct"), "training": A_tr, "auto": msign(U),
                 "direct": msign(U, method="direct"), "gram": msign(U, method="gram"),
                 "released": msign(U, precision="bfloat16")}
            row["sensitivity"] = rel(msign(_nudged(W64, U64)[1], method="direct"), A["reference"])
            for k in ("training", "auto", "direct", "gram", "released"):
                row[f"A:{k}"] = rel(A[k], A["reference"])
            out.append(row)
            continue
        s = SolverSettings.of_group(group)
        retraction = group["dgram_retraction"]
        mf = get_manifold(name, retraction)
        f64 = s.replace(method="direct", precision="float32")
        A = {"reference": solve(W64, U64, name, f64).A,
             "training": A_tr,
             "auto": solve(W, U, name, s.replace(method="auto", precision="float32")).A,
             "direct": solve(W, U, name, s.replace(method="direct", precision="float32")).A,
             "gram": solve(W, U, name, s.replace(method="gram", precision="float32")).A,
             "released": solve(W, U, name, s.replace(method="direct", precision="bfloat16")).A}
        row["sensitivity"] = rel(solve(*_nudged(W64, U64), name, f64).A, A["reference"])
        for k in ("training", "auto", "direct", "gram", "released"):
            row[f"A:{k}"] = rel(A[k], A["reference"])
            row[f"align:{k}"] = abs(_alignment(A[k], U64) - _alignment(A["reference"], U64))
        for eta in etas:
            ref = _ref_retract(name, W64 - eta * A["reference"], retraction)
            row[f"W@{eta:g}:training"] = rel(row.pop(f"W_training@{eta:g}"), ref)
            for k in ("auto", "direct", "gram"):
                row[f"W@{eta:g}:{k}"] = rel(mf.retract(W - eta * A[k]), ref)
            if name == "stiefel" or retraction == "paper":
                row[f"W@{eta:g}:released"] = rel(_released_retract(name, W - eta * A["released"], retraction), ref)
            # the retraction forms alone, on one float32 input
            X = (W64 - eta * A["reference"]).float()
            if name == "dgram":
                # both forms, whichever the run used: R the paper's, Rc colnorm's (same input)
                for form, q in (("paper", "R"), ("colnorm", "Rc")):
                    ref_f = _ref_retract(name, X.double(), form)
                    row[f"{q}@{eta:g}:eigh-{form}"] = rel(get_manifold(name, form).retract(X), ref_f)
                    row[f"{q}@{eta:g}:svd-float32"] = rel(_svd_retract(X, form), ref_f)
            else:
                ref_x = _ref_retract(name, X.double(), retraction)
                row[f"R@{eta:g}:msign-auto"] = rel(mf.retract(X), ref_x)
                row[f"R@{eta:g}:msign-direct"] = rel(msign(X, method="direct"), ref_x)
                row[f"R@{eta:g}:msign-gram"] = rel(msign(X, method="gram"), ref_x)
                row[f"R@{eta:g}:released"] = rel(msign(X, precision="bfloat16"), ref_x)
        out.append(row)
    for row in out:
        for k in [k for k in row if k.startswith("W_training@")]:
            del row[k]
    return out


# -- the verdicts -----------------------------------------------------------------------------------
def summarize(rows: list[dict]) -> dict:
    """Per manifold and quantity, each path's median and max error and its verdict against released."""
    table = {}
    for manifold in ("stiefel", "dgram", "none"):
        for posed in (True, False):
            mine = [r for r in rows if r["manifold"] == manifold and (r["sensitivity"] <= ILL_POSED) == posed]
            quantities = sorted({k.split(":")[0] for r in mine for k in r if ":" in k})
            for q in quantities if posed else [q for q in quantities if q == "A"]:
                paths = sorted({k.split(":", 1)[1] for r in mine for k in r if k.startswith(q + ":")})
                for path in paths:
                    vals = [r[f"{q}:{path}"] for r in mine if f"{q}:{path}" in r]
                    table[(manifold, q if posed else "A(ill-posed)", path)] = {
                        "median": statistics.median(vals), "max": max(vals), "n": len(vals)}
    verdicts = {}
    held = ("A", "W@1")
    for (manifold, q, path), v in table.items():
        base_key = "released"
        if q.startswith(("R@", "Rc@")):
            if (manifold, q, "released") in table:
                base = table[(manifold, q, "released")]
            elif (manifold, q, "svd-float32") in table:
                base, base_key = table[(manifold, q, "svd-float32")], "svd-float32"
            else:
                continue
        elif q in held:
            if (manifold, q, "released") not in table:
                continue
            base = table[(manifold, q, "released")]
        else:
            continue
        if path in ("released", base_key, "reference"):
            continue
        ok = v["median"] <= base["median"] and v["max"] <= base["max"]
        verdicts[f"{manifold} {q} {path}"] = "ok" if ok else "EXCEEDS"
    return {"table": {" ".join(k): v for k, v in table.items()}, "verdicts": verdicts}


def print_summary(summary: dict) -> None:
    print("| manifold | quantity | path | median | max | n | verdict (vs released) |  (relative errors)")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key, v in summary["table"].items():
        verdict = summary["verdicts"].get(key, "")
        manifold, q, path = key.split(" ", 2)
        print(f"| {manifold} | {q} | {path} | {v['median']:.2e} | {v['max']:.2e} | {v['n']} | {verdict} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="captures and their training logs (reused)")
    ap.add_argument("--jobs", type=int, default=2, help="trainings in parallel, one thread each")
    ap.add_argument("--only", nargs="+", default=None, help="source labels to measure (default: all)")
    ap.add_argument("--json", type=Path, default=None, help="write every row and the summary here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.chdir(ROOT)  # configs name their data folders relative to the repository
    sources = [s for s in SOURCES if args.only is None or s.label in args.only]
    args.workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        files = list(pool.map(lambda s: capture(s, args.workdir.resolve(), 1), sources))
    rows = []
    for src, got in zip(sources, files):
        from mwm.config import load_config

        eta = load_config(str(ROOT / src.config), list(src.overrides))["train"]["muon_lr"]
        etas = tuple(sorted({float(eta), 1.0}))
        for label, path in got.items():
            rows += measure_file(path, src, etas)
            print(f"measured {src.label} {label}: {len(rows)} matrices so far", file=sys.stderr)
    summary = {}
    for group in ("all", *sorted({r["source"] for r in rows})):
        mine = rows if group == "all" else [r for r in rows if r["source"] == group]
        summary[group] = summarize(mine)
    print("## every capture\n")
    print_summary(summary["all"])
    for group in summary:
        if group != "all":
            print(f"\n## {group}\n")
            print_summary(summary[group])
    bad = [k for k, v in summary["all"]["verdicts"].items() if v != "ok"]
    print("\nexceeding the released protocol: " + (", ".join(bad) if bad else "none"))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
