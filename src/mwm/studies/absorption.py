"""Does the retraction absorb the error of an early-stopped dual ascent?

For each msign precision of ``studies.precisions`` (the first, bfloat16 by default,
is the faithful protocol: every msign, the dual ascent's, the Stiefel init's and the
Stiefel retraction's, as released; float32 is the control), each manifold variant
and size ``n``, ``seeds`` random square pairs ``(W, G)``
(:func:`mwm.studies.common.random_pairs`); one dual ascent run of
``reference_iterations`` iterations at ``alpha`` gives the reference ``A_ref`` (its
last iterate) and the snapshots ``A_T``. With ``W_T = retract(W - eta A_T)``:

``e_A(T)``  ``||A_T - A_ref||_F / ||A_ref||_F`` (the paper's)
``e_W(T)``  ``||W_T - W_ref||_F / ||W_ref||_F`` (the paper's)
``e_pre(T)``  ``||eta (A_T - A_ref)||_F / ||W - eta A_ref||_F``: the same error of the
    weight *before* the retraction. ``e_A / e_pre`` is about ``||W|| / (eta ||A||)``
    (``1/eta = 10`` for a Stiefel W), a factor that comes from comparing a direction
    with a weight, not from the retraction; ``e_pre / e_W`` is what the retraction
    itself removes.
``e_W_step(T)``  ``||W_T - W_ref||_F / ||W_ref - W||_F``: the weight error relative to
    the size of the step.

The same measurement runs on ``(W, G)`` pairs captured in training (``--pairs FILE``,
an NPZ with ``names``, ``manifolds``, ``W_<i>``, ``G_<i>``): each pair's weight is
used as it is (possibly slightly off the manifold), with every configured variant of
its manifold (``dgram`` pairs with each configured DGram retraction, the released
one if none is configured), in the faithful precision. Pairs of plain-Muon or AdamW
parameters are skipped. Several files may be given in order of preference: the first
that holds captured pairs is used. A run that has none (AdamW only, or unstable before
the capture step) writes a file with ``captured = False`` and its ``reason``; such files
are passed over and listed with their reasons in ``absorption_derived.json``
(``pairs_not_captured``), and with no captured file at all the study runs on random
pairs only. A file that cannot be read (truncated, not an NPZ, a member that does not
decompress) is passed over the same way, its reason naming the file and the error.

Outputs under ``--out``: ``absorption.csv`` (``manifold, precision, n, seed, T, e_A,
e_pre, e_W, e_W_step, violation``), ``absorption_summary.csv`` (seed means),
``absorption_pairs.csv`` (``index, name, file_manifold, manifold, m, n, g_scaling, g_rms,
w_residual, T, e_A, e_pre, e_W, e_W_step, violation``; the header alone without pairs) and
``absorption_derived.json``; their names come from :mod:`mwm.workflow.stages`.
"""

from __future__ import annotations

import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from mwm import paper
from mwm.optim.dual_ascent import dual_ascent
from mwm.optim.manifolds import Manifold
from mwm.config.names import STUDY_MANIFOLDS
from mwm.studies.common import (chunks, main_for, random_pairs, rel_error, resolve_device, run_meta, variant_manifold,
                     write_csv, write_json)
from mwm.workflow.stages import STAGES

#: This study's output files (mwm.workflow.stages): the writers name them by key.
FILES = STAGES["absorption"]

__all__ = ["measure_absorption", "load_pairs", "run_absorption", "derive_absorption", "main"]

PAPER = {c.id: {"paper": c.paper, "section": c.section, "rule": c.rule.describe()}
         for c in paper.CLAIMS if c.id.startswith("absorb.")}
METRICS = ("e_A", "e_pre", "e_W", "e_W_step", "violation")


@torch.no_grad()
def measure_absorption(W: torch.Tensor, G: torch.Tensor, mf: Manifold, alpha: float, ref_iters: int,
                       snapshots: Sequence[int], eta: float, precision: str = "float32"
                       ) -> dict[int, dict[str, torch.Tensor]]:
    """``{T: {metric: (batch,) tensor}}`` for a batch of pairs (see the module doc)."""
    Ts = sorted(set(int(t) for t in snapshots))
    res = dual_ascent(W, G, mf, alpha=alpha, steps=ref_iters, record_violations=True, snapshots=Ts,
                      precision=precision)
    A_ref = res.A
    pre_ref = W - eta * A_ref
    W_ref = mf.retract(pre_ref, precision=precision)
    step_ref = W_ref - W
    out = {}
    for T in Ts:
        A_T = res.snapshots[T]
        W_T = mf.retract(W - eta * A_T, precision=precision)
        out[T] = {
            "e_A": rel_error(A_T - A_ref, A_ref),
            "e_pre": rel_error(eta * (A_T - A_ref), pre_ref),
            "e_W": rel_error(W_T - W_ref, W_ref),
            "e_W_step": rel_error(W_T - W_ref, step_ref),
            "violation": res.violations[T - 1].double(),
        }
        out[T] = {k: v.cpu() for k, v in out[T].items()}
    return out


