"""Which config file a config name's results belong to.

Results land under ``<root>/runs/<name>/`` (and ``studies/<name>``, ``paper_figures/<name>``)
by the config's ``name``, so a copied config that keeps the name would write over the
original's results. ``<root>/runs/<name>/.owner.json`` records the config file that uses the
name and the hash of its settings (the whole validated config); it is written atomically when
a workflow run starts (Snakemake's ``onstart``, not on a dry run) and by ``mwm.train``.

Another file is told from the same file edited by its path (relative to the working
directory, the repository root for the workflow; absolute outside it):

- the same file, whatever its settings now: accepted (an edited config is a config change,
  which the rules' params and the run identities handle), and the record follows it;
- another file with the same settings (a copy, a renamed file): accepted;
- another file with other settings: refused before any job, naming both files. The way out is
  a new ``name`` in the copy, or ``MWM_TAKE_OVER=<name>`` in the environment to hand the name
  (and the results under it) to the new file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mwm.config import ConfigError, config_hash

__all__ = ["OWNER_FILE", "TAKE_OVER_ENV", "OwnerError", "owner_path", "config_id", "check_owner", "claim"]

#: The record in ``<root>/runs/<name>/`` (a dot name: no variant folder can be called so).
OWNER_FILE = ".owner.json"
#: Environment variable naming a config name that the current config file may take over.
TAKE_OVER_ENV = "MWM_TAKE_OVER"


class OwnerError(ConfigError):
    """A config file claims a name whose results belong to another config file."""


def owner_path(root: str | Path, name: str) -> Path:
    from mwm.plan.runs import config_dir

    return config_dir("runs", name, root) / OWNER_FILE


def config_id(config_file: str | Path) -> str:
    """How the record names a config file: relative to the working directory when inside it."""
    from mwm.paths import checkout_relative

    return checkout_relative(config_file)


def _record(root: str | Path, name: str) -> dict | None:
    path = owner_path(root, name)
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise OwnerError(f"{path} cannot be read ({exc}); delete it to let {name!r} be claimed again") from exc
    if not isinstance(rec, dict) or not {"config_file", "settings_hash"} <= set(rec):
        raise OwnerError(f"{path} is not an owner record (config_file, settings_hash); delete it to let "
                         f"{name!r} be claimed again")
    return rec


def check_owner(root: str | Path, cfg: dict, config_file: str | Path) -> dict | None:
    """The record of ``cfg``'s name (None: unclaimed); OwnerError when another config file
    with other settings holds it and ``MWM_TAKE_OVER`` does not name it."""
    name = cfg["name"]
    rec = _record(root, name)
    if rec is None:
        return None
    mine, settings = config_id(config_file), config_hash(cfg)
    if rec["config_file"] == mine or rec["settings_hash"] == settings:
        return rec
    if os.environ.get(TAKE_OVER_ENV) == name:
        return rec
    raise OwnerError(
        f"config {mine} has name {name!r}, but the results under {Path(root) / 'runs' / name}/ (and "
        f"studies/{name}, paper_figures/{name}) belong to {rec['config_file']}, whose settings differ "
        f"(settings hash {rec['settings_hash']}, {mine}: {settings}); running {mine} would overwrite them. "
        f"Give {mine} its own name, or hand the name over with {TAKE_OVER_ENV}={name} "
        f"(its record: {owner_path(root, name)})")


def claim(root: str | Path, cfg: dict, config_file: str | Path) -> None:
    """Check, then record ``config_file`` and its settings as the owner of ``cfg``'s name
    (written only when the record changes)."""
    rec = check_owner(root, cfg, config_file)
    new = {"config_file": config_id(config_file), "settings_hash": config_hash(cfg)}
    if rec is not None and rec["config_file"] != new["config_file"] and rec["settings_hash"] == new["settings_hash"] \
            and os.environ.get(TAKE_OVER_ENV) != cfg["name"]:
        return  # a copy with the same settings: the name stays with the first file
    if rec is None or {k: rec.get(k) for k in new} != new:
        from mwm.io import atomic_write_json

        atomic_write_json(owner_path(root, cfg["name"]), new)
