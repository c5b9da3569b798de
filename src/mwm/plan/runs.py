"""The run plan: which runs a config makes, each one's settings, identity and folders.

The one place these are computed. :class:`Plan` is built once from a validated config and read by
the Snakefile, the DVC writer, status, setaside, the report's loader and training; the functions
below are its parts. A run of ``(variant, seed)`` lives in ``results/runs/<config>/<variant>/seed<seed>/``,
``variant`` the assignment name, suffixed ``-colnorm`` for the DGram retraction ablation or
``-eta<rate>`` in a sweep (:mod:`mwm.plan.variants`). Never the clock. Checkpoints live beside it
under ``results/checkpoints/`` (not a declared workflow output, so they survive a failed attempt
and a retry resumes). Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from mwm.config import ConfigError, config_hash, validate
from mwm.data.spec import dataset_dir
from mwm.experiments import EXPERIMENTS
from mwm.config.names import (COLNORM_SUFFIX, NAMED_ASSIGNMENTS, SOLVER_KEYS, UNCONSTRAINED, is_colnorm, parse_variant,
                              uses_dgram, variant_name)
from mwm.numerics import VERSION, version_problem
from mwm.paths import inside
from mwm.plan.variants import assignment_spec, sweep_overrides, sweep_points, sweep_variant, sweep_variants

__all__ = ["Plan", "PlannedRun", "folders", "run_path", "config_dir", "hand_root", "FIGURES_ROOT", "CONFIG_KINDS",
           "RUN_FILES", "RUN_FOLDERS", "FINAL_STATUSES", "capture_variants", "capture_window", "run_dir",
           "checkpoint_dir", "grid_variants", "check_grid", "run_config", "run_identity", "config_run_identity",
           "variant_retraction", "expected_identity", "identity_diff", "identity_problem", "identity_checkable",
           "RESULTS_ROOT", "HAND_FOLDER"]

#: The train settings of the inner solver: all a ``grid.solver_comparison`` candidate may change.
SOLVER_TRAIN_KEYS = tuple(k for keys in SOLVER_KEYS.values() for k in keys)

#: The results root of the workflow (the train rule's ``--out``): its ``runs/<name>/`` holds the config's own runs.
RESULTS_ROOT = "results"
#: Under :data:`RESULTS_ROOT`: the roots of hand runs whose overrides change the run (``hand/<hash>/runs/...``).
HAND_FOLDER = "hand"

#: The report's root, beside the checkout's data/ and results/: ``paper_figures/<config>/``.
FIGURES_ROOT = "paper_figures"
#: The kinds of product a config keeps in a folder of its name (:func:`config_dir`).
CONFIG_KINDS = ("runs", "checkpoints", "studies", "figures")

#: The files every finished run has (what the workflow declares as outputs, and what is published of it).
RUN_FILES = ("summary.json", "metrics.csv", "eval.csv", "spectral.csv", "attention.csv", "solver.csv")
#: The statuses a finished run's ``summary.json`` records (a run without one is not finished).
FINAL_STATUSES = ("completed", "unstable", "failed")
#: The folders every finished run has, declared too: its singular-value snapshots. A run's by-products
#: (``final.pt``, the captured ``pairs.npz`` and ``sequence/``) are written beside them, undeclared, so a run
#: restored from its published records (:mod:`mwm.workflow.publish`) is complete for the workflow.
RUN_FOLDERS = ("spectra",)


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
    :func:`mwm.train.cli.train` does)."""
    run_cfg = run_config(cfg, assignment)
    return run_identity(run_cfg, assignment, seed, retraction or run_cfg["train"]["dgram_retraction"])


def variant_retraction(variant: str, train: dict) -> str:
    """The DGram retraction a grid variant trains with: the ablation's (its suffix), else ``train``'s
    ``dgram_retraction`` (the run's train section)."""
    return parse_variant(variant)[1] if is_colnorm(variant) else train["dgram_retraction"]


def expected_identity(cfg: dict, variant: str, seed: int) -> dict:
    """The identity the config's own run of ``variant`` (a grid variant) and ``seed`` has."""
    assignment = parse_variant(variant)[0]
    run_cfg = run_config(cfg, assignment)
    return run_identity(run_cfg, assignment, seed, variant_retraction(variant, run_cfg["train"]))


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