def _check_snapshots(sec: dict) -> list[int]:
    Ts = sorted(sec["snapshots"])
    bad = [t for t in Ts if t >= sec["reference_iterations"]]
    if bad:
        raise ValueError(f"studies.absorption.snapshots {bad} must be below reference_iterations="
                         f"{sec['reference_iterations']} (the reference is the last iterate)")
    return Ts


# -- training pairs --------------------------------------------------------------------

#: what reading a damaged NPZ raises (numpy passes the zip module's and zlib's errors on)
_DAMAGED = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


class DamagedFile(ValueError):
    """A pairs file that cannot be read at all (truncated, not an NPZ): passed over."""


def _missing(path: Path) -> FileNotFoundError:
    hint = (" (dotted overrides go before --pairs, which takes every argument after it)"
            if "=" in path.name else "")
    if path.name == "pairs.npz" and (path.parent / "summary.json").is_file():
        hint = (" beside its run's summary.json: a run restored from published records keeps no captured pairs "
                "(docs/published.md); delete the run folder to retrain it")
    return FileNotFoundError(f"pairs file {path} does not exist{hint}")


def not_captured_reason(path: str | Path) -> str | None:
    """The reason a training run gave for holding no pairs (``captured = False`` in
    its file), or None for a file of captured pairs; :class:`DamagedFile` naming the
    file for one that cannot be read (truncated, not an NPZ)."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "captured" not in npz.files or bool(npz["captured"]):
                return None
            return str(npz["reason"]) if "reason" in npz.files else "not captured (no reason given)"
    except _DAMAGED as exc:
        raise DamagedFile(f"pairs file {path} is not a readable NPZ ({type(exc).__name__}: {exc})") from exc


def choose_pairs(paths: Sequence[str | Path]) -> tuple[str | None, list[dict] | None, list[dict]]:
    """(the first file of captured pairs, its pairs, the files passed over with their
    reasons): a file without captured pairs, or one that cannot be read at all, is
    passed over for the next in the list (its reason says which); a readable file of
    malformed pairs (a key missing, NaN) is an error."""
    passed = []
    for path in paths:
        try:
            reason = not_captured_reason(path)
            if reason is None:
                return str(path), load_pairs(path), passed
        except DamagedFile as exc:  # unreadable: named, and the next file is tried (bad content fails)
            passed.append({"file": str(path), "reason": str(exc), "damaged": True})
            continue
        passed.append({"file": str(path), "reason": reason})
    return None, None, passed


def load_pairs(path: str | Path) -> list[dict]:
    """Read an NPZ of training pairs; errors name the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file
        raise DamagedFile(f"pairs file {path} is not a readable NPZ ({type(exc).__name__}: {exc})") from exc
    try:
        with npz:
            return _read_pairs(path, npz)
    except ValueError:
        raise
    except _DAMAGED as exc:  # a member that does not decompress: a damaged file
        raise DamagedFile(f"pairs file {path} is damaged ({type(exc).__name__}: {exc})") from exc


def _read_pairs(path: Path, npz) -> list[dict]:
    for key in ("names", "manifolds"):
        if key not in npz.files:
            raise ValueError(f"pairs file {path} has no key {key!r} (keys: {', '.join(npz.files)})")
    names = [str(x) for x in np.atleast_1d(npz["names"])]
    mans = [str(x) for x in np.atleast_1d(npz["manifolds"])]
    if len(names) != len(mans):
        raise ValueError(f"pairs file {path}: 'names' has {len(names)} entries, 'manifolds' {len(mans)}")
    pairs = []
    for i, (name, man) in enumerate(zip(names, mans)):
        arrs = {}
        for k in ("W", "G"):
            key = f"{k}_{i}"
            if key not in npz.files:
                raise ValueError(f"pairs file {path} has no key {key!r} for pair {i} ({name})")
            a = npz[key]
            if a.ndim != 2 or not np.issubdtype(a.dtype, np.floating):
                raise ValueError(f"pairs file {path}: {key} must be a 2-D float array, got "
                                 f"{a.dtype} of shape {a.shape}")
            if not np.isfinite(a).all():
                raise ValueError(f"pairs file {path}: {key} ({name}) has NaN or Inf entries")
            arrs[k] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        if arrs["W"].shape != arrs["G"].shape:
            raise ValueError(f"pairs file {path}: W_{i} {tuple(arrs['W'].shape)} and G_{i} "
                             f"{tuple(arrs['G'].shape)} differ in shape ({name})")
        pairs.append({"index": i, "name": name, "manifold": man, "W": arrs["W"], "G": arrs["G"]})
    return pairs


