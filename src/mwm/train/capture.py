"""The (W, update direction) pairs a run saves for the studies."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mwm.io import atomic_savez
from mwm.train.divergence import DivergenceMonitor

__all__ = ["PairCapture"]


class PairCapture:
    """The (W, update direction) pairs a run saves: ``pairs.npz`` at
    ``train.capture_pairs_step`` (the absorption study) and ``sequence/step_NNNNNN.npz``
    at each step of ``train.capture_sequence`` or of the solver study's window of a grid run
    (``studies.solvers.source: grid``); ``sequence/`` exists in every finished run folder
    (a declared output of the workflow), empty where nothing is captured."""

    def __init__(self, tc: dict, run_dir: Path, log=print, window: dict | None = None):
        """``window``: the solver study's ``{start, length}`` for a grid run that captures
        (:func:`mwm.plan.runs.capture_window`), used when ``train.capture_sequence`` is unset."""
        self.at, self.max_iters = tc["capture_pairs_step"], tc["max_iters"]
        self.sequence = tc["capture_sequence"] or window
        self.dir, self.log = run_dir, log
        self.path = run_dir / "pairs.npz"

    def paths(self, step: int) -> list[Path]:
        """Where the pairs of ``step`` go (none: the step captures nothing)."""
        out = []
        if self.at is not None and step == self.at:
            out.append(self.path)
        seq = self.sequence
        if seq is not None and seq["start"] <= step < seq["start"] + seq["length"]:
            out.append(self.dir / "sequence" / f"step_{step:06d}.npz")
        return out

    def save(self, inputs: dict, path: Path, step: int) -> None:
        """``inputs`` as :meth:`ManifoldMuon.step_with_inputs` returns them, at ``path``."""
        names = sorted(inputs)
        arrays = {"names": np.array(names), "manifolds": np.array([inputs[n][0] for n in names]),
                  "captured": np.array(True), "step": np.array(step), "reason": np.array("")}
        for i, n in enumerate(names):
            arrays[f"W_{i}"] = inputs[n][1].float().cpu().numpy()
            arrays[f"G_{i}"] = inputs[n][2].float().cpu().numpy()
        atomic_savez(path, arrays)
        if path == self.path:
            self.log(f"saved {len(names)} (W, G) pairs at step {step}")

    def missing(self, assignment: str, has_muon: bool, steps_done: int, div: DivergenceMonitor) -> str | None:
        """Why the run holds no pairs at ``capture_pairs_step`` (None: it does, or none asked)."""
        cs = self.at
        if cs is None or self.path.exists():
            return None
        if not has_muon:
            return f"assignment {assignment} has no Muon matrices"
        if cs >= self.max_iters:
            return f"capture_pairs_step {cs} is not below max_iters {self.max_iters}"
        if div.status == "unstable" and steps_done <= cs:
            return (f"the run became unstable at step {div.onset} and stopped at step {steps_done}, "
                    f"before step {cs}")
        return f"no pairs were saved at step {cs} (the run stopped at step {steps_done})"

    def save_none(self, reason: str) -> None:
        """The declared pairs output of a run that has none: an explicit, empty file."""
        atomic_savez(self.path, {
            "names": np.array([], dtype=str), "manifolds": np.array([], dtype=str), "captured": np.array(False),
            "step": np.array(self.at), "reason": np.array(reason)})
        self.log(f"no (W, G) pairs: {reason}")
