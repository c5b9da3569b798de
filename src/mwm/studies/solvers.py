"""Inner solvers on in-training sequences: accuracy against cost.

The (W, momentum direction) pair of every Muon matrix at ``capture_length`` consecutive
steps from ``capture_start`` is captured, per assignment (``studies.solvers.assignments``,
Stiefel and DGram by default), by :mod:`mwm.train` itself: with ``source: grid`` the grid's
own run of the assignment at ``studies.solvers.seed`` captures them while it trains (no
training twice), with ``source: own`` a short capture training that the study runs
(``train.capture_sequence``). On every captured
step each candidate solver (:mod:`mwm.optim.solvers`: the paper's dual ascent cold or
warm-started, with or without a tolerance stop, and ADMM) solves the bank of each
manifold and shape as the optimizer would; a warm-started candidate carries its
own final multiplier from the previous captured step, as it would in training.
Accuracy is measured as the absorption study defines it, against a cold dual
ascent of ``reference_iterations`` at alpha 0.1 on the same pair, with ``eta`` the
run's Muon learning rate at that step:

``e_W``  ``||retract(W - eta A) - retract(W - eta A_ref)||_F / ||retract(W - eta A_ref)||_F``
``e_A``  ``||A - A_ref||_F / ||A_ref||_F``

A second reference, ``e_W_conv`` / ``e_A_conv``, is a long ADMM run
(``converged_iterations``) solved scale-normalized (on ``W / sigma_max``,
:func:`mwm.optim.solvers.scaled_solve`; the plain ADMM loses its way on large DGram weights); the
derived JSON gives both references' final ``||P(W^T A + A^T W)||_RMS``. ``align`` is each
candidate's alignment with the momentum, ``tr(G^T A) / ||G||_*`` (matrix mean), ``align_conv``
the converged reference's: what the constraint allows. With ``normalized: true`` every
candidate also runs scale-normalized, as ``<candidate>-norm``. On training momentum (``||G||_RMS ~ 1e-3``) the cold
dual ascent at alpha 0.1 is far from converged after 200 iterations (its step
``alpha H`` is absolute while the multiplier scales with ``G``), so the dual-ascent
reference measures closeness to the paper's own trajectory, the converged one
closeness to the solution of the inner problem.

Cost: ``msign_eq``, the msign calls of the batched solve (iterations of the batch
times 1 for dual ascent, 2 for ADMM) charged to each of its matrices, and the
wall time of the solves, measured in the same loop as the paper's baseline (cold,
``baseline_steps`` = 20 iterations).

Outputs under ``--out``: ``solvers.csv`` (``candidate, solver, warm, steps, tol, rho,
manifold, step, matrices, e_W, e_A, e_W_max, iterations, msign_eq, wall_s, e_W_conv,
e_A_conv``; one row
per candidate, manifold and captured step, means over the step's matrices),
``solvers_summary.csv`` (means over steps, with the cost ratios to the baseline) and
``solvers_derived.json`` (the baseline's e_W and cost per manifold, the cheapest
candidate whose mean and worst-step e_W are no worse than the baseline's, a tie in cost going to
the smaller e_W, and whether it costs at most half). The study's own capture trainings stay under ``--out/_train``
(``--sequence RUN_DIR ...`` uses existing runs' ``sequence/`` folders instead). A capture training
that diverges before the end of its window (marked ``unstable`` by :mod:`mwm.train`)
captures nothing usable: its assignment is listed under ``not_captured`` in the
derived JSON with the reason (``unstable at step N``), the other assignments are
measured as usual, and with none captured the CSVs hold their headers only, like the
absorption study without captured pairs.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from mwm.config import ConfigError
from mwm.io import read_csv_rows
from mwm.plan.runs import RESULTS_ROOT, capture_variants, run_dir
from mwm.optim.manifolds import get_manifold
from mwm.optim.solvers import SolverSettings, msign_per_iteration, solve
from mwm.studies.absorption import load_pairs
from mwm.studies.common import main_for, rel_error, resolve_device, run_meta, write_csv, write_json
from mwm.workflow.stages import STAGES

#: This study's output files (mwm.workflow.stages): the writers name them by key.
FILES = STAGES["solvers"]

__all__ = ["candidates", "parse_candidate", "capture_sequences", "read_captures", "load_sequence", "measure_sequence",
           "run_solvers", "main"]

COLUMNS = ["candidate", "solver", "warm", "steps", "tol", "rho", "manifold", "step", "matrices", "e_W", "e_A",
           "e_W_max", "iterations", "msign_eq", "wall_s", "e_W_conv", "e_A_conv", "normalize", "align", "align_conv"]


def candidates(sec: dict) -> list[dict]:
    """The candidate solvers of the study section, baseline first."""
    out = [dict(solver="dual_ascent", warm=False, steps=sec["baseline_steps"], tol=None, rho=None)]
    for T in sec["dual_ascent_steps"]:
        out.append(dict(solver="dual_ascent", warm=False, steps=T, tol=None, rho=None))
    for T in sec["warm_steps"]:
        out.append(dict(solver="dual_ascent", warm=True, steps=T, tol=None, rho=None))
    for tol in sec["tols"]:
        out.append(dict(solver="dual_ascent", warm=True, steps=sec["baseline_steps"], tol=tol, rho=None))
    for rho in sec["admm_rho"]:
        for T in sec["admm_steps"]:
            out.append(dict(solver="admm", warm=False, steps=T, tol=None, rho=rho))
            out.append(dict(solver="admm", warm=True, steps=T, tol=None, rho=rho))
        for tol in sec["tols"]:
            out.append(dict(solver="admm", warm=True, steps=max(sec["admm_steps"]), tol=tol, rho=rho))
    out = [dict(c, normalize=False) for c in out]
    if sec.get("normalized"):
        out += [dict(c, normalize=True) for c in out]
    seen, unique = set(), []
    for c in out:
        c["name"] = (f"{'da' if c['solver'] == 'dual_ascent' else 'admm'}-{'warm' if c['warm'] else 'cold'}"
                     f"-T{c['steps']}" + (f"-tol{c['tol']:g}" if c["tol"] is not None else "")
                     + (f"-rho{c['rho']:g}" if c["rho"] is not None else "") + ("-norm" if c["normalize"] else ""))
        if c["name"] not in seen:
            seen.add(c["name"])
            unique.append(c)
    return unique


def parse_candidate(name: str) -> dict:
    """A candidate from its name (``da-warm-T5``, ``admm-cold-T3-rho1``, ``da-warm-T20-tol0.001``,
    ``da-cold-T20-norm``)."""
    parts = name.split("-")
    try:
        if parts[0] not in ("da", "admm") or parts[1] not in ("warm", "cold") or not parts[2].startswith("T"):
            raise ValueError
        c = dict(name=name, solver="dual_ascent" if parts[0] == "da" else "admm", warm=parts[1] == "warm",
                 steps=int(parts[2][1:]), tol=None, rho=None, normalize=False)
        for extra in parts[3:]:
            if extra == "norm":
                c["normalize"] = True
            elif extra.startswith("tol"):
                c["tol"] = float(extra[3:])
            elif extra.startswith("rho"):
                c["rho"] = float(extra[3:])
            else:
                raise ValueError
    except (ValueError, IndexError):
        raise ValueError(f"bad solver candidate name {name!r}; expected e.g. da-warm-T5, admm-cold-T3-rho1, "
                         "da-warm-T20-tol0.001, da-cold-T20-norm") from None
    if c["solver"] == "admm" and c["rho"] is None:
        c["rho"] = 1.0
    return c


def capture_sequences(cfg: dict, sec: dict, out: Path, log=print, data=None) -> tuple[list[Path], list[dict]]:
    """Run the short trainings that capture the sequences: (the run folders that hold
    every captured step, ``[{assignment, run, reason}]`` of those that do not). ``data``: their token
    dataset (None: the config's prepared one)."""
    import signal

    from mwm.plan.runs import run_dir
    from mwm.train.cli import train

    dirs, missing = [], []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    for assignment in sec["assignments"]:
        c = copy.deepcopy(cfg)
        stop = sec["capture_start"] + sec["capture_length"]
        c["train"].update(max_iters=stop, lr_decay_iters=max(stop, c["train"]["lr_decay_iters"]),
                          eval_interval=stop, checkpoint_interval=stop, keep_final_checkpoint=False,
                          capture_pairs_step=None,
                          capture_sequence={"start": sec["capture_start"], "length": sec["capture_length"]})
        c["grid"]["assignments"] = [assignment]
        try:
            rc = train(c, assignment, sec["seed"], out_root=out, data=data)
        finally:  # train() installs its checkpoint-on-signal handlers; the study must stay killable
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        d = run_dir(out, c["name"], assignment, sec["seed"])
        if rc != 0:
            raise ValueError(f"the capture training of {assignment} exited with {rc} (see its log above and {d})")
        reason = capture_missing(d, sec)
        if reason is not None:  # a diverged capture training: the study says so and goes on
            log(f"solvers: {assignment} not captured: {reason}")
            missing.append({"assignment": assignment, "run": str(d), "reason": reason})
            continue
        log(f"solvers: captured {sec['capture_length']} steps of {assignment} under {d}")
        dirs.append(d)
    return dirs, missing


def read_captures(runs: list[Path], sec: dict, log=print) -> tuple[list[Path], list[dict]]:
    """Run folders that captured sequences already (``--sequence``, or the grid's runs with
    ``source: grid``), split as :func:`capture_sequences` does: those holding the window, and
    ``[{assignment, run, reason}]`` of those that went unstable before its end. A run of the
    grid that is not finished, or holds no ``sequence/``, is an error naming it."""
    dirs, missing = [], []
    for run in runs:
        if not (run / "sequence").is_dir():
            raise FileNotFoundError(f"{run}: no sequence/ folder (not trained yet; not a run that captures: see "
                                    "studies.solvers.source, assignments and seed; or restored from published "
                                    "records, which keep no captures: delete the run folder to retrain it)")
        summary = run / "summary.json"
        if not summary.is_file() and not any((run / "sequence").glob("step_*.npz")):
            raise FileNotFoundError(f"{run}: no summary.json and no captured step (the run has not finished)")
        reason = capture_missing(run, sec) if summary.is_file() else None
        if reason is not None:
            name = run.parent.name
            log(f"solvers: {name} not captured: {reason}")
            missing.append({"assignment": name, "run": str(run), "reason": reason})
            continue
        dirs.append(run)
    return dirs, missing


def capture_missing(run: Path, sec: dict) -> str | None:
    """Why the capture training in ``run`` holds fewer than ``capture_length`` captured
    steps from ``capture_start`` (None: it holds them all): it went unstable and stopped
    first. A run that did not and still lacks steps is an error (ValueError)."""
    want = range(sec["capture_start"], sec["capture_start"] + sec["capture_length"])
    have = [s for s in want if (run / "sequence" / f"step_{s:06d}.npz").is_file()]
    if len(have) == len(want):
        return None
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    where = f"captured {len(have)} of steps {want.start}-{want.stop - 1}"
    if summary.get("status") == "unstable":
        return (f"unstable at step {summary.get('onset_step')} (the capture training stopped at step "
                f"{summary.get('steps_done')}; {where})")
    raise ValueError(f"the capture training in {run} ended with status {summary.get('status', 'unknown')} but "
                     f"{where} (see {run / 'summary.json'})")


def load_sequence(run: Path) -> list[dict]:
    """The captured steps of a run folder: ``[{step, eta, pairs}]`` in step order."""
    run = Path(run)
    files = sorted((run / "sequence").glob("step_*.npz"))
    if not files:
        raise FileNotFoundError(f"run folder {run} has no sequence/step_*.npz (train.capture_sequence unset?)")
    lrs = {int(r["step"]): float(r["muon_lr"]) for r in read_csv_rows(run / "metrics.csv")}
    out = []
    for f in files:
        step = int(f.stem.split("_")[1])
        if step not in lrs:
            raise ValueError(f"{run / 'metrics.csv'} has no row for captured step {step}")
        pairs = [p for p in load_pairs(f) if p["manifold"] in ("stiefel", "dgram")]
        out.append({"step": step, "eta": lrs[step], "pairs": pairs})
    steps = [s["step"] for s in out]
    if steps != list(range(steps[0], steps[0] + len(steps))):
        raise ValueError(f"{run / 'sequence'}: captured steps are not consecutive ({steps[:3]}...)")
    return out


def _banks(pairs: list[dict]) -> dict[tuple, list[dict]]:
    """Pairs grouped as the optimizer's banks: manifold and tall shape."""
    banks: dict[tuple, list[dict]] = {}
    for p in pairs:
        m, n = p["W"].shape
        banks.setdefault((p["manifold"], max(m, n), min(m, n)), []).append(p)
    return banks


@torch.no_grad()
def measure_sequence(seq: list[dict], cands: list[dict], sec: dict, retraction: str, device: torch.device,
                     log=print, reference_violations: list | None = None) -> list[tuple]:
    """Rows of ``solvers.csv`` for one captured sequence; appends ``(manifold, final
    ||H||_RMS of the dual-ascent reference, of the converged ADMM reference)`` per bank
    and step to ``reference_violations``."""
    rows = []
    warm: dict[tuple, torch.Tensor] = {}
    ref_viol = reference_violations if reference_violations is not None else []
    reference = SolverSettings.defaults(alpha=sec["alpha"], steps=sec["reference_iterations"])
    converged = SolverSettings.defaults(solver="admm", rho=1.0, steps=sec["converged_iterations"], normalize=True)
    settings = {c["name"]: SolverSettings.defaults(solver=c["solver"], alpha=sec["alpha"], rho=c["rho"] or 1.0,
                                                   steps=c["steps"], tol=c["tol"], normalize=c.get("normalize", False))
                for c in cands}
    for k, entry in enumerate(seq):
        eta = entry["eta"]
        for (man, m, n), bank in _banks(entry["pairs"]).items():
            mf = get_manifold(man, retraction)
            W = torch.stack([p["W"] if p["W"].shape[0] >= p["W"].shape[1] else p["W"].mT for p in bank]).to(device)
            G = torch.stack([p["G"] if p["G"].shape[0] >= p["G"].shape[1] else p["G"].mT for p in bank]).to(device)
            ref_run = solve(W, G, mf, reference, record_violations=True)
            ref = ref_run.A
            W_ref = mf.retract(W - eta * ref)
            conv_run = solve(W, G, mf, converged, record_violations=True)
            conv = conv_run.A
            W_conv = mf.retract(W - eta * conv)
            ref_viol.append((man, float(ref_run.violations[-1].max()), float(conv_run.violations[-1].max())))
            nuc = torch.linalg.matrix_norm(G, "nuc").clamp_min(1e-30)
            align_conv = ((G * conv).sum(dim=(-2, -1)) / nuc).cpu()
            key_bank = (man, m, n, tuple(p["name"] for p in bank))
            for c in cands:
                L0 = warm.get((c["name"], key_bank)) if c["warm"] else None
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = solve(W, G, mf, settings[c["name"]], Lambda0=L0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                if c["warm"]:
                    warm[(c["name"], key_bank)] = res.Lambda
                W_new = mf.retract(W - eta * res.A)
                e_W = rel_error(W_new - W_ref, W_ref).cpu()
                e_A = rel_error(res.A - ref, ref).cpu()
                e_W_conv = rel_error(W_new - W_conv, W_conv).cpu()
                e_A_conv = rel_error(res.A - conv, conv).cpu()
                align = ((G * res.A).sum(dim=(-2, -1)) / nuc).cpu()
                rows.append([c["name"], c["solver"], c["warm"], c["steps"], c["tol"], c["rho"], man, entry["step"],
                             len(bank), e_W, e_A, res.iterations * msign_per_iteration(c["solver"]), wall,
                             e_W_conv, e_A_conv, c.get("normalize", False), align, align_conv])
        if k % 10 == 0:
            log(f"solvers: step {entry['step']} ({k + 1}/{len(seq)})")
    # one row per candidate, manifold and step: means over the step's banks (weighted by matrices)
    merged: dict[tuple, list] = {}
    for r in rows:
        key = (r[0], r[6], r[7])
        if key not in merged:
            merged[key] = r[:8] + [0, [], [], [], 0.0, [], [], r[15], [], []]
        acc = merged[key]
        acc[8] += r[8]
        acc[9].append(r[9])
        acc[10].append(r[10])
        acc[11].extend([r[11]] * r[8])
        acc[12] += r[12]
        acc[13].append(r[13])
        acc[14].append(r[14])
        acc[16].append(r[16])
        acc[17].append(r[17])
    out = []
    for acc in merged.values():
        e_W = torch.cat(acc[9]).double()
        e_A = torch.cat(acc[10]).double()
        msign_eq = float(np.mean(acc[11]))
        its = msign_eq / msign_per_iteration(acc[1])
        out.append(tuple(acc[:8]) + (acc[8], float(e_W.mean()), float(e_A.mean()), float(e_W.max()), its, msign_eq,
                                      acc[12], float(torch.cat(acc[13]).double().mean()),
                                      float(torch.cat(acc[14]).double().mean()), acc[15],
                                      float(torch.cat(acc[16]).double().mean()),
                                      float(torch.cat(acc[17]).double().mean())))
    return out


def summarise(rows: list[tuple], baseline: str) -> tuple[list[tuple], dict]:
    """Per candidate and manifold: means over steps, cost ratios to the baseline; and
    the derived verdicts."""
    groups: dict[tuple, list[tuple]] = {}
    for r in rows:
        groups.setdefault((r[0], r[6]), []).append(r)
    stats = {}
    for (cand, man), rs in groups.items():
        a = np.asarray([r[9:17] for r in rs], dtype=np.float64)  # e_W, e_A, e_W_max, its, msign_eq, wall, conv x2
        worst_step = float(np.max([r[9] for r in rs]))
        stats[cand, man] = dict(row=rs[0], steps=len(rs), e_W=float(a[:, 0].mean()), e_A=float(a[:, 1].mean()),
                                e_W_max=float(a[:, 2].max()), e_W_worst_step=worst_step,
                                iterations=float(a[:, 3].mean()), msign_eq=float(a[:, 4].mean()),
                                wall_s=float(a[:, 5].mean()), e_W_conv=float(a[:, 6].mean()),
                                e_A_conv=float(a[:, 7].mean()), align=float(np.mean([r[18] for r in rs])),
                                align_conv=float(np.mean([r[19] for r in rs])))
    summary, derived = [], {"baseline": baseline, "by_manifold": {}}
    for man in sorted({m for _, m in stats}):
        base = stats.get((baseline, man))
        if base is None:
            continue
        matching = []
        for (cand, m), s in stats.items():
            if m != man:
                continue
            s["msign_ratio"] = s["msign_eq"] / base["msign_eq"]
            s["wall_ratio"] = s["wall_s"] / base["wall_s"] if base["wall_s"] > 0 else None
            s["matches"] = s["e_W"] <= base["e_W"] and s["e_W_worst_step"] <= base["e_W_worst_step"]
            r = s["row"]
            summary.append((cand, r[1], r[2], r[3], r[4], r[5], man, s["steps"], s["e_W"], s["e_A"], s["e_W_max"],
                            s["e_W_worst_step"], s["iterations"], s["msign_eq"], s["wall_s"], s["msign_ratio"],
                            s["wall_ratio"], s["matches"], s["e_W_conv"], s["e_A_conv"], r[17], s["align"],
                            s["align_conv"]))
            if s["matches"] and cand != baseline:
                # cheapest by msign count; a tie goes to the more accurate, then the name (never the clock)
                matching.append((s["msign_eq"], s["e_W"], cand))
        best = min(matching) if matching else None
        fastest = min(((s["wall_s"], c) for (c, m), s in stats.items() if m == man and s["matches"]
                       and c != baseline), default=None)
        entry = {"baseline_e_W": base["e_W"], "baseline_e_W_worst_step": base["e_W_worst_step"],
                 "baseline_e_A": base["e_A"], "baseline_msign_eq": base["msign_eq"],
                 "baseline_wall_s": base["wall_s"], "baseline_e_W_conv": base["e_W_conv"],
                 "baseline_e_A_conv": base["e_A_conv"], "cheapest_matching": None, "fastest_matching": None}
        if best is not None:
            s = stats[best[2], man]
            entry["cheapest_matching"] = {"candidate": best[2], "e_W": s["e_W"], "e_W_worst_step": s["e_W_worst_step"],
                                          "msign_eq": s["msign_eq"], "msign_ratio": s["msign_ratio"],
                                          "wall_ratio": s["wall_ratio"], "e_W_conv": s["e_W_conv"],
                                          "half_cost_met": s["msign_ratio"] <= 0.5}
        if fastest is not None:
            s = stats[fastest[1], man]
            entry["fastest_matching"] = {"candidate": fastest[1], "e_W": s["e_W"], "msign_ratio": s["msign_ratio"],
                                         "wall_ratio": s["wall_ratio"], "half_cost_met": s["wall_ratio"] <= 0.5}
        derived["by_manifold"][man] = entry
    summary.sort(key=lambda r: (r[6], r[13], r[0]))
    return summary, derived


def reference_violation_summary(viol: list[tuple], sec: dict) -> dict:
    """How converged the two references are: final ``||H||_RMS`` (median and max over
    banks and steps) of the cold dual ascent and of the long ADMM run, per manifold."""
    out = {}
    for man in sorted({v[0] for v in viol}):
        da = np.asarray([v[1] for v in viol if v[0] == man])
        ad = np.asarray([v[2] for v in viol if v[0] == man])
        out[man] = {f"dual_ascent_{sec['reference_iterations']}_median": float(np.median(da)),
                    f"dual_ascent_{sec['reference_iterations']}_max": float(da.max()),
                    f"admm_{sec['converged_iterations']}_median": float(np.median(ad)),
                    f"admm_{sec['converged_iterations']}_max": float(ad.max())}
    return out


SUMMARY_COLUMNS = ["candidate", "solver", "warm", "steps", "tol", "rho", "manifold", "captured_steps", "e_W", "e_A",
                   "e_W_max", "e_W_worst_step", "iterations", "msign_eq", "wall_s", "msign_ratio", "wall_ratio",
                   "matches_baseline", "e_W_conv", "e_A_conv", "normalize", "align", "align_conv"]


def run_solvers(cfg: dict, out: str | Path, config_path: str | None = None, sequence: list[str] | None = None,
                log=print, data=None) -> dict:
    """Run the solver study into ``out`` (see the module doc); ``data``: its capture trainings' token dataset
    (None: the config's prepared one)."""
    studies = cfg["studies"]
    sec = studies["solvers"]
    device = resolve_device(studies["device"])
    out = Path(out)
    t0 = time.perf_counter()
    if sec["capture_start"] + sec["capture_length"] < 2:
        raise ConfigError("studies.solvers: capture_start + capture_length must be >= 2")
    cands = candidates(sec)
    for s in sequence or ():  # before any work: `--sequence A key=value` reads the override as a run folder
        if not (Path(s) / "sequence").is_dir():
            raise FileNotFoundError(f"--sequence {s}: no run folder with a sequence/ folder there (dotted "
                                    "overrides go before --sequence, which takes every argument after it)")
    if sequence or sec["source"] == "grid":
        # existing captures: the given run folders, else the grid's own runs that captured them
        given = [Path(s) for s in sequence] if sequence else [
            run_dir(RESULTS_ROOT, cfg["name"], v, sec["seed"]) for v in capture_variants(cfg)]
        runs, not_captured = read_captures(given, sec, log)
    else:
        runs, not_captured = capture_sequences(cfg, sec, out / "_train", log, data=data)
    retraction = cfg["train"]["dgram_retraction"]
    rows, viol = [], []
    for run in runs:
        seq = load_sequence(run)[: sec["capture_length"]]  # an existing capture may be longer
        log(f"solvers: {run}: {len(seq)} steps, {len(cands)} candidates")
        rows.extend(measure_sequence(seq, cands, sec, retraction, device, log, viol))
    write_csv(out / FILES.file("rows"), COLUMNS, rows)
    summary, derived = summarise(rows, cands[0]["name"])
    derived["reference_violation"] = reference_violation_summary(viol, sec)
    write_csv(out / FILES.file("summary"), SUMMARY_COLUMNS, summary)
    derived["runs"] = [str(r) for r in runs]
    # an assignment whose capture training diverged before its window: "not captured" and
    # why (the files above hold the others' rows, or just their headers)
    derived["not_captured"] = not_captured
    derived["captured_steps"] = {str(r): min(len(load_sequence(r)), sec["capture_length"]) for r in runs}
    derived["meta"] = run_meta(sec, device, time.perf_counter() - t0, config_path)
    write_json(out / FILES.file("derived"), derived)
    return derived


def main(argv=None) -> int:
    return main_for(
        "python -m mwm.studies.solvers",
        "Solver study: e_W and e_A of the inner solvers (dual ascent cold/warm/tolerance, ADMM) against a long cold "
        "reference, on (W, momentum) sequences captured in a short training, against their cost.",
        run_solvers,
        extra=lambda p: p.add_argument("--sequence", nargs="+", default=None,
                                       help="run folders with sequence/ (default: the grid's runs with "
                                            "studies.solvers.source grid, "
                                            "else capture by training)"),
        extra_kwargs=lambda a: {"sequence": a.sequence},
        argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