def config_dir(kind: str, config_name: str, root: str | Path = RESULTS_ROOT,
               figures_root: str | Path = FIGURES_ROOT) -> Path:
    """The folder of a config's products of ``kind``: ``<root>/<kind>/<name>`` for its runs, checkpoints
    and studies, ``<figures_root>/<name>`` for its figures; the name checked to stay inside the parent."""
    if kind not in CONFIG_KINDS:
        raise ValueError(f"unknown kind of product {kind!r}; choose one of {', '.join(CONFIG_KINDS)}")
    parent = Path(figures_root) if kind == "figures" else Path(root) / kind
    return inside(parent, config_name, what=f"config name (in {parent.as_posix()})")


def hand_root(run_cfg: dict, root: str | Path = RESULTS_ROOT) -> Path:
    """The results root of hand runs whose overrides make ``run_cfg`` (the overridden config) other than its
    config's: ``<root>/hand/<its config hash>``, one root for every run of the same overrides."""
    return inside(Path(root) / HAND_FOLDER, config_hash(run_cfg), what="hand-run folder")


def run_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:
    """Where the run of ``variant`` and ``seed`` lives (its variant and seed checked as folder names)."""
    return inside(config_dir("runs", config_name, root), variant, f"seed{seed}", what="run folder (variant/seed)")


def checkpoint_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:
    """Where the run's checkpoint and the copy of its logs live, beside the run folder."""
    return inside(config_dir("checkpoints", config_name, root), variant, f"seed{seed}",
                  what="checkpoint folder (variant/seed)")


def grid_variants(grid: dict) -> list[str]:
    """Every variant the config trains: its assignments, plus colnorm copies of the
    DGram-using ones when ``retraction_ablation`` is on; with ``grid.sweep``, each
    assignment at each rate instead (:func:`mwm.plan.variants.sweep_variants`)."""
    if grid.get("sweep"):
        return sweep_variants(grid)
    out = list(grid["assignments"])
    if grid.get("retraction_ablation"):
        out += [variant_name(a, "colnorm", grid.get("custom")) for a in grid["assignments"]
                if uses_dgram(a, grid.get("custom"))]
    return out


def folders(cfg: dict, root: str | Path = RESULTS_ROOT) -> dict[str, str]:
    """The folder each kind of product of ``cfg`` lives in (:data:`mwm.workflow.stages.PRODUCTS`): its
    data, runs, studies and figures; the results kinds under ``root``."""
    return {"data": dataset_dir(cfg["data"]).as_posix(),
            **{kind: config_dir(kind, cfg["name"], root).as_posix() for kind in ("runs", "studies", "figures")}}


def run_path(runs: str, variant: object = "{variant}", seed: object = "{seed}") -> str:
    """``<runs>/<variant>/seed<seed>`` as text, unchecked: with the defaults, the rules' wildcard pattern
    of a run folder (:func:`run_dir` checks real names)."""
    return f"{runs}/{variant}/seed{seed}"


@dataclass(frozen=True)
class PlannedRun:
    """One run a config makes (what :class:`mwm.train.loop.Run` trains): its grid ``variant`` and
    ``seed``, the assignment and DGram retraction it trains, its folder ``dir`` and checkpoint folder
    ``ckpt_dir``."""

    variant: str
    seed: int
    assignment: str
    retraction: str
    dir: Path
    ckpt_dir: Path


