"""Run identities: where a training run of (config, assignment, seed, retraction) lives.

``results/runs/<config>/<variant>/seed<seed>/`` with ``variant`` the assignment
name, suffixed ``-colnorm`` for the DGram retraction ablation. Never the clock.
Checkpoints live beside it under ``results/checkpoints/`` (not a declared
workflow output, so they survive a failed attempt and a retry resumes).
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
from pathlib import Path

from mwm.config import ConfigError, config_hash, validate
from mwm.io import CsvLog, atomic_write, read_csv_rows
from mwm.config.names import (COLNORM_SUFFIX, NAMED_ASSIGNMENTS, SOLVER_KEYS, is_colnorm, parse_variant, uses_dgram,
                    variant_name)
from mwm.numerics import VERSION, version_problem
from mwm.workflow.paths import inside
from mwm.workflow.variants import assignment_spec, sweep_overrides, sweep_points, sweep_variant, sweep_variants

__all__ = ["RUN_FILES", "capture_variants", "capture_window", "run_dir", "checkpoint_dir", "grid_variants",
           "check_grid", "run_config", "run_identity", "config_run_identity", "expected_identity", "identity_diff",
           "identity_problem", "identity_checkable", "RESULTS_ROOT", "HAND_FOLDER"]

#: The train settings of the inner solver: all a ``grid.solver_comparison`` candidate may change.
SOLVER_TRAIN_KEYS = tuple(k for keys in SOLVER_KEYS.values() for k in keys)

#: The results root of the workflow (the train rule's ``--out``): its ``runs/<name>/`` holds the config's own runs.
RESULTS_ROOT = "results"
#: Under :data:`RESULTS_ROOT`: the roots of hand runs whose overrides change the run (``hand/<hash>/runs/...``).
HAND_FOLDER = "hand"

#: The files every finished run has (what the workflow declares as outputs).
RUN_FILES = ("summary.json", "metrics.csv", "eval.csv", "spectral.csv", "attention.csv", "solver.csv")


def check_grid(grid: dict) -> None:
    """Raise ConfigError for grid names that are neither named nor custom, or clash."""
    clash = sorted(set(grid.get("custom", {})) & set(NAMED_ASSIGNMENTS))
    if clash:
        raise ConfigError(f"grid.custom redefines the named assignment(s) {clash}")
    bad = [c for c in grid.get("custom", {}) if is_colnorm(c)]
    if bad:
        raise ConfigError(f"grid.custom names may not end in {COLNORM_SUFFIX} (reserved for the ablation): {bad}")
    for name in grid["assignments"]:
        assignment_spec(grid, name)
    extra = sorted(set(grid.get("train_overrides", {})) - set(grid["assignments"]))
    if extra:
        raise ConfigError(f"grid.train_overrides names assignment(s) {extra} that are not in grid.assignments "
                          f"({', '.join(grid['assignments'])})")
    for cand, base in grid.get("solver_comparison", {}).items():
        bad = [n for n in (cand, base) if n not in grid["assignments"]]
        if bad or cand == base:
            raise ConfigError(f"grid.solver_comparison.{cand}: {base!r}: "
                              + (f"{bad} not in grid.assignments ({', '.join(grid['assignments'])})" if bad
                                 else "a variant cannot be its own baseline"))
        other = sorted(set(grid.get("train_overrides", {}).get(cand, {})) - set(SOLVER_TRAIN_KEYS))
        if other:
            raise ConfigError(f"grid.solver_comparison.{cand}: its grid.train_overrides may change the inner "
                              f"solver only ({', '.join(SOLVER_TRAIN_KEYS)}), not {other}")


def run_config(cfg: dict, assignment: str) -> dict:
    """``cfg`` with ``grid.train_overrides[assignment]`` merged into its train section
    (validated; a copy). The config of every run of that assignment."""

    point = sweep_points(cfg["grid"]).get(assignment)
    if point is not None:  # a sweep variant: its assignment's config, then its rate
        base = run_config(cfg, point[0])
        out = copy.deepcopy(base)
        out["train"].update(sweep_overrides(base["train"], cfg["grid"]["sweep"], point[1]))
        return validate(out, source=f"config {cfg['name']!r}, sweep variant {assignment}")
    over = cfg["grid"].get("train_overrides", {}).get(assignment)
    if not over:
        return cfg
    out = copy.deepcopy(cfg)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out["train"].get(key), dict):
            out["train"][key] = {**out["train"][key], **value}
        else:
            out["train"][key] = value
    try:
        return validate(out, source=f"config {cfg['name']!r} with grid.train_overrides.{assignment}")
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("  train.", f"  grid.train_overrides.{assignment} -> train.")) from exc


def capture_variants(cfg: dict) -> list[str]:
    """The grid variants whose runs capture the solver study's sequences (``studies.solvers.source:
    grid``): each of ``studies.solvers.assignments``, at ``studies.solvers.rate`` in a sweep."""
    sec = cfg["studies"]["solvers"]
    rate = sec.get("rate")
    return [a if rate is None else sweep_variant(a, rate) for a in sec["assignments"]]


def capture_window(cfg: dict, variant: str, seed: int) -> dict | None:
    """The steps the grid's run of ``variant`` and ``seed`` captures for the solver study
    (``studies.solvers.source: grid``): ``{"start", "length"}``, or None for a run that
    captures nothing. Capturing copies what the optimizer consumed; it changes no number of
    the run, so it is not part of the run's identity (the train rule's params carry it)."""
    sec = cfg["studies"]["solvers"]
    if sec["source"] != "grid" or int(seed) != sec["seed"] or variant not in capture_variants(cfg):
        return None
    return {"start": sec["capture_start"], "length": sec["capture_length"]}


def run_identity(run_cfg: dict, assignment: str, seed: int, retraction: str) -> dict:
    """What makes a run what it is: ``run_cfg`` (the run's config, :func:`run_config`) sections
    model, train, data, with assignment, seed, retraction and the numerics version
    (:data:`mwm.numerics.VERSION`). Its :func:`mwm.config.config_hash`
    is the run's ``config_hash`` (checkpoints, summary.json); summary.json also keeps it whole
    (``identity``) so a reader can name the keys in which a run differs from a config."""
    return {"model": run_cfg["model"], "train": run_cfg["train"], "data": run_cfg.get("data"),
            "assignment": assignment, "seed": seed, "retraction": retraction, "numerics": VERSION}


def config_run_identity(cfg: dict, assignment: str, seed: int, retraction: str | None = None) -> dict:
    """The identity of the run ``cfg`` makes of (assignment, seed, retraction): its
    grid.train_overrides merged, the retraction defaulting to train.dgram_retraction (as
    :func:`mwm.train.loop.train` does)."""
    run_cfg = run_config(cfg, assignment)
    return run_identity(run_cfg, assignment, seed, retraction or run_cfg["train"]["dgram_retraction"])


def expected_identity(cfg: dict, variant: str, seed: int) -> dict:
    """The identity the config's own run of ``variant`` (a grid variant) and ``seed`` has."""
    assignment, suffix = parse_variant(variant)
    return config_run_identity(cfg, assignment, seed, suffix if is_colnorm(variant) else None)


def identity_diff(recorded, expected, where: str = "") -> list[str]:
    """``key: run X, config Y`` for every dotted key in which two identities differ."""
    if isinstance(recorded, dict) and isinstance(expected, dict):
        out = []
        for key in sorted(set(recorded) | set(expected), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in recorded:
                out.append(f"{sub}: run (not recorded), config {json.dumps(expected[key], default=str)}")
            elif key not in expected:
                out.append(f"{sub}: run {json.dumps(recorded[key], default=str)}, config (no such key)")
            else:
                out += identity_diff(recorded[key], expected[key], sub)
        return out
    if recorded == expected:
        return []
    return [f"{where}: run {json.dumps(recorded, default=str)}, config {json.dumps(expected, default=str)}"]


def identity_checkable(summary: dict) -> bool:
    """Whether a summary records anything (identity or config_hash) to compare with a config."""
    return isinstance(summary.get("identity"), dict) or summary.get("config_hash") is not None


def identity_problem(summary: dict, expected: dict) -> str | None:
    """Why a run's summary.json is not the config's own run of ``expected`` (None: it is).
    A summary that records its ``identity`` is compared key by key; an older one (only
    ``config_hash``) by hash, so its differing keys cannot be named. A run of other numerics
    (:func:`mwm.numerics.version_problem`) is refused with that one line."""
    recorded = summary.get("identity")
    if isinstance(recorded, dict):
        if (numerics := version_problem(summary)) is not None:
            return numerics
        world = summary.get("world_size", 1)
        if isinstance(world, int) and world > 1 and "grad_accum_per_rank" not in summary:
            return (f"trained on {world} ranks when each rank took the config's whole grad_accum, so its steps "
                    f"held {world}x the config's tokens (docs/findings.md, Numerics changes)")
        diff = identity_diff(recorded, expected)
        return ("trained with settings that are not the config's: " + "; ".join(diff)) if diff else None
    want = config_hash(expected)
    got = summary.get("config_hash")
    if got is None:
        return "its summary records neither its identity nor a config_hash: it cannot be checked against the config"
    if got != want:
        return (f"its config_hash {got} is not the config's {want} (the summary predates recorded identities, "
                f"so the differing keys cannot be named)")
    return None


def run_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:

    return inside(Path(root) / "runs", config_name, variant, f"seed{seed}", what="run folder (name/variant/seed)")


def checkpoint_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:

    return inside(Path(root) / "checkpoints", config_name, variant, f"seed{seed}",
                  what="checkpoint folder (name/variant/seed)")


def grid_variants(grid: dict) -> list[str]:
    """Every variant the config trains: its assignments, plus colnorm copies of the
    DGram-using ones when ``retraction_ablation`` is on; with ``grid.sweep``, each
    assignment at each rate instead (:func:`mwm.workflow.variants.sweep_variants`)."""
    if grid.get("sweep"):
        return sweep_variants(grid)
    out = list(grid["assignments"])
    if grid.get("retraction_ablation"):
        out += [variant_name(a, "colnorm", grid.get("custom")) for a in grid["assignments"]
                if uses_dgram(a, grid.get("custom"))]
    return out


# --------------------------------------------------------------------------------------
# run-folder I/O: a run's logs, and their copy beside its checkpoint
# --------------------------------------------------------------------------------------
#: The append-only CSV logs of a run, as ``{key: file}`` (cut back to a checkpoint on resume).
RUN_LOGS = {"metrics": "metrics.csv", "eval": "eval.csv", "spectral": "spectral.csv", "attention": "attention.csv",
            "solver": "solver.csv"}
#: Folders of per-step arrays (``step_NNNNNN.npz``) a run writes.
RUN_STEP_FOLDERS = ("spectra", "sequence")


class RunFolder:
    """The files of one run: its folder ``dir`` (:func:`run_dir`), its checkpoint
    ``ckpt_path`` and the copy of its logs beside the checkpoint, ``mirror``
    (:func:`checkpoint_dir`). The workflow deletes a failed job's declared outputs (the
    logs) before it retries; the copy lets the retry resume anyway. Rank 0 alone calls
    the methods that write."""
    def __init__(self, root: str | Path, config_name: str, variant: str, seed: int):
        self.dir = run_dir(root, config_name, variant, seed)
        self.ckpt_dir = checkpoint_dir(root, config_name, variant, seed)
        self.ckpt_path = self.ckpt_dir / "ckpt.pt"
        self.mirror = self.ckpt_dir / "logs"

    def open_logs(self, columns: dict[str, list[str]], resume_step: int) -> dict:
        """``{key: CsvLog}`` for the logs of ``columns`` (keys of :data:`RUN_LOGS`), each
        with its rows at or after ``resume_step`` dropped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        logs = {key: CsvLog(self.dir / RUN_LOGS[key], cols) for key, cols in columns.items()}
        for log in logs.values():
            log.truncate_from(resume_step)
        return logs

    def save_mirror(self) -> None:
        """Copy the logs, pairs and new per-step arrays beside the checkpoint."""
        _copy_run_files(self.dir, self.mirror, replace_steps=False)

    def restore_mirror(self) -> bool:
        """Copy the checkpoint's logs back into the run folder; False when there are none."""
        if not (self.mirror / RUN_LOGS["metrics"]).exists():
            return False
        _copy_run_files(self.mirror, self.dir, replace_steps=True)
        return True

    def extent(self, step: int, where: Path | None = None) -> dict:
        """What the run's files below ``step`` are, in ``where`` (default the run folder): per log its
        number of complete rows below ``step`` (None: absent or unreadable), per step folder the
        names of its arrays below ``step``, and whether pairs.npz exists. A checkpoint records its
        logs' extent; a resume continues only files that show the same (:meth:`holds`)."""
        base = self.dir if where is None else where
        out: dict = {name: _rows_below(base / name, step) for name in RUN_LOGS.values()}
        for sub in RUN_STEP_FOLDERS:
            out[sub] = sorted(f.name for f in (base / sub).glob("step_*.npz") if _step_of(f) < step)
        out["pairs.npz"] = (base / "pairs.npz").is_file()
        return out

    def holds(self, step: int, extent: dict | None, where: Path | None = None) -> bool:
        """Whether the files in ``where`` (default the run folder) are those a checkpoint at ``step``
        recorded (``extent``): every log with the same rows below ``step``, every per-step array and
        pairs.npz it had. Without a recorded extent (an older checkpoint): metrics.csv holds every step
        below ``step``."""
        base = self.dir if where is None else where
        if extent is None:
            path = base / RUN_LOGS["metrics"]
            try:
                steps = [int(r["step"]) for r in read_csv_rows(path)] if path.exists() else None
            except (KeyError, ValueError, TypeError):
                return False
            return steps is not None and set(range(step)) <= set(steps)
        now = self.extent(step, base)
        for name in RUN_LOGS.values():
            if name in extent and now[name] != extent[name]:
                return False
        for sub in RUN_STEP_FOLDERS:
            if not set(extent.get(sub, ())) <= set(now[sub]):
                return False
        return not extent.get("pairs.npz") or now["pairs.npz"]

    def logs_reach(self, step: int, extent: dict | None = None) -> bool:
        """Whether the run folder can continue from a checkpoint at ``step`` (:meth:`holds`)."""
        return self.holds(step, extent)

    def mirror_holds(self, step: int, extent: dict | None) -> bool:
        """Whether the copy beside the checkpoint can (:meth:`holds`)."""
        return (self.mirror / RUN_LOGS["metrics"]).exists() and self.holds(step, extent, self.mirror)

    def set_aside(self) -> Path:
        """Move the checkpoint, its copy of the logs and the run folder's logs, pairs and per-step arrays
        into ``<checkpoint folder>.unusable`` (replacing an earlier one) rather than delete them, so a
        run that cannot continue starts afresh and loses nothing to a wrong guess. Returns that folder."""
        aside = self.ckpt_dir.with_name(self.ckpt_dir.name + ".unusable")
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir(parents=True)
        if self.ckpt_dir.is_dir():
            os.replace(self.ckpt_dir, aside / "checkpoint")
        run = aside / "run"
        run.mkdir()
        for name in (*RUN_LOGS.values(), "pairs.npz"):
            if (self.dir / name).exists():
                os.replace(self.dir / name, run / name)
        for sub in RUN_STEP_FOLDERS:
            if (self.dir / sub).is_dir():
                (run / sub).mkdir()
                for f in (self.dir / sub).glob("step_*.npz"):
                    os.replace(f, run / sub / f.name)
        return aside

    def invalidate_products(self, start: int, capture_pairs_step: int | None) -> None:
        """Before the logs are cut back to ``start``: remove the summary and the products a
        finished run leaves (final.pt; pairs.npz, spectra and sequence steps not before ``start``), so an
        interrupted rerun never looks complete (the summary comes back at the end)."""
        (self.dir / "summary.json").unlink(missing_ok=True)
        (self.dir / "final.pt").unlink(missing_ok=True)
        if capture_pairs_step is None or capture_pairs_step >= start:
            (self.dir / "pairs.npz").unlink(missing_ok=True)
        for sub in RUN_STEP_FOLDERS:
            for f in (self.dir / sub).glob("step_*.npz"):
                if int(f.stem.split("_")[1]) >= start:
                    f.unlink()

    def discard_logs(self) -> None:
        """Remove the run folder's logs, pairs and per-step arrays (a run starting at step 0 rewrites them
        all; a stale log with a foreign header or a non-integer step would fail every retry)."""
        for name in (*RUN_LOGS.values(), "pairs.npz"):
            (self.dir / name).unlink(missing_ok=True)
        for sub in RUN_STEP_FOLDERS:
            for f in (self.dir / sub).glob("step_*.npz"):
                f.unlink()

    def drop_checkpoint(self) -> None:
        """Remove the checkpoint and its copy of the logs (nothing left to resume)."""
        self.ckpt_path.unlink(missing_ok=True)
        shutil.rmtree(self.mirror, ignore_errors=True)


def _step_of(f: Path) -> int:
    try:
        return int(f.stem.split("_")[1])
    except (IndexError, ValueError):
        return -1  # not a step array: never counted


def _rows_below(path: Path, step: int) -> int | None:
    """The complete rows of a CSV log whose step is below ``step``; None when it is absent or a row's step
    is not an integer (a log that cannot be continued)."""
    if not path.is_file():
        return None
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header or "step" not in header:
                return None
            idx, n = header.index("step"), 0
            for fields in reader:
                if len(fields) != len(header):
                    continue  # a torn last row: truncate_from drops it too
                n += int(fields[idx]) < step
            return n
    except (ValueError, UnicodeDecodeError, csv.Error):
        return None


def _copy_run_files(src: Path, dst: Path, replace_steps: bool) -> None:
    """Copy a run's logs, pairs.npz and per-step arrays from ``src`` to ``dst``; per-step
    files already at ``dst`` are kept unless ``replace_steps`` (they never change)."""

    for name in (*RUN_LOGS.values(), "pairs.npz"):
        if (src / name).exists():
            atomic_write(dst / name, lambda p, name=name: shutil.copyfile(src / name, p))
    for sub in RUN_STEP_FOLDERS:
        if (src / sub).is_dir():
            for f in sorted((src / sub).glob("step_*.npz")):
                if replace_steps or not (dst / sub / f.name).exists():
                    atomic_write(dst / sub / f.name, lambda p, f=f: shutil.copyfile(f, p))


__all__ += ["RUN_LOGS", "RUN_STEP_FOLDERS", "RunFolder"]
