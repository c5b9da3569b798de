"""Paths built from config or command-line values stay inside their parent folder.

Every folder whose name comes from a config (``name``, the corpus folder, an
assignment variant) or the command line (``--seed``) is built by :func:`inside`:
each part must be one plain path component (not empty, not ``.`` or ``..``, no
separator, not starting with ``.`` or ``-``), and the joined path, made absolute,
must lie under the parent. Symlinks are not resolved: one you make on purpose
(``data/openwebtext -> /scratch/owt``) is followed, as any other file you place. A config
``name: ".."`` would otherwise point the report's output folder at the repository itself,
which Snakemake deletes before the job.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from mwm.errors import ConfigError

__all__ = ["UnsafePathError", "NAME_PATTERN", "CONFIG_ENV", "check_component", "inside", "check_out_root",
           "checkout_relative", "leads_out", "first_on_pythonpath"]

#: The environment variable through which the workflow hands its config file to the data stage (whose
#: params hold only the data section, so configs sharing a dataset do not rerun each other's).
CONFIG_ENV = "MWM_CONFIG_FILE"

#: What a name from a config may look like (the schema uses the same pattern).
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
_NAME = re.compile(NAME_PATTERN)


class UnsafePathError(ConfigError):
    """A config or command-line value would put a path outside its parent folder."""


def check_component(value: object, what: str) -> str:
    """``value`` as one safe path component; UnsafePathError naming ``what`` and the value."""
    text = str(value)
    if not _NAME.match(text) or text in (".", ".."):
        raise UnsafePathError(
            f"{what}: {text!r} is not a plain folder name (letters, digits, '_', '.', '-', not starting "
            f"with '.' or '-', no '/'): a path built from it could leave its parent folder")
    return text


def inside(parent: str | Path, *parts: object, what: str = "path") -> Path:
    """``parent / part / ...`` after checking each part and that the result stays under ``parent``."""
    parent = Path(parent)
    for part in parts:
        check_component(part, what)
    path = parent.joinpath(*map(str, parts))
    base = os.path.abspath(parent)
    full = os.path.abspath(path)
    if os.path.commonpath([base, full]) != base or (full == base and parts):
        raise UnsafePathError(f"{what}: {path} is {full}, outside its parent folder {base}")
    return path


def checkout_relative(path: str | Path, root: str | Path = ".") -> str:
    """``path`` relative to ``root`` (the workflow's working directory) when it lies inside it, else
    absolute: a rule param that names a file of the checkout does not change when the checkout moves."""
    full, base = os.path.realpath(path), os.path.realpath(root)
    return os.path.relpath(full, base) if os.path.commonpath([base, full]) == base else full


def leads_out(path: str | Path, root: str | Path = ".") -> str | None:
    """Where the folder holding ``path`` really is, when that lies outside ``root`` (a symlinked
    ``data/`` on a scratch disk), else None. DVC git-ignores each output in that folder and fails for
    one outside the repository, after running its stage."""
    real, base = os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.realpath(root)
    return None if os.path.commonpath([base, real]) == base else real


def first_on_pythonpath(folder: str | Path) -> None:
    """Put ``folder`` first on this process's ``PYTHONPATH`` (once), for the processes it starts."""
    folder = str(folder)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if parts[:1] != [folder]:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *parts])


def check_out_root(path: str | Path, what: str = "--out") -> Path:
    """An output root from the command line, checked before any job writes under it: not
    the filesystem root (``--out /`` would make ``/runs`` and ``/checkpoints``), a folder
    or a path that can become one, and writable (a file is made and removed in it, or in
    its nearest existing parent: ``/proc`` refuses, whoever runs). Nothing is created."""
    path = Path(path)
    full = Path(os.path.abspath(path))
    if full.parent == full:
        raise UnsafePathError(f"{what} {path}: the filesystem root is not an output folder (results would land "
                              f"in {full / 'runs'}, {full / 'checkpoints'}, ...); give a folder of its own")
    probe = full
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UnsafePathError(f"{what} {path}: {probe} is not a folder"
                              + ("" if probe == full else ", so no folder can be made under it"))
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        where = "" if probe == full else f" (its nearest existing parent {probe} is not)"
        raise UnsafePathError(f"{what} {path} is not a writable folder{where}: making a file there fails "
                              f"({exc.strerror or exc})") from None
    return path