def pair_variants(file_manifold: str, configured: Sequence[str]) -> list[str]:
    """Variants a pair of ``file_manifold`` is measured with ([] to skip it)."""
    if file_manifold in STUDY_MANIFOLDS:
        return [file_manifold]
    if file_manifold == "dgram":
        return [v for v in configured if v.startswith("dgram-")] or ["dgram-paper"]
    return []


@torch.no_grad()
def run_pairs(sec: dict, pairs: list[dict], device: torch.device, max_elements: int, log=print,
              precision: str = "float32") -> tuple[list[tuple], list[dict]]:
    Ts = _check_snapshots(sec)
    scalings = ["as_is", "unit_rms"] if sec["pairs_rescale_g"] else ["as_is"]
    rows, skipped = [], []
    jobs: dict[tuple, list[dict]] = {}
    for p in pairs:
        vs = pair_variants(p["manifold"], sec["manifolds"])
        if not vs:
            skipped.append({"name": p["name"], "manifold": p["manifold"],
                            "reason": "not a manifold-constrained weight (plain Muon / AdamW / unknown)"})
            continue
        for v in vs:
            for sc in scalings:
                jobs.setdefault((v, sc, tuple(p["W"].shape)), []).append(p)
    for (v, sc, shape), group in jobs.items():
        mf = variant_manifold(v)
        t1 = time.perf_counter()
        W = torch.stack([p["W"] for p in group])
        G = torch.stack([p["G"] for p in group])
        g_rms = G.double().square().mean(dim=(-2, -1)).sqrt()
        if sc == "unit_rms":
            G = (G / g_rms.clamp_min(1e-30)[:, None, None].float())
        w_res = mf.constraint_residual(W).double()
        for sl in chunks(len(group), shape[0] * shape[1], max_elements):
            r = measure_absorption(W[sl].to(device), G[sl].to(device), mf, sec["alpha"],
                                   sec["reference_iterations"], Ts, sec["eta"], precision)
            for j, p in enumerate(group[sl]):
                jj = sl.start + j
                for T in Ts:
                    rows.append((p["index"], p["name"], p["manifold"], v, shape[0], shape[1], sc, float(g_rms[jj]),
                                 float(w_res[jj]), T) + tuple(float(r[T][k][j]) for k in METRICS))
        log(f"absorption pairs: {v:>13} {sc:<8} {shape[0]}x{shape[1]}: {len(group)} pairs, "
            f"{time.perf_counter() - t1:.1f} s")
    return rows, skipped


# -- the study -------------------------------------------------------------------------------

