"""The data stage's worker processes: the state a tokenizer worker reads (datasets opened once per
process, looked up by key from a work unit) and an order-keeping process map. Owned here so the
corpus readers (``corpora``) and the encoder (``encode``) need not import each other."""

from __future__ import annotations

import multiprocessing as mp
from typing import Iterator

_STATE: dict = {}


def set_state(state: dict | None) -> None:
    """Replace this process's worker state (``None``: empty)."""
    _STATE.clear()
    _STATE.update(state or {})


def state_copy() -> dict:
    """This process's worker state, copied (to restore after an in-process run)."""
    return dict(_STATE)


def lookup(key: str):
    """The object stored under ``key`` in this process's worker state."""
    return _STATE[key]


def context():
    """Spawn: a fork after torch (or any threaded library) is loaded in the parent can deadlock the
    child on a lock held by a thread that did not survive the fork. Workers rebuild their state from
    the pool's initializer and read the tokenizer from the cache the parent provisioned."""
    return mp.get_context("spawn")


def map_ordered(fn, jobs: list, num_proc: int) -> Iterator:
    """``fn(job)`` for each job (picklable), ``num_proc`` processes, results in job order."""
    if num_proc <= 1 or len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    with context().Pool(min(num_proc, len(jobs))) as pool:
        yield from pool.imap(fn, jobs)
