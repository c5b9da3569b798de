"""The config's ``data`` section: defaults, the keys that shape the tokens, the folder.

A section is validated against ``mwm/config/schema/data.yaml`` through
:func:`mwm.config.validate` (defaults filled, unknown keys refused). Only the keys
that change the bytes of the bins (:func:`content`) enter ``meta.json`` and the
folder name; ``num_proc`` does not.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

from mwm.config import config_hash, validate
from mwm.errors import DataError

__all__ = ["normalize", "content", "defaults", "dataset_dir", "DATA_ROOT"]

DATA_ROOT = Path("data")

_COMMON = ("corpus", "tokenizer", "vocab_size", "split", "val_fraction", "seed")
_PER_CORPUS = {
    "shakespeare": (),
    "text": ("paths", "encoding_errors"),
    "openwebtext": ("hf_dataset", "hf_layout", "archive_order", "hf_revision", "hf_split", "hf_text_field"),
}


def normalize(section: dict | None) -> dict:
    """A validated copy of a ``data`` section with every default filled in."""
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise DataError(f"the data section must be a mapping, got {type(section).__name__}")
    out = validate({"name": "data", "data": copy.deepcopy(section)}, source="<data section>")["data"]
    if out["corpus"] != "text" and out["paths"]:
        raise DataError(f"data.paths is only read for corpus text, not {out['corpus']!r} "
                        f"(value: {json.dumps(out['paths'])})")
    if out["corpus"] == "text" and not out["paths"]:
        raise DataError("corpus text needs data.paths: the files or globs to read (value: [])")
    return out


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    return normalize({})


def defaults() -> dict:
    """The schema's defaults (corpus shakespeare)."""
    return copy.deepcopy(_defaults())


def content(section: dict) -> dict:
    """The keys of a normalized section that shape the bins, for its corpus (sorted).

    ``seed`` only shapes a ``documents`` split; a ``tail`` split does not shuffle.
    """
    keys = _COMMON + _PER_CORPUS[section["corpus"]]
    if section["split"] == "tail":
        keys = tuple(k for k in keys if k != "seed")
    return {k: copy.deepcopy(section[k]) for k in sorted(keys)}


def dataset_dir(data_section: dict | None, root: str | Path = DATA_ROOT) -> Path:
    """The folder under ``data/`` for a ``data`` section: deterministic, one per token set.

    ``<corpus>``, then ``-v<K>`` with the small-vocab remap, ``-tail<f>`` for a tail
    split (``-val<f>`` for a documents split with a non-default fraction),
    ``-seed<s>`` for a non-default shuffle seed, and ``-<12 hex>`` hashing the
    corpus's own keys for ``text`` (paths, encoding_errors) and for ``openwebtext``
    when its hf_* keys are not the defaults. E.g. ``data/shakespeare-v2048``,
    ``data/shakespeare-v2048-tail0.1``, ``data/openwebtext``. ``num_proc`` never
    enters it.
    """
    sec = normalize(data_section)
    dflt = defaults()
    parts = [sec["corpus"]]
    if sec["tokenizer"] != dflt["tokenizer"]:
        parts.append(sec["tokenizer"])
    if sec["vocab_size"] is not None:
        parts.append(f"v{sec['vocab_size']}")
    if sec["split"] == "tail":
        parts.append(f"tail{sec['val_fraction']!r}")
    else:
        if sec["val_fraction"] != dflt["val_fraction"]:
            parts.append(f"val{sec['val_fraction']!r}")
        if sec["seed"] != dflt["seed"]:
            parts.append(f"seed{sec['seed']}")
    own = {k: sec[k] for k in _PER_CORPUS[sec["corpus"]]}
    if sec["corpus"] == "text" or any(own[k] != dflt[k] for k in own):
        parts.append(config_hash(own)[:12])
    from mwm.paths import inside

    return inside(root, "-".join(parts), what="data folder")