def run_absorption(cfg: dict, out: str | Path, config_path: str | None = None,
                   pairs: str | Sequence[str] | None = None, log=print) -> dict:
    """Run the absorption study (random pairs, plus training pairs when given: one file or
    several in order of preference, see the module doc) into ``out``."""
    studies = cfg["studies"]
    sec = studies["absorption"]
    device = resolve_device(studies["device"])
    out = Path(out)
    Ts = _check_snapshots(sec)
    candidates = pairs if pairs is not None else sec["pairs"]
    if isinstance(candidates, (str, Path)):
        candidates = [candidates]
    pairs_path, loaded, passed = choose_pairs(candidates or [])  # fail early on a bad file
    for p in passed:
        log(f"absorption: passing over {p['file']}: {p['reason']}")
        if p.get("damaged"):
            print(f"warning: {p['reason']}; passed over for the next file", file=sys.stderr)
    t0 = time.perf_counter()
    seeds = int(sec["seeds"])
    precisions = list(studies["precisions"])
    rows = []
    for prec in precisions:
        for variant in sec["manifolds"]:
            mf = variant_manifold(variant)
            for n in sec["sizes"]:
                t1 = time.perf_counter()
                W, G = random_pairs("absorption", variant, n, seeds, studies["seed"], sec["stiefel_init"],
                                    precision=prec)
                for sl in chunks(seeds, n * n, studies["max_batch_elements"]):
                    r = measure_absorption(W[sl].to(device), G[sl].to(device), mf, sec["alpha"],
                                           sec["reference_iterations"], Ts, sec["eta"], prec)
                    for j in range(sl.stop - sl.start):
                        for T in Ts:
                            rows.append((variant, prec, n, sl.start + j, T)
                                        + tuple(float(r[T][k][j]) for k in METRICS))
                log(f"absorption: {prec:<8} {variant:>13} n={n:<5} {seeds} seeds x {sec['reference_iterations']} "
                    f"it: {time.perf_counter() - t1:.1f} s")
    pair_rows, skipped = ([], [])
    if loaded is not None:
        pair_rows, skipped = run_pairs(sec, loaded, device, studies["max_batch_elements"], log, precisions[0])
    wall = time.perf_counter() - t0

    write_csv(out / FILES.file("rows"), ["manifold", "precision", "n", "seed", "T", *METRICS], rows)
    summary = _summarise(rows)
    write_csv(out / FILES.file("summary"),
              ["manifold", "precision", "n", "T", "seeds"] + [f"{k}_mean" for k in METRICS]
              + [f"{k}_std" for k in METRICS], summary)
    pair_cols = ["index", "name", "file_manifold", "manifold", "m", "n", "g_scaling", "g_rms", "w_residual", "T",
                 *METRICS]
    write_csv(out / FILES.file("pairs"), pair_cols, pair_rows)  # header only without pairs: a declared output
    derived = derive_absorption(sec, summary, pair_rows if loaded is not None else None, skipped, precisions)
    derived["pairs_file"] = str(pairs_path) if pairs_path else None
    derived["pairs_not_captured"] = passed
    derived["pairs_precision"] = precisions[0] if pairs_path else None
    derived["meta"] = run_meta(sec, device, wall, config_path, precisions)
    write_json(out / FILES.file("derived"), derived)
    return derived


def _summarise(rows: list[tuple]) -> list[tuple]:
    groups: dict[tuple, list[tuple]] = {}
    for r in rows:
        groups.setdefault((r[0], r[1], r[2], r[4]), []).append(r[5:])
    out = []
    for (v, p, n, T), vals in groups.items():
        a = np.asarray(vals, dtype=np.float64)
        std = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros(a.shape[1])
        out.append((v, p, n, T, len(a), *a.mean(axis=0).tolist(), *std.tolist()))
    return out


def _ratio(a, b):
    return a / b if (a is not None and b is not None and b > 0) else None


def _curve_stats(table: dict, sec: dict) -> dict:
    """Derived numbers of one curve family ``{T: {metric: value}}``."""
    rT = sec["report_T"]
    f1, f2 = sec["flatness_T"]
    d = {"T": rT}
    if rT not in table:
        d.update({"e_A": None, "e_W": None, "compression": None, "retraction_factor": None,
                  "reason": f"report_T={rT} is not among studies.absorption.snapshots"})
    else:
        eA, eW, ep = table[rT]["e_A"], table[rT]["e_W"], table[rT]["e_pre"]
        d.update({"e_A": eA, "e_pre": ep, "e_W": eW, "e_W_step": table[rT]["e_W_step"],
                  "compression": _ratio(eA, eW), "direction_to_weight_factor": _ratio(eA, ep),
                  "retraction_factor": _ratio(ep, eW)})
    if f1 in table and f2 in table:
        d["flatness"] = {"T": [f1, f2], "e_W_ratio": _ratio(table[f1]["e_W"], table[f2]["e_W"]),
                         "e_A_ratio": _ratio(table[f1]["e_A"], table[f2]["e_A"])}
    else:
        d["flatness"] = {"T": [f1, f2], "e_W_ratio": None, "e_A_ratio": None,
                         "reason": f"flatness_T {[f1, f2]} not both among studies.absorption.snapshots"}
    Ts = sorted(table)
    eA = [table[T]["e_A"] for T in Ts]
    k = int(np.argmax(eA))
    d["e_A_peak_T"] = Ts[k]
    d["e_A_monotone_decreasing"] = bool(all(eA[i] >= eA[i + 1] for i in range(len(eA) - 1)))
    return d


def _range(vals):
    vals = [v for v in vals if v is not None]
    return [min(vals), max(vals)] if vals else None


