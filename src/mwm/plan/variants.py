"""Learning-rate sweeps (``grid.sweep``) and the mechanism interventions (``grid.intervention``).

A sweep trains every assignment of the grid at each Muon step size (eta, ``train.muon_lr``) of
``grid.sweep.muon_lr``. The run of assignment ``a`` at rate ``r`` is the variant ``a-eta<r>``
(:func:`sweep_variant`, e.g. ``stiefel-eta0.04``): its folder, its Snakemake wildcard and its report
label. It trains ``a`` (named or ``grid.custom``) with ``a``'s ``grid.train_overrides`` and then the
rate: ``muon_lr = r``, and with ``adamw: scaled`` the AdamW ``learning_rate`` and ``min_lr`` multiplied
by ``r / train.muon_lr`` (``fixed``: unchanged). ``train.muon_lr`` is the shared rate the paper used
for every assignment; it must be one of the sweep's rates.

``grid.intervention``: candidate -> baseline, like ``grid.solver_comparison``: the candidate trains
the baseline's manifolds with one or more of :data:`INTERVENTION_KEYS` set (its only
``grid.train_overrides`` keys): ``attn_sigma_cap`` / ``mlp_sigma_cap`` cap the singular values of the
DGram attention (MLP) weights after every retraction (:func:`mwm.optim.manifolds.cap_column_norms`),
``solver_normalize`` solves their inner problem scale-normalized (:func:`mwm.optim.solvers.scaled_solve`),
``attn_qk_scale`` computes attention logits on unit queries and keys at a fixed scale (the
saturation-only arm: the model's forward changes, not its weights or the optimizer). A normalized solve
of every module (``solver_normalize: all``) may also change the solve itself (:data:`SOLVE_KEYS`: the
solver, its ADMM penalty and its iteration count), which acts on every constrained matrix.
The sweep report judges whether the attention cap restores stability at the baseline's first unstable
rate; the mechanism report (:mod:`mwm.report.mechanism`) judges each intervention arm.

Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

from typing import Any, Mapping

from mwm.config import ConfigError
from mwm.config.layout import hidden_matrix_names, model_shape
from mwm.optim.vocab import match_patterns
from mwm.config.names import ATTN_KEYS, NAMED_ASSIGNMENTS, NORMALIZE_SCOPES

__all__ = ["assignment_spec", "ETA_TAG", "rate_label", "sweep_variant", "sweep_points", "sweep_variants",
           "sweep_overrides", "check_sweep", "INTERVENTION_KEYS", "MODEL_INTERVENTION_KEYS", "SOLVE_KEYS",
           "SWEEP_REPORTS",
           "intervention_keys", "intervention_label", "arm_kind"]

#: What joins an assignment and its rate in a sweep variant's name.
ETA_TAG = "-eta"
#: The train settings an intervention candidate may change (its grid.train_overrides), with the module
#: kinds each acts on (``solver_normalize``: those its scope names, :data:`mwm.config.names.NORMALIZE_SCOPES`).
INTERVENTION_KEYS = ("attn_sigma_cap", "mlp_sigma_cap", "solver_normalize", "attn_qk_scale", "solver", "admm_rho",
                     "dual_ascent_steps")
#: The intervention keys that change the inner solve of every constrained matrix: allowed only beside
#: ``solver_normalize: all``, whose scope they share.
SOLVE_KEYS = ("solver", "admm_rho", "dual_ascent_steps")
#: The intervention keys that change the model's forward rather than the DGram weights' update: they act
#: whatever manifolds the candidate trains, so they need no DGram matrix.
MODEL_INTERVENTION_KEYS = ("attn_qk_scale",)
#: The reports (``workflow.report``) of a config with a sweep; a sweep needs one of them.
SWEEP_REPORTS = ("sweep", "mechanism", "mechanism2", "mechanism3")


def rate_label(rate: float) -> str:
    """A rate as it appears in a variant name: ``format(rate, "g")`` (0.005, 0.02, 1.28). The schema
    bounds the rates to [1e-4, 1e3], where this has neither a sign nor an exponent."""
    return format(float(rate), "g")


def sweep_variant(assignment: str, rate: float) -> str:
    """The variant name of ``assignment`` trained at Muon step size ``rate``."""
    return f"{assignment}{ETA_TAG}{rate_label(rate)}"


def sweep_points(grid: dict) -> dict[str, tuple[str, float]]:
    """``{variant: (assignment, rate)}`` of every run of the sweep, in grid order (assignment, then
    rate); empty without ``grid.sweep``."""
    sweep = grid.get("sweep")
    if not sweep:
        return {}
    return {sweep_variant(a, r): (a, float(r)) for a in grid["assignments"] for r in sweep["muon_lr"]}


def assignment_spec(grid: dict, name: str):
    """The assignment a grid name stands for: a named one, or a custom pattern mapping."""
    custom = grid.get("custom", {})
    point = sweep_points(grid).get(name)
    if point is not None:  # a sweep variant trains its assignment (at its rate: run_config)
        name = point[0]
    if name in custom:
        return dict(custom[name])
    if name in NAMED_ASSIGNMENTS:
        return name
    raise ConfigError(
        f"grid.assignments: unknown assignment {name!r}; choose one of {', '.join(NAMED_ASSIGNMENTS)} "
        f"or define it under grid.custom (defined: {', '.join(custom) or 'none'})"
    )


def sweep_variants(grid: dict) -> list[str]:
    """The variants a sweep trains (its points), in grid order."""
    return list(sweep_points(grid))


def sweep_overrides(train: dict, sweep: dict, rate: float) -> dict:
    """The train settings of a sweep point at ``rate``, given the assignment's merged ``train``
    section: ``muon_lr``, and with ``adamw: scaled`` the AdamW rates scaled by ``rate / muon_lr``
    (``muon_lr`` of ``train``, the shared rate)."""
    over = {"muon_lr": float(rate)}
    if sweep["adamw"] == "scaled":
        f = float(rate) / float(train["muon_lr"])
        over["learning_rate"] = train["learning_rate"] * f
        over["min_lr"] = train["min_lr"] * f
    return over


def intervention_keys(grid: dict, cand: str) -> dict:
    """The intervention settings of variant ``cand`` (its ``grid.train_overrides`` among
    :data:`INTERVENTION_KEYS`); empty for a variant that is no intervention."""
    over = grid.get("train_overrides", {}).get(cand, {})
    return {k: over[k] for k in INTERVENTION_KEYS if over.get(k) is not None}


def arm_kind(grid: dict, arm: str, kinds: Mapping[tuple[str, Any], str]) -> str | None:
    """The kind of intervention ``arm`` makes in an experiment whose table ``kinds`` names the kind each
    setting makes (``{(key, value): kind}``, value None: any value of that key): the one kind all its
    intervention settings make, else None (a plain arm, settings of two kinds, or one the experiment has no
    contrast for). A solve setting (:data:`SOLVE_KEYS`) counts only beside ``solver_normalize``, which names
    the scope it acts on."""
    keys = intervention_keys(grid, arm) if arm in grid.get("intervention", {}) else {}
    made = {kinds.get((key, value), kinds.get((key, None))) for key, value in keys.items()}
    if len(made) != 1 or None in made or (set(keys) & set(SOLVE_KEYS) and "solver_normalize" not in keys):
        return None
    return made.pop()


def intervention_label(grid: dict, cand: str) -> str:
    """What an intervention candidate changes, in words (``attention capped at 4``, ``attention logits on
    unit queries and keys at scale 4``)."""
    keys = intervention_keys(grid, cand)
    words = []
    for kind, label in (("attn", "attention"), ("mlp", "MLP")):
        if f"{kind}_sigma_cap" in keys:
            words.append(f"{label} capped at {keys[f'{kind}_sigma_cap']:g}")
    if "solver_normalize" in keys:
        scope = keys["solver_normalize"]
        solve = [f"{k} {keys[k]:g}" if k != "solver" else keys[k] for k in SOLVE_KEYS if k in keys]
        words.append("normalized solve" + ("" if scope == "all" else f" ({'attention' if scope == 'attn' else 'MLP'})")
                     + (f" ({', '.join(solve)})" if solve else ""))
    if "attn_qk_scale" in keys:
        words.append(f"attention logits on unit queries and keys at scale {keys['attn_qk_scale']:g}")
    return ", ".join(words)


def _modules_of(key: str, value) -> tuple[str, ...]:
    """The module kinds (attn, mlp) an intervention setting acts on: its key's prefix, or the scope's."""
    if key in SOLVE_KEYS:
        return NORMALIZE_SCOPES["all"]
    return NORMALIZE_SCOPES[value] if key == "solver_normalize" else (key.split("_", 1)[0],)


def check_sweep(cfg: dict, where: str) -> None:
    """Raise ConfigError for a sweep or intervention the rest of the config contradicts: the shared
    rate (``train.muon_lr``) not among the rates, sweep variant names that clash with assignments,
    the retraction ablation or a solver comparison beside a sweep (their report is the full one),
    and an intervention whose pair is not in the grid, manifolds differ, whose overrides are not
    intervention settings alone, or whose optimizer-side setting acts on no DGram matrix."""

    grid = cfg["grid"]
    sweep = grid.get("sweep")
    inter = grid.get("intervention") or {}
    report = cfg["workflow"]["report"]
    if bool(sweep) != (report in SWEEP_REPORTS):
        raise ConfigError(f"{where}: workflow.report: {report} and grid.sweep: {sweep!r}: a sweep is reported by "
                          f"workflow.report: {' or '.join(SWEEP_REPORTS)}, and those reports need grid.sweep")
    if inter and not sweep:
        raise ConfigError(f"{where}: grid.intervention needs grid.sweep (the sweep report judges it)")
    if sweep:
        shared = float(cfg["train"]["muon_lr"])
        if not any(abs(float(r) - shared) <= 1e-12 * shared for r in sweep["muon_lr"]):
            raise ConfigError(f"{where}: grid.sweep.muon_lr: {sweep['muon_lr']} does not include train.muon_lr "
                              f"{shared:g}, the shared rate the sweep compares against")
        labels = [rate_label(r) for r in sweep["muon_lr"]]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{where}: grid.sweep.muon_lr: {sweep['muon_lr']}: two rates share a variant "
                              f"name ({labels})")
        for key in ("retraction_ablation", "solver_comparison"):
            if grid.get(key):
                raise ConfigError(f"{where}: grid.{key}: {grid[key]!r} cannot be combined with grid.sweep (the "
                                  "sweep's report has no ablation or solver comparison); set it off")
        clash = sorted(set(sweep_points(grid)) & set(grid["assignments"]))
        if clash:
            raise ConfigError(f"{where}: grid.assignments: {clash} are also names of sweep variants")
    for cand, base in inter.items():
        bad = [n for n in (cand, base) if n not in grid["assignments"]]
        if bad or cand == base:
            raise ConfigError(f"{where}: grid.intervention.{cand}: {base!r}: "
                              + (f"{bad} not in grid.assignments ({', '.join(grid['assignments'])})" if bad
                                 else "a variant cannot be its own baseline"))
        n_layer = model_shape(cfg["model"])["n_layer"]
        if _manifolds(assignment_spec(grid, cand), n_layer) != _manifolds(assignment_spec(grid, base), n_layer):
            raise ConfigError(f"{where}: grid.intervention.{cand}: {base!r}: the candidate must train the "
                              f"baseline's manifolds (candidate {assignment_spec(grid, cand)!r}, baseline "
                              f"{assignment_spec(grid, base)!r})")
        got = _manifolds(assignment_spec(grid, cand), n_layer) or {}
        over = grid.get("train_overrides", {}).get(cand, {})
        if not over or set(over) - set(INTERVENTION_KEYS) or any(v is None for v in over.values()):
            raise ConfigError(f"{where}: grid.intervention.{cand}: its grid.train_overrides must set one or more of "
                              f"{', '.join(INTERVENTION_KEYS)} and nothing else (got {over!r})")
        if set(over) & set(SOLVE_KEYS) and over.get("solver_normalize") != "all":
            raise ConfigError(f"{where}: grid.intervention.{cand}: {', '.join(sorted(set(over) & set(SOLVE_KEYS)))} "
                              "change the solve of every constrained matrix, so they need solver_normalize: all "
                              f"beside them (got {over!r})")
        for key, value in over.items():
            if key in MODEL_INTERVENTION_KEYS:
                continue
            kinds = _modules_of(key, value)
            if not any(m == "dgram" and any(f".{k}." in n for k in kinds) for n, m in got.items()):
                words = "/".join("attention" if k == "attn" else "MLP" for k in kinds)
                raise ConfigError(f"{where}: grid.intervention.{cand}: {base!r} puts no {words} matrix on DGram, so "
                                  f"train.{key} would change nothing")
        if intervention_keys(grid, base):
            raise ConfigError(f"{where}: grid.intervention.{cand}: its baseline {base!r} is an intervention too "
                              f"({intervention_keys(grid, base)})")


def _manifolds(spec, n_layer: int) -> object:
    """What an assignment puts on attention and MLP (a named pair, or a custom mapping's patterns
    resolved on the model's hidden-matrix names), so a named and an equal custom one compare equal."""

    hidden = hidden_matrix_names(n_layer)
    if isinstance(spec, str):
        pair = NAMED_ASSIGNMENTS[spec]
        return None if pair is None else {n: pair[0] if any(k in n for k in ATTN_KEYS) else pair[1] for n in hidden}
    got = match_patterns(hidden, spec)
    return {n: got.get(n, "none") for n in hidden}
