"""Work units and what they are cut from: the safe cuts of long documents, the text and row units
tokenizer workers run, the base of every source, and the document split."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from mwm.data import workers
from mwm.errors import DataError


UNIT_CHARS = 1 << 18      # ~256k characters (~64k tokens) of text per work unit
HF_UNIT_ROWS = 256        # rows of a Hugging Face dataset per work unit
READ_BLOCK = 1 << 20      # bytes read from a text file at a time


def split_orders(n_docs: int, method: str, val_fraction: float, seed: int) -> list[tuple[str, np.ndarray]]:
    """``[(split, document indices)]`` of a source read by index: ``all`` in order for the ``tail``
    split (cut by tokens later), else ``train`` and ``val`` by :func:`split_indices`."""
    if method == "tail":
        return [("all", np.arange(n_docs))]
    train, val = split_indices(n_docs, val_fraction, seed)
    return [("train", train), ("val", val)]


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) document indices, as ``Dataset.train_test_split(test_size=val_fraction,
    seed=seed, shuffle=True)`` of Hugging Face datasets picks them."""
    n_val = math.ceil(val_fraction * n)
    n_train = n - n_val
    if n_val < 1 or n_train < 1:
        raise DataError(f"split documents needs at least 2 documents (train and val get one "
                        f"each at least); the corpus has {n} (use split: tail for one long text)")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[n_val:], perm[:n_val]


_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def last_safe_cut(text: str, lo: int, hi: int) -> int:
    """Largest cut c with lo < c <= hi and c < len(text) that is safe, else -1."""
    j = text.rfind("\n", lo, min(hi, len(text) - 1))
    while j > 0 and j >= lo:
        if text[j + 1] in _ALNUM and not text[j - 1].isspace():
            return j + 1
        j = text.rfind("\n", lo, j)
    return -1


_SAFE = re.compile(r"(?<=\S)\n(?=[A-Za-z0-9])")


def _first_safe_cut(text: str, start: int) -> int:
    m = _SAFE.search(text, start)
    return m.end() if m else -1


def iter_pieces(text: str, target: int = UNIT_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``target`` characters, cut only at safe points."""
    pos = 0
    while len(text) - pos > target:
        cut = last_safe_cut(text, pos + 1, pos + target)
        if cut < 0:
            cut = _first_safe_cut(text, pos + target)
            if cut < 0:
                break
        yield text[pos:cut]
        pos = cut
    yield text[pos:]


# ---------------------------------------------------------------------------
# work units (run in tokenizer workers)

@dataclass
class TextUnit:
    """Text pieces in order; ``eot[i]``: the document ends after piece i."""

    split: str
    pieces: list[str] = field(default_factory=list)
    eot: list[bool] = field(default_factory=list)
    chars: int = 0

    def texts(self) -> Iterator[tuple[str, bool]]:
        return zip(self.pieces, self.eot, strict=True)

    def add(self, piece: str, eot: bool) -> int:
        """Append a piece; returns the unit's characters so far."""
        self.pieces.append(piece)
        self.eot.append(eot)
        self.chars += len(piece)
        return self.chars


@dataclass
class RowsUnit:
    """Rows ``rows`` (in this order) of the worker's dataset ``key``; each row one document."""

    split: str
    key: str
    rows: list
    column: str

    def texts(self) -> Iterator[tuple[str, bool]]:
        ds = workers.lookup(self.key)
        for text in ds[self.rows][self.column]:
            yield ("" if text is None else text), True


# ---------------------------------------------------------------------------
# sources


class Source:
    """Base of the corpora: ``n_docs``, ``doc_pieces(i)``, ``info()``, ``plan(...)``."""

    name = "?"
    n_docs = 0
    worker_state: dict | None = None

    def doc_pieces(self, i: int, target: int) -> Iterator[str]:
        raise NotImplementedError

    def materialize(self, workdir: Path, num_proc: int, log) -> None:
        """Called by ``prepare`` with its work folder before :meth:`plan` (sources that
        must fetch or decode something first; ``n_docs`` is final afterwards)."""

    def reference_counts(self) -> dict | None:
        """Published counts the prepared bins must show (see ``data.expect``), or None."""
        return None

    def close(self) -> None:
        """Called by ``prepare`` before its work folder goes: let go of what lives there."""

    def info(self) -> dict:
        raise NotImplementedError

    def _units(self, split: str, order: Iterable[int], target: int) -> Iterator[TextUnit]:
        unit = TextUnit(split)
        for i in order:
            pieces = iter(self.doc_pieces(int(i), target))
            prev = next(pieces, "")
            for piece in pieces:  # all but a document's last piece: no end-of-text after it
                full = unit.add(prev, False) >= target
                prev = piece
                if full:
                    yield unit
                    unit = TextUnit(split)
            if unit.add(prev, True) >= target:
                yield unit
                unit = TextUnit(split)
        if unit.pieces:
            yield unit

    def plan(self, method: str, val_fraction: float, seed: int,
             target: int = UNIT_CHARS) -> list[tuple[str, Iterator]]:
        """``[(split, units), ...]`` in write order; split ``all`` for method tail."""
        if method == "tail":
            return [("all", self._units("all", range(self.n_docs), target))]
        train, val = split_indices(self.n_docs, val_fraction, seed)
        return [("train", self._units("train", train, target)),
                ("val", self._units("val", val, target))]
