"""Run identities: where a training run of (config, assignment, seed, retraction) lives.

``results/runs/<config>/<variant>/seed<seed>/`` with ``variant`` the assignment
name, suffixed ``-colnorm`` for the DGram retraction ablation. Never the clock.
Checkpoints live beside it under ``results/checkpoints/`` (not a declared
workflow output, so they survive a failed attempt and a retry resumes).
"""

from __future__ import annotations

from pathlib import Path

# the variant helpers live in mwm.names (torch-free); mwm.train imports them from here
from .names import COLNORM_SUFFIX, NAMED_ASSIGNMENTS, is_colnorm, parse_variant, uses_dgram, variant_name

__all__ = ["RUN_FILES", "run_dir", "checkpoint_dir", "grid_variants", "assignment_spec", "check_grid",
           "run_config"]

#: The train settings of the inner solver: all a ``grid.solver_comparison`` candidate may change.
SOLVER_TRAIN_KEYS = ("solver", "warm_start", "solver_max_steps", "solver_tol", "admm_rho", "dual_ascent_steps",
                     "dual_ascent_alpha")

#: The files every finished run has (what the workflow declares as outputs).
RUN_FILES = ("summary.json", "metrics.csv", "eval.csv", "spectral.csv", "attention.csv")


def assignment_spec(grid: dict, name: str):
    """The assignment a grid name stands for: a named one, or a custom pattern mapping."""
    from .config import ConfigError

    custom = grid.get("custom", {})
    if name in custom:
        return dict(custom[name])
    if name in NAMED_ASSIGNMENTS:
        return name
    raise ConfigError(
        f"grid.assignments: unknown assignment {name!r}; choose one of {', '.join(NAMED_ASSIGNMENTS)} "
        f"or define it under grid.custom (defined: {', '.join(custom) or 'none'})"
    )


def check_grid(grid: dict) -> None:
    """Raise ConfigError for grid names that are neither named nor custom, or clash."""
    from .config import ConfigError

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
    import copy

    from .config import ConfigError, validate

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


def run_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:
    from .paths import inside

    return inside(Path(root) / "runs", config_name, variant, f"seed{seed}", what="run folder (name/variant/seed)")


def checkpoint_dir(root: str | Path, config_name: str, variant: str, seed: int) -> Path:
    from .paths import inside

    return inside(Path(root) / "checkpoints", config_name, variant, f"seed{seed}",
                  what="checkpoint folder (name/variant/seed)")


def grid_variants(grid: dict) -> list[str]:
    """Every variant the config trains: its assignments, plus colnorm copies of the
    DGram-using ones when ``retraction_ablation`` is on."""
    out = list(grid["assignments"])
    if grid.get("retraction_ablation"):
        out += [variant_name(a, "colnorm", grid.get("custom")) for a in grid["assignments"]
                if uses_dgram(a, grid.get("custom"))]
    return out
