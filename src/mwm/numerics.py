"""The numerics version: which version of the optimizer's arithmetic made a run or a study.

A change of code that moves any training or study number (a *numerics change*) bumps
:data:`VERSION`; a refactor that moves none does not. ``tests/measure/test_golden.py`` holds the line
between the two: it fails when a golden output (:mod:`mwm.measure.golden`) moves beyond float rounding
while :data:`VERSION` stays.

The version is part of every run's identity (:func:`mwm.plan.runs.run_identity`), so a run made by
another version is not its config's run: Snakemake sets it aside and retrains it
(:mod:`mwm.setaside`), ``mwm.workflow.status`` flags it and the report refuses it, each with
:func:`version_problem`'s line. Studies record it in their derived JSON, and the train and study
rules (and DVC stages) carry it as a parameter, so a bump reruns them in both tools.

Runs from before versions were recorded carry only the commit they were trained at
(``code_version`` in ``summary.json``): a commit that git shows to predate the first versioned
change counts as version 1, any other as unknown.

Torch-free (standard library only): the Snakefile and DVC read :data:`VERSION` from here.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["VERSION", "Change", "HISTORY", "FIRST_VERSIONED", "code_version", "commit_of", "recorded_version",
           "version_problem"]

#: The numerics version of this code. Bump it, with an entry in :data:`HISTORY`, in
#: ``docs/findings.md`` (Numerics changes) and a rewritten golden file, on a numerics change.
VERSION = 8


@dataclass(frozen=True)
class Change:
    version: int
    commits: tuple[str, ...]  # the commits that made it (short hashes)
    what: str
    affects: str


#: Every version, oldest first; ``docs/findings.md`` lists the same (``tests/test_numerics.py``).
HISTORY = (
    Change(1, (), "the numerics of every commit before 7d94d44 (no version was recorded then)",
           "every run and study made before 7d94d44"),
    Change(2, ("7d94d44",), "DGram retractions: a Gram wider than eigh resolves (float32 1e3, float64 1e10) "
           "is retracted by SVD in float64",
           "DGram-using runs wherever a DGram Gram is that wide (2.8% of logged DGram matrices at eta 0.02, "
           "44% at 0.16); the absorption study"),
    Change(3, ("c28a199", "5b7933e"), "the solver study's converged reference solves on W / sigma_max; a "
           "Gram-order dual ascent whose result is non-finite or not msign-sized is redone in the direct order",
           "the solver study's e_W_conv / e_A_conv wherever DGram weights are not at unit scale; runs whose "
           "Gram-order solve blew up (they stopped with non-finite weights before)"),
    Change(4, ("d504046",), "DGram retractions (paper and colnorm) computed in float64 from the float32 weight: "
           "the float32 Gram's eigh lost eps kappa^2, up to 10x the released float32 SVD's error",
           "every run with a DGram matrix (dgram, hetero, hetero-inv, hetero-admm and their variants), at float32 "
           "rounding per step; the alpha, absorption, audit and solver studies wherever they retract a DGram weight"),
    Change(5, ("91ce8b4",), "DGram retractions: only the matrices of a bank whose Gram eigh cannot resolve go to "
           "the float64 SVD (the whole bank did), by one SVD each (svd, then svdvals, before)",
           "runs with a DGram matrix in a bank where some but not all Grams are wider than 1e10 (none logged in "
           "the default config; 4.7% of logged DGram matrices in config/mechanism.yaml), at float64 rounding where "
           "the whole bank was wide; the studies that retract such banks"),
    Change(6, ("649ef12",), "the scale-normalized inner solve (train.solver_normalize) also divides the momentum by "
           "its RMS singular value and maps the multiplier back (it solved on W / sigma_max only)",
           "runs with train.solver_normalize (config/mechanism.yaml's -norm arms); the solver study's -norm "
           "candidates and its converged reference at float rounding"),
    Change(7, ("964bda1",), "the solver study's cheapest matching candidate: a tie in msign cost goes to the smaller "
           "e_W, then the name (it went to the faster on the clock, so rebuilds on one machine disagreed)",
           "the solver study's derived cheapest_matching wherever two matching candidates tie in cost (the "
           "default: admm-cold-T1-rho2 over admm-warm-T1-rho2 on both manifolds), and the report's solver table; "
           "no training number (every run's identity carries the version, so runs are retrained once)"),
    Change(8, ("21e38c4", "0d68bf2"), "solver.csv's converged reference: ADMM in float64 with an exact (SVD) "
           "projection, run until every matrix's duality gap is <= 2e-3 and its tangent violation <= 1e-3 (it was 10 "
           "float32 ADMM iterations), in banks of one tall shape, with the gap logged; the solver check also per "
           "module kind",
           "every run's solver.csv (alignment_converged, violation_converged, the new gap_converged) and the "
           "manipulation record in summary.json; no training loss or weight")
)

#: The first change after which a run's commit alone no longer tells its numerics.
FIRST_VERSIONED = HISTORY[1].commits[0]

_CODE = re.compile(r"[+-]g?([0-9a-f]{7,40})(-dirty)?$")  # git describe --always --dirty


def code_version() -> str:
    """The package version and the checkout's commit (``0.1.0+be30d1d``, ``-dirty`` with uncommitted
    changes; the bare version outside a git checkout): what a run or a published record was made by."""
    from mwm import __version__

    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return f"{__version__}+{out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return __version__


def commit_of(code_version: str | None) -> tuple[str, bool] | None:
    """(commit, dirty) of a ``code_version`` such as ``0.1.0+be30d1d-dirty``; None when it names none."""
    m = _CODE.search(code_version or "")
    return (m.group(1), bool(m.group(2))) if m else None


@lru_cache(maxsize=None)
def _predates_first_change(commit: str) -> bool | None:
    """Whether git shows ``commit`` to be an ancestor of the first versioned change's parent (None:
    git cannot tell, e.g. no repository or an unknown commit)."""
    root = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "merge-base", "--is-ancestor", commit, f"{FIRST_VERSIONED}^"], cwd=root,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)


def recorded_version(summary: dict) -> int | None:
    """The numerics version a run's ``summary.json`` was made with (None: unknown)."""
    identity = summary.get("identity")
    if isinstance(identity, dict) and "numerics" in identity:
        v = identity["numerics"]
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    found = commit_of(summary.get("code_version"))
    if found is None:
        return None
    commit, dirty = found
    # a dirty tree may hold any later change, so only a clean commit proves version 1
    return 1 if not dirty and _predates_first_change(commit) else None


def version_problem(summary: dict) -> str | None:
    """One line on why a run's numerics are not this code's (None: they are)."""
    got = recorded_version(summary)
    if got == VERSION:
        return None
    where = "docs/findings.md, Numerics changes"
    if got is None:
        code = summary.get("code_version")
        why = (f"it records no numerics version, and its code {code} is not a clean commit before "
               f"{FIRST_VERSIONED}" if code else "it records neither a numerics version nor its code")
        return f"made with unknown numerics ({why}); this code's numerics version is {VERSION} ({where})"
    return f"made with numerics version {got}; this code's is {VERSION} ({where})"
