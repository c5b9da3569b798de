"""Published records: a config's compact results kept in git, and the manifest that vouches for them.

A config that has been run (all of its grid or part) keeps its records in ``published/<name>/``:

- ``runs/<variant>/seed<S>/``: each finished run's logs and ``summary.json`` (:data:`RUN_RECORDS`)
  and its ``spectra/`` (the figures read them); no checkpoint, no captured pairs or sequences;
- ``studies/``: the studies' CSV and JSON, once every study the report reads is there;
- ``figures/``: the ledger and the DVC metrics file the report made from exactly these records;
- ``manifest.json``: every file's sha256 and size, the numerics version, the data the runs trained on,
  and per slice (one ``publish``) the code commit, the machine and the date.

Torch-free: the records are files and hashes; what they mean is the plan's (:mod:`mwm.plan.runs`).
"""

from __future__ import annotations

import json
import os
import platform
import time
import zlib
from importlib import metadata
from pathlib import Path

from mwm.config import ConfigError, config_hash
from mwm.data.reader import sha256_file
from mwm.numerics import code_version
from mwm.paths import inside
from mwm.plan.runs import RUN_FILES, RUN_FOLDERS
from mwm.workflow.stages import STAGES, rule_file_sections

__all__ = ["PUBLISHED_ROOT", "MANIFEST", "FORMAT", "BUDGET_BYTES", "RUN_RECORDS", "SPECTRA", "FIGURE_RECORDS",
           "RecordError", "published_dir", "sha256_file", "packed_size", "machine", "made_by", "study_settings",
           "data_digest", "read_manifest", "verify", "run_key", "parse_run_key", "holds_record"]

#: Where published records live, beside config/ in the checkout: ``published/<name>/``.
PUBLISHED_ROOT = "published"
#: The manifest of a published folder (the one file not listed in itself).
MANIFEST = "manifest.json"
#: The manifest's format; a reader refuses one it does not know.
FORMAT = 1
#: The most a config's published folder may add to git (bytes as git stores them, zlib-compressed).
BUDGET_BYTES = 15_000_000
#: A run's files that are published (the train rule's declared files, less its spectra folder).
RUN_RECORDS = RUN_FILES
#: A run's folder of singular-value snapshots (``step_*.npz``), published with it when the budget holds.
(SPECTRA,) = RUN_FOLDERS
#: What the report wrote that is published: the ledger (its verdicts) and the DVC metrics file.
FIGURE_RECORDS = ("ledger.csv", STAGES["report"].file("metrics"))


class RecordError(ConfigError):
    """A published record that is missing, damaged, edited or not the config's; the message names the file."""


def published_dir(name: str, root: str | Path = PUBLISHED_ROOT) -> Path:
    """``<root>/<name>``, the config name checked to stay inside ``root``."""
    return inside(root, name, what=f"config name (in {Path(root).as_posix()})")


def run_key(variant: str, seed: int) -> str:
    """A run's key in the manifest and its folder under ``runs/``: ``<variant>/seed<S>``."""
    return f"{variant}/seed{seed}"


def parse_run_key(key: str) -> tuple[str, int | None]:
    """``(variant, seed)`` of a run key (:func:`run_key`); the seed None when the key names none."""
    variant, _, folder = key.rpartition("/")
    number = folder[len("seed"):]
    return variant, int(number) if folder.startswith("seed") and number.isdigit() else None


def holds_record(man: dict, rel: str, path: Path) -> bool:
    """Whether ``path`` holds the bytes the manifest ``man`` lists as record ``rel``."""
    entry = man["files"].get(rel)
    return entry is not None and path.is_file() and sha256_file(path) == entry["sha256"]


def packed_size(path: str | Path) -> int:
    """The bytes git stores a file in: zlib at git's default level."""
    return len(zlib.compress(Path(path).read_bytes(), 6))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """What made a slice: CPU model, architecture, cores, Python, torch and numpy versions."""
    return {"cpu": _cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": _version("torch"), "numpy": _version("numpy")}


def made_by(now: float | None = None) -> dict:
    """A slice's provenance: the code version (commit), the machine and the UTC date."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return {"code_version": code_version(), "machine": machine(), "date": stamp}


def study_settings(cfg: dict) -> str:
    """The hash of the config sections the studies read (their rule file's): published studies are
    the config's own only while it is unchanged."""
    return config_hash({s: cfg.get(s) for s in rule_file_sections("studies")})


def data_digest(meta: dict) -> dict:
    """``{split: sha256}`` of a dataset's ``meta.json``: the tokens the runs trained on."""
    splits = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(splits, dict):
        return {}
    return {k: v.get("sha256") for k, v in sorted(splits.items()) if isinstance(v, dict)}


def read_manifest(folder: Path) -> dict:
    """The manifest of a published folder, checked for its shape (RecordError naming the file)."""
    path = folder / MANIFEST
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path} does not exist: {folder} holds no published records") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path} cannot be read ({type(exc).__name__}: {exc}): restore it from git "
                          f"(git checkout -- {path})") from exc
    need = {"format": int, "name": str, "numerics": int, "files": dict, "runs": dict, "slices": list}
    if not isinstance(man, dict):
        raise RecordError(f"{path} is not a manifest (a JSON object)")
    for key, kind in need.items():
        if not isinstance(man.get(key), kind):
            raise RecordError(f"{path}: key {key!r} is {man.get(key)!r}, not a {kind.__name__}")
    if man["format"] != FORMAT:
        raise RecordError(f"{path}: format {man['format']} is not this code's ({FORMAT})")
    return man


def _listed(folder: Path) -> set[str]:
    """Every file under ``folder`` (relative, posix), the manifest aside."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST}


def verify(folder: Path) -> dict:
    """The manifest of ``folder`` after checking every record against it: each listed file is there with
    its size and sha256, and no file is there that it does not list. RecordError naming the first file
    that fails (nothing is trusted from a folder that fails)."""
    man = read_manifest(folder)
    files = man["files"]
    for rel in sorted(files):
        entry = files[rel]
        path = inside(folder, *Path(rel).parts, what=f"{folder / MANIFEST}: file")
        if not isinstance(entry, dict) or not {"sha256", "bytes"} <= set(entry):
            raise RecordError(f"{folder / MANIFEST}: entry {rel!r} has no sha256 and bytes")
        if not path.is_file():
            raise RecordError(f"{path} is listed in {folder / MANIFEST} but missing: restore it from git "
                              f"(git checkout -- {folder})")
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise RecordError(f"{path} is not the published record (its sha256 or size differs from "
                              f"{folder / MANIFEST}): it was edited or damaged; nothing is trusted from {folder} "
                              f"(git checkout -- {path} restores it)")
    extra = sorted(_listed(folder) - set(files))
    if extra:
        raise RecordError(f"{folder / extra[0]} is not in {folder / MANIFEST}" +
                          (f" (nor {len(extra) - 1} other file(s))" if len(extra) > 1 else "") +
                          ": an added or renamed record; remove it or publish again")
    return man
