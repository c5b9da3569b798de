"""The experiments a config can run (what ``workflow.report`` names): each is one module of this package,
``mwm/experiments/<name>.py``, declaring ``EXPERIMENT``: the studies its report reads, whether it reads (and
so trains) the grid's runs, the function that builds its report, and for a round of the per-baseline mechanism
experiment the round itself (:class:`MechRound`: its arms, rates, seeds and checks, from which
:mod:`mwm.paper` writes its pre-registered rules).

The schema's vocabulary of ``workflow.report``, the stage manifest's report inputs, the plan, the report's
entry point and the claims all read :data:`EXPERIMENTS`, so a new round is its module, its config and its
committed rules, nothing else. Standard library only: the config's schema loads it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["Experiment", "MechRound", "EXPERIMENTS", "STUDY_NAMES"]

#: The numerical studies, in the stage manifest's order (:data:`mwm.workflow.stages.STUDIES` holds to it).
STUDY_NAMES = ("alpha", "absorption", "audits", "solvers")


@dataclass(frozen=True)
class MechRound:
    """One pre-registered round of the per-baseline mechanism experiment: the ``<prefix>.*`` rows, decided by
    the same procedure (:func:`mwm.paper.mech2_contrast`, :func:`mwm.paper.mech_values`) over its own arms,
    rates and checks.

    ``kinds``: its interventions, the ``primary`` ones in Holm's family (x :data:`mwm.paper.MECH2_BASELINES`);
    ``rates``: the step sizes of its (rate, seed) cells (``<prefix>.fails`` reads the largest);
    ``per_kind_check``: the solver check must hold in attention and in the MLP apart (else pooled);
    ``arms``: what each kind's arm does, as the rules say it."""

    prefix: str
    rebuild: str
    rates: tuple[float, ...]
    min_seeds: int
    kinds: tuple[str, ...]
    primary: tuple[str, ...]
    per_kind_check: bool
    arms: Mapping[str, str]

    @property
    def secondary(self) -> tuple[str, ...]:
        return tuple(k for k in self.kinds if k not in self.primary)


@dataclass(frozen=True)
class Experiment:
    """``studies``: the studies its report reads; ``reads_runs``: whether it reads the grid's runs (a report
    that does not trains none of them, only what its studies capture); ``about``: one line for the docs;
    ``report``: ``"module:function"`` that builds its report (``(cfg, runs, studies folder, out, incomplete)``,
    imported only when a report is built); ``round``: the mechanism round it rebuilds, if it is one."""

    studies: tuple[str, ...]
    reads_runs: bool
    about: str
    report: str
    round: MechRound | None = None

    def builder(self) -> Callable:
        """The function :attr:`report` names."""
        module, _, name = self.report.partition(":")
        return getattr(importlib.import_module(module), name)


def _discover() -> dict[str, Experiment]:
    """Every module of this package, by its name (sorted), with its ``EXPERIMENT``."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        exp = getattr(importlib.import_module(f"{__name__}.{info.name}"), "EXPERIMENT", None)
        if not isinstance(exp, Experiment):
            raise TypeError(f"{__name__}.{info.name} declares no EXPERIMENT (an Experiment)")
        found[info.name] = exp
    return found


EXPERIMENTS: dict[str, Experiment] = _discover()
