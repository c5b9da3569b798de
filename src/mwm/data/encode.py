"""Parallel tokenization of work units, results handed back in order.

Units go to ``num_proc`` worker processes (``spawn``: see ``workers.context``) with at most ``2 x num_proc`` in flight, so memory stays bounded
by a few units however large the corpus; results come back in submission order,
so the bins do not depend on ``num_proc``. With ``num_proc == 1`` everything runs
in this process.
"""

from __future__ import annotations

import collections
from typing import Iterable, Iterator

import numpy as np

from mwm.data import workers
from mwm.data.tokenizer import EOT, get_encoding

__all__ = ["encode_unit", "encode_units", "DTYPE"]

DTYPE = np.dtype("<u2")  # uint16, little-endian, as nanoGPT's np.memmap(dtype=np.uint16) reads it


def _init_worker(state: dict | None) -> None:
    workers.set_state(state)
    get_encoding()


def encode_unit(unit) -> tuple[str, np.ndarray, int]:
    """``(split, ids, documents)`` for one unit: ``encode_ordinary`` per piece, EOT after each document."""
    enc = get_encoding()
    parts, docs = [], 0
    for text, eot in unit.texts():
        ids = enc.encode_ordinary(text)
        if eot:
            ids.append(EOT)
            docs += 1
        if ids:
            parts.append(np.array(ids, dtype=DTYPE))
    arr = np.concatenate(parts) if parts else np.empty(0, dtype=DTYPE)
    return unit.split, arr, docs


def encode_units(units: Iterable, num_proc: int, state: dict | None = None,
                 window: int | None = None) -> Iterator[tuple[str, np.ndarray, int]]:
    """Encode ``units`` (lazily consumed) with ``num_proc`` workers; yields in input order."""
    if num_proc <= 1:
        old = workers.state_copy()
        workers.set_state(state)
        try:
            for unit in units:
                yield encode_unit(unit)
        finally:
            workers.set_state(old)
        return
    get_encoding()  # provision once here, so the workers only read the cache
    ctx = workers.context()
    window = window or 2 * num_proc
    with ctx.Pool(num_proc, initializer=_init_worker, initargs=(state,)) as pool:
        pending: collections.deque = collections.deque()
        it = iter(units)
        exhausted = False
        while True:
            while not exhausted and len(pending) < window:
                try:
                    unit = next(it)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(pool.apply_async(encode_unit, (unit,)))
            if not pending:
                break
            yield pending.popleft().get()
