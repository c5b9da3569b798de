"""When a run is unstable: the divergence rule on its evaluated losses, and the stop a signal asks for."""

from __future__ import annotations

import math

__all__ = ["DivergenceMonitor", "Preempted"]


class Preempted(Exception):
    pass


class DivergenceMonitor:
    """The divergence rule of ``train.divergence`` on the evaluated val losses: a
    non-finite loss, or ``patience`` evaluations in a row above the best so far by more
    than ``threshold``, marks the run unstable with its onset (the streak's first step)."""

    #: its checkpoint state (stored under these keys, beside the run's)
    KEYS = ("best_val", "status", "onset", "streak_start", "streak")

    def __init__(self, rule: dict, log=print):
        self.rule, self.log = rule, log
        self.best_val = math.inf
        self.status = "completed"
        self.onset: int | None = None
        self.streak_start: int | None = None
        self.streak = 0

    def check(self, step: int, val: float) -> bool:
        """Record the val loss of ``step``; True when the run must stop."""
        if not math.isfinite(val):
            self.mark_unstable(step)
            return True
        if val < self.best_val:
            self.best_val = val
        if val > self.best_val + self.rule["threshold"]:
            if self.streak == 0:
                self.streak_start = step
            self.streak += 1
            if self.streak >= self.rule["patience"]:
                self.mark_unstable(self.streak_start)
                return self.rule["stop"]
        else:
            self.streak, self.streak_start = 0, None
        return False

    def mark_unstable(self, onset: int) -> None:
        if self.status != "unstable":
            self.status, self.onset = "unstable", onset
            self.log(f"run marked unstable, onset step {onset}")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def load_state_dict(self, state: dict) -> None:
        for k in self.KEYS:
            setattr(self, k, state[k])