def derive_absorption(sec: dict, summary: list[tuple], pair_rows: list[tuple] | None, skipped: list[dict],
                      precisions: Sequence[str] = ("float32",)) -> dict:
    """``manifolds``: the faithful protocol's (``precisions[0]``) random-pair study;
    ``protocols[p]["manifolds"]``: every precision's; ``pairs``: the training pairs."""
    precisions = list(precisions)
    out = {"faithful": precisions[0], "precisions": precisions, "protocols": {}, "alpha": sec["alpha"],
           "eta": sec["eta"], "reference_iterations": sec["reference_iterations"],
           "snapshots": sorted(sec["snapshots"]), "seeds": sec["seeds"], "stiefel_init": sec["stiefel_init"],
           "paper": PAPER, "note": (
               "compression = e_A / e_W (the paper's). It factors into direction_to_weight_factor = e_A / e_pre "
               "(about ||W||_F / (eta ||A||_F) = 1/eta for a Stiefel W: comparing a direction with a weight, "
               "no retraction involved) times retraction_factor = e_pre / e_W (what the retraction removes)."),
           "manifolds": {}}
    cols = ["e_A", "e_pre", "e_W", "e_W_step", "violation"]
    by: dict[tuple, dict] = {}
    for r in summary:
        by.setdefault((r[0], r[1], r[2]), {})[r[3]] = dict(zip(cols, r[5:5 + len(cols)]))
    for prec in precisions:
        out["protocols"][prec] = {"manifolds": _derive_manifolds(sec, by, prec)}
    out["manifolds"] = out["protocols"][precisions[0]]["manifolds"]
    if pair_rows is not None:
        out["pairs"] = _derive_pairs(sec, pair_rows, skipped, cols)
    return out


def _derive_manifolds(sec: dict, by: dict, prec: str) -> dict:
    res = {}
    for variant in sec["manifolds"]:
        per = {}
        for n in sorted(sec["sizes"]):
            per[str(n)] = _curve_stats(by[(variant, prec, n)], sec)
        res[variant] = {
            "per_size": per,
            "ranges_over_sizes": {
                "e_A": _range([p["e_A"] for p in per.values()]),
                "e_W": _range([p["e_W"] for p in per.values()]),
                "compression": _range([p["compression"] for p in per.values()]),
                "retraction_factor": _range([p.get("retraction_factor") for p in per.values()]),
                "flatness_e_W": _range([p["flatness"]["e_W_ratio"] for p in per.values()]),
            },
        }
    return res


def _derive_pairs(sec: dict, pair_rows: list[tuple], skipped: list[dict], cols: list[str]) -> dict:
    tables: dict[tuple, dict] = {}
    info = {}
    for r in pair_rows:
        key = (r[0], r[3], r[6])  # index, variant, g_scaling
        tables.setdefault(key, {})[r[9]] = dict(zip(cols, r[10:10 + len(cols)]))
        info[key] = {"index": r[0], "name": r[1], "file_manifold": r[2], "manifold": r[3],
                     "shape": [r[4], r[5]], "g_scaling": r[6], "g_rms": r[7], "w_residual": r[8]}
    per_pair = [{**info[k], **_curve_stats(t, sec)} for k, t in tables.items()]
    agg = {}
    for p in per_pair:
        agg.setdefault(f"{p['manifold']}/{p['g_scaling']}", []).append(p)
    return {
        "per_pair": per_pair,
        "by_manifold": {k: {"pairs": len(v),
                            "compression": _range([p["compression"] for p in v]),
                            "compression_median": float(np.median([p["compression"] for p in v
                                                                   if p["compression"] is not None]))
                            if any(p["compression"] is not None for p in v) else None,
                            "e_W": _range([p["e_W"] for p in v]),
                            "e_A": _range([p["e_A"] for p in v]),
                            "retraction_factor": _range([p.get("retraction_factor") for p in v])}
                        for k, v in agg.items()},
        "skipped": skipped,
    }


def main(argv=None) -> int:
    return main_for(
        "python -m mwm.studies.absorption",
        "Absorption study: e_A(T), e_W(T) of early-stopped dual ascent against a long reference run, on random "
        "square pairs per manifold variant and size, and on (W, G) pairs captured in training (--pairs).",
        run_absorption,
        extra=lambda p: p.add_argument("--pairs", default=None, nargs="+", metavar="NPZ",
                                       help="NPZ(s) of training (W, G) pairs, in order of preference: the "
                                            "first with captured pairs is used (overrides "
                                            "studies.absorption.pairs)"),
        extra_kwargs=lambda a: {"pairs": a.pairs},
        argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