class Plan:
    """The runs a validated config makes, built once: ``folders`` (per kind of product), ``variants`` and
    ``seeds`` of the grid, and per run its config (:meth:`config`: ``grid.train_overrides`` and the sweep
    rate merged, validated once per variant), identity, folders and solver-study capture window.
    ``root`` is the results root (the train rule's ``--out``)."""

    def __init__(self, cfg: dict, root: str | Path = RESULTS_ROOT):
        self.cfg, self.name, self.root = cfg, cfg["name"], Path(root)
        self.folders = folders(cfg, root)
        self.variants = tuple(grid_variants(cfg["grid"]))
        self.seeds = tuple(cfg["grid"]["seeds"])
        self.capture_variants = tuple(capture_variants(cfg))
        self._configs: dict[str, dict] = {}

    @property
    def trains(self) -> bool:
        """Whether the grid's runs are trained (a solver-only report trains only the study's captures)."""
        return EXPERIMENTS[self.cfg["workflow"]["report"]].reads_runs

    def config(self, variant: str) -> dict:
        """The config every run of grid ``variant`` trains with (:func:`run_config` of its assignment)."""
        assignment = parse_variant(variant)[0]
        if assignment not in self._configs:
            self._configs[assignment] = run_config(self.cfg, assignment)
        return self._configs[assignment]

    def train(self, variant: str) -> dict:
        """The train section a run of ``variant`` trains with."""
        return self.config(variant)["train"]

    def run(self, variant: str, seed: int) -> PlannedRun:
        """The run of ``variant`` and ``seed`` (its folders checked to stay inside the root)."""
        root, name, retraction = self.root, self.name, variant_retraction(variant, self.train(variant))
        return PlannedRun(variant, int(seed), parse_variant(variant)[0], retraction,
                          run_dir(root, name, variant, seed), checkpoint_dir(root, name, variant, seed))

    def runs(self) -> list[PlannedRun]:
        """Every run of the grid, variant by variant, seed by seed."""
        return [self.run(v, s) for v in self.variants for s in self.seeds]

    def identity(self, variant: str, seed: int) -> dict:
        """The identity the config's own run of ``variant`` and ``seed`` has (:func:`run_identity`)."""
        run = self.run(variant, seed)
        return run_identity(self.config(variant), run.assignment, run.seed, run.retraction)

    def problem(self, summary: dict, variant: str, seed: int) -> str | None:
        """Why ``summary`` is not the config's own run of ``variant`` and ``seed`` (None: it is)."""
        return identity_problem(summary, self.identity(variant, seed))

    def capture(self, variant: str, seed: int) -> dict | None:
        """The steps the run captures for the solver study (:func:`capture_window`)."""
        return capture_window(self.cfg, variant, int(seed))

    def path(self, variant: object = "{variant}", seed: object = "{seed}") -> str:
        """A run folder of the config as text (:func:`run_path`), the rules' wildcard pattern by default."""
        return run_path(self.folders["runs"], variant, seed)

    # -- what the workflow's jobs read (the rules' input functions call these) --------------------
    def records(self) -> list[str]:
        """Every run's declared records (:data:`RUN_FILES`, :data:`RUN_FOLDERS`), run by run."""
        return [f"{self.path(v, s)}/{f}" for v in self.variants for s in self.seeds for f in (*RUN_FILES, *RUN_FOLDERS)]

    def _constrained(self, prefer: tuple[str, ...]) -> list[str]:
        """The grid's assignments that use a manifold, those in ``prefer`` first (in its order)."""
        constrained = [v for v in self.cfg["grid"]["assignments"] if v not in UNCONSTRAINED]
        return list(dict.fromkeys([p for p in prefer if p in constrained] + constrained))

    def probe_run(self, prefer: tuple[str, ...]) -> tuple[str, int] | None:
        """(variant, seed) of the first grid assignment in ``prefer`` (else the first that uses a
        manifold) at the first seed, or None: its data feeds the studies."""
        order = self._constrained(prefer)
        return (order[0], self.seeds[0]) if order else None

    #: The absorption study's preference among the runs that capture pairs: hetero has both manifolds.
    PAIRS_PREFER = ("hetero", "hetero-inv", "stiefel", "dgram")
    #: The growth-bound audit's: DGram attention is where the bound bites.
    SPECTRAL_PREFER = ("dgram", "hetero-inv", "hetero")

    def pairs_summaries(self) -> list[str]:
        """The absorption study's training (W, G) pairs, in order of preference: every manifold run at
        the first seed, by its summary.json (its pairs.npz is written with it). The study uses the
        first that captured them; a run unstable before the capture step writes a "not captured" file.
        None when the config captures no pairs (``train.capture_pairs_step`` null)."""
        if self.cfg["train"]["capture_pairs_step"] is None:
            return []
        return [f"{self.path(v, self.seeds[0])}/summary.json" for v in self._constrained(self.PAIRS_PREFER)]

    def spectral_logs(self) -> list[str]:
        """The spectral log the growth-bound audit reads (none when no run uses a manifold)."""
        run = self.probe_run(self.SPECTRAL_PREFER)
        return [] if run is None else [f"{self.path(*run)}/spectral.csv"]

    def solver_sequences(self) -> list[str]:
        """The grid runs the solver study reads (``studies.solvers.source: grid``), else none: it
        trains its own captures. Their sequence/ is written with the run's summary.json."""
        sec = self.cfg["studies"]["solvers"]
        if sec["source"] != "grid":
            return []
        return [f"{self.path(v, sec['seed'])}/{f}" for v in self.capture_variants
                for f in ("summary.json", "metrics.csv")]
