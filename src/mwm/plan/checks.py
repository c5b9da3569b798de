"""What a config alone can tell about its runs, checked before any job.

:func:`check_config` applies the model's shape rules and maps every ``grid.custom``
pattern onto the model's hidden-matrix names (:mod:`mwm.config.layout`: torch-free, no data):
``n_embd`` must divide by ``n_head``, and every pattern must match a hidden matrix; with
``studies.solvers.source: grid`` the captured runs must be in the grid and their window
inside their training; a learning-rate sweep and its intervention agree with the rest
(:func:`mwm.plan.variants.check_sweep`). ``rules/common.smk`` calls it when Snakemake loads the
workflow, ``mwm.train`` before it reads any data.

:func:`check_splits` (in :mod:`mwm.data.splits`, so the data stage needs no training code)
compares the data stage's ``meta.json`` (token counts of each split) with
``model.block_size``: the data job checks it after tokenizing (``mwm.data prepare
--config``), and ``rules/common.smk`` at load when the data folder already exists (another
config with the same data section made it), so no training starts on a split too short.
"""

from __future__ import annotations

from mwm.config import ConfigError
from mwm.data.splits import check_splits, min_split_tokens
from mwm.plan.variants import check_sweep

__all__ = ["check_config", "check_run", "check_loggers", "check_splits", "min_split_tokens"]


def _source(cfg: dict, source: str | None) -> str:
    return source or f"config {cfg['name']!r}"


def check_config(cfg: dict, source: str | None = None) -> None:
    """Raise ConfigError (naming ``source``, the key and the value) for a model shape that
    cannot be built or a grid.custom pattern that matches no hidden matrix of it."""
    where = _source(cfg, source)
    for name in cfg["grid"]["assignments"]:
        check_run(cfg, name, where)
    _check_grid_capture(cfg, where)
    check_sweep(cfg, where)
    check_loggers(cfg, where)
    check_ablation(cfg, where)


def check_ablation(cfg: dict, source: str | None = None) -> None:
    """Refuse the retraction ablation where an assignment already trains with the colnorm retraction: it
    and its ``-colnorm`` copy would train the same thing under one identity, a run compared with itself."""
    grid = cfg["grid"]
    if not grid.get("retraction_ablation") or grid.get("sweep"):
        return
    from mwm.config.names import uses_dgram
    from mwm.plan.runs import run_config

    for a in grid["assignments"]:
        if uses_dgram(a, grid.get("custom")) and run_config(cfg, a)["train"]["dgram_retraction"] == "colnorm":
            raise ConfigError(
                f"{_source(cfg, source)}: grid.retraction_ablation: true with train.dgram_retraction: colnorm "
                f"(assignment {a}{', through grid.train_overrides' if a in grid.get('train_overrides', {}) else ''}):"
                f" {a} and {a}-colnorm would train the same runs, and the ablation figure would compare a run with "
                "itself. Keep train.dgram_retraction: paper (the ablation adds the colnorm copies), or set "
                "grid.retraction_ablation: false")


def check_loggers(cfg: dict, source: str | None = None) -> None:
    """Every logger of ``workflow.loggers`` has its package installed (else every training job would die
    on its import, after the plan passed)."""
    import importlib.util

    from mwm.config.names import LOGGERS

    for name in (cfg.get("workflow") or {}).get("loggers") or []:
        package = LOGGERS.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{_source(cfg, source)}: workflow.loggers: {name} needs the {package} package, which "
                              f"is not installed: pip install {package} (pinned in pyproject.toml), or drop {name}")


def check_run(cfg: dict, assignment: str, source: str | None = None) -> None:
    """What one run of ``assignment`` needs of ``cfg`` (a hand run's, overrides applied): a model
    shape that can be built and, for a grid.custom assignment, patterns that match its hidden matrices.
    The grid-wide checks (the solver study's capture window, the sweep) are :func:`check_config`'s."""
    from mwm.config.layout import check_dims, hidden_matrix_names, model_shape
    from mwm.optim.vocab import match_patterns
    from mwm.plan.variants import assignment_spec

    where = _source(cfg, source)
    m = cfg["model"]
    shape = model_shape(m)
    try:  # the vocabulary may come from the data later; the names do not depend on it
        check_dims(**shape, vocab_size=m["vocab_size"] or 2, block_size=m["block_size"])
    except ValueError as exc:
        raise ConfigError(f"{where}: model: {exc}") from exc
    spec = assignment_spec(cfg["grid"], assignment)
    if isinstance(spec, str):
        return
    try:
        match_patterns(hidden_matrix_names(shape["n_layer"]), spec)
    except ValueError as exc:
        raise ConfigError(f"{where}: grid.custom.{assignment}: {exc}") from exc


def _check_grid_capture(cfg: dict, where: str) -> None:
    """``studies.solvers.source: grid``: the captured runs are in the grid, and their window
    lies inside each one's training (``max_iters`` with its grid.train_overrides)."""
    from mwm.plan.runs import capture_variants, grid_variants, run_config

    sec = cfg["studies"]["solvers"]
    grid = cfg["grid"]
    rate = sec.get("rate")
    if rate is not None and (sec["source"] != "grid" or not grid.get("sweep") or not any(
            abs(float(r) - float(rate)) <= 1e-12 * float(rate) for r in grid["sweep"]["muon_lr"])):
        raise ConfigError(f"{where}: studies.solvers.rate: {rate} needs studies.solvers.source: grid and a rate of "
                          f"grid.sweep.muon_lr ({(grid.get('sweep') or {}).get('muon_lr')})")
    if sec["source"] != "grid":
        return
    variants = grid_variants(grid)
    missing = [v for v in capture_variants(cfg) if v not in variants]
    if missing:
        raise ConfigError(f"{where}: studies.solvers.assignments: {missing} not in grid.assignments "
                          f"({', '.join(grid['assignments'])})"
                          + (f" at studies.solvers.rate {rate:g}" if rate is not None else
                             "; a sweep's runs need studies.solvers.rate" if grid.get("sweep") else "")
                          + "; with studies.solvers.source: grid the grid's runs capture the sequences")
    if sec["seed"] not in grid["seeds"]:
        raise ConfigError(f"{where}: studies.solvers.seed: {sec['seed']} not in grid.seeds {grid['seeds']} "
                          "(studies.solvers.source: grid)")
    stop = sec["capture_start"] + sec["capture_length"]
    for a in capture_variants(cfg):
        tc = run_config(cfg, a)["train"]
        if tc["capture_sequence"] is not None:
            raise ConfigError(f"{where}: train.capture_sequence: {tc['capture_sequence']} and studies.solvers.source: "
                              "grid both capture sequences; keep one")
        if stop > tc["max_iters"]:
            raise ConfigError(f"{where}: studies.solvers.capture_start + capture_length = {stop} is past "
                              f"train.max_iters {tc['max_iters']} of the grid's {a} runs "
                              "(studies.solvers.source: grid)")
