"""The small-vocab remap: the K most frequent ids of the train split, plus one UNK.

For small CPU models the 50k-row LM head dominates the step time. The remap keeps
the K ids that occur most often in ``train.bin`` (ties broken by the smaller id;
end-of-text is always kept, taking the K-th place if it is not among them), gives
them new ids 0..K-1 in the order of their GPT-2 ids, and maps every other id to
UNK = K, so the model's vocabulary is K + 1. Deterministic from the train split.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mwm.errors import DataError

__all__ = ["UINT16_IDS", "check_fits_uint16", "count_ids", "choose_kept", "lookup_table",
           "remap_file"]

UINT16_IDS = 1 << 16
CHUNK_TOKENS = 1 << 22  # tokens per streamed chunk (8 MiB of uint16)


def check_fits_uint16(n_vocab: int, what: str) -> None:
    """Raise DataError unless ids 0..n_vocab-1 fit in uint16."""
    if not 1 <= n_vocab <= UINT16_IDS:
        raise DataError(f"{what}: a vocabulary of {n_vocab} ids does not fit the uint16 bins "
                        f"(at most {UINT16_IDS}); use a smaller vocabulary (data.vocab_size)")


def _chunks(path: Path, dtype):
    mm = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.empty(0, dtype)
    for start in range(0, len(mm), CHUNK_TOKENS):
        yield np.asarray(mm[start:start + CHUNK_TOKENS])


def count_ids(path: Path, n_vocab: int, dtype) -> np.ndarray:
    """Occurrences of each id in a bin (int64, length n_vocab), streamed."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for chunk in _chunks(Path(path), dtype):
        counts += np.bincount(chunk, minlength=n_vocab)[:n_vocab]
    return counts


def choose_kept(counts: np.ndarray, k: int, always: int) -> np.ndarray:
    """The kept ids, ascending: top ``k`` by count (ties: smaller id first), ``always`` included."""
    n = len(counts)
    if not 1 <= k < n:
        raise DataError(f"data.vocab_size: K={k} must be between 1 and {n - 1} "
                        f"(null keeps the full vocabulary of {n})")
    order = np.lexsort((np.arange(n), -counts))  # by count descending, then id ascending
    top = order[:k]
    if always not in top:
        top = np.concatenate([top[:-1], [always]])
    return np.sort(top).astype(np.int64)


def lookup_table(kept: np.ndarray, n_vocab: int, dtype) -> np.ndarray:
    """old id -> new id; ids not kept go to UNK = len(kept)."""
    table = np.full(n_vocab, len(kept), dtype=dtype)
    table[kept] = np.arange(len(kept), dtype=dtype)
    return table


def remap_file(src: Path, dst: Path, table: np.ndarray, unk: int) -> tuple[int, str]:
    """Write ``table[src]`` to ``dst`` in chunks; returns (UNK count, sha256 of dst)."""
    n_unk, sha = 0, hashlib.sha256()
    with open(dst, "wb") as fh:
        for chunk in _chunks(Path(src), table.dtype):
            new = table[chunk]
            n_unk += int(np.count_nonzero(new == unk))
            data = new.tobytes()
            sha.update(data)
            fh.write(data)
    return n_unk, sha.hexdigest()
