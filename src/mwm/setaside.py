"""Set aside a finished run that is not the config's own, so that the workflow retrains it.

    python -m mwm.setaside --config C --variant V --seed S --marker results/runs/<name>/.retrain/V/seedS/<n>.json

A run folder ``results/runs/<name>/<variant>/seed<S>/`` whose ``summary.json`` records an
identity that is not the config's (:func:`mwm.plan.runs.identity_problem`: other numerics, or
other settings written outside the workflow) holds every file the train rule declares, newer than
its inputs, so Snakemake sees nothing to do. The workflow (``rules/common.smk``) gives the train job
of such a run one more input, a marker that rule ``set_aside_foreign_run`` makes by calling this
entry point: it moves the run folder (and its checkpoint folder, if one is left) to
``results/hand/foreign/<name>/<variant>/seed<S>-<UTC time>/`` (nothing is deleted;
``set_aside.json`` there says from where and why), then writes the marker (the same record), so the
train job retrains the run and the report follows.

Markers live in ``results/runs/<name>/.retrain/<variant>/seed<S>/`` and are numbered ``1.json``,
``2.json``, ...: the train job's inputs are every marker made before (the set of its inputs stays
the same after the retrain, so Snakemake's "input files changed" trigger stays quiet) plus, while
the run is foreign, the next number (a run written over again after a retrain is set aside again).
Deleting the markers retrains those runs once more.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from mwm.config import ConfigError
from mwm.paths import inside
from mwm.workflow.stages import SET_ASIDE_RULE
from mwm.plan.runs import HAND_FOLDER, RESULTS_ROOT, Plan, config_dir

__all__ = ["RETRAIN_FOLDER", "FOREIGN_FOLDER", "SET_ASIDE_RULE", "RECORD_FILE", "retrain_dir", "retrain_markers",
           "next_marker", "foreign_root", "foreign_problem", "ForeignRuns", "set_aside", "move_aside", "main"]

#: Under ``<root>/runs/<name>/``: the markers of runs set aside (a dot name: no variant folder is called so).
RETRAIN_FOLDER = ".retrain"
#: Under ``<root>/<HAND_FOLDER>/`` (beside the hand runs' ``<hash>`` folders): the runs set aside.
FOREIGN_FOLDER = "foreign"
#: The record written in each folder set aside.
RECORD_FILE = "set_aside.json"

_MARKER = re.compile(r"^([1-9][0-9]*)\.json$")


def retrain_dir(root: str | Path, name: str, variant: str, seed: int | str) -> Path:
    """``<root>/runs/<name>/.retrain/<variant>/seed<seed>``: where the markers of that run live."""
    base = config_dir("runs", name, root) / RETRAIN_FOLDER
    return inside(base, variant, f"seed{seed}", what="retrain marker folder (variant/seed)")


def retrain_markers(root: str | Path, name: str, variant: str, seed: int | str) -> list[Path]:
    """The markers made for that run so far, by number."""
    folder = retrain_dir(root, name, variant, seed)
    try:
        names = [(int(m.group(1)), f) for f in os.listdir(folder) if (m := _MARKER.match(f))]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder / f for _, f in sorted(names)]


def next_marker(root: str | Path, name: str, variant: str, seed: int | str) -> Path:
    """The marker the next set-aside of that run writes (one past the last)."""
    made = retrain_markers(root, name, variant, seed)
    number = int(made[-1].stem) + 1 if made else 1
    return retrain_dir(root, name, variant, seed) / f"{number}.json"


def foreign_root(root: str | Path, name: str) -> Path:
    """``<root>/hand/foreign/<name>``: where the runs of config ``name`` that were set aside go."""
    return inside(Path(root) / HAND_FOLDER / FOREIGN_FOLDER, name, what="config name (in hand/foreign)")


def foreign_problem(plan: Plan, variant: str, seed: int) -> str | None:
    """Why the finished run of (variant, seed) in the plan's root is not its config's own; None when
    it is, or when there is no readable summary (a missing or cut run: Snakemake reruns it anyway)."""
    path = plan.run(variant, seed).dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    return plan.problem(summary, variant, seed)


class ForeignRuns:
    """The finished runs of a plan's grid that are not its config's own (``{(variant, seed): why}``,
    scanned once, when the workflow loads), and the markers the rules wire them with: a foreign run's
    train job gets one more input, the marker rule ``set_aside_foreign_run`` makes after moving the run
    aside, so the run is retrained."""

    def __init__(self, plan: Plan):
        self.plan = plan
        # a config that trains no grid runs (a solver-only report) has none to set aside
        runs = [(v, s) for v in plan.variants for s in plan.seeds] if plan.trains else []
        self.found = {(v, s): why for v, s in runs if (why := foreign_problem(plan, v, s))}

    def note(self, config_file: str) -> str:
        """What the workflow says before it sets the runs aside (empty when there is none)."""
        if not self.found:
            return ""
        p = self.plan
        return (f"mwm: {len(self.found)} finished run(s) of {config_file} are not the config's own (other settings, "
                "e.g. an older mwm.train with overrides, or other numerics; the report refuses them): rule "
                f"{SET_ASIDE_RULE} moves each to {foreign_root(p.root, p.name)}/<variant>/seed<S>-<UTC time>/ "
                "(nothing is deleted) and the workflow retrains it:\n  "
                + "\n  ".join(f"{p.path(v, s)}/summary.json: {why}" for (v, s), why in self.found.items()))

    def train_markers(self, variant: str, seed: str) -> list[str]:
        """A run's markers as its train job's inputs: every one made before, so that the set of inputs
        stays the same once the run is retrained, and the next one while the run is foreign."""
        p = self.plan
        markers = retrain_markers(p.root, p.name, variant, seed)
        if (variant, int(seed)) in self.found:
            markers.append(next_marker(p.root, p.name, variant, seed))
        return [m.as_posix() for m in markers]

    def targets(self) -> list[str]:
        """The markers the foreign runs wait for, as targets of their own: where Snakemake has no
        records of the runs' settings (a restored, synced or copied checkout), no changed param would
        make their train jobs run, and a marker wanted only by a job that need not run is never made."""
        p = self.plan
        return [next_marker(p.root, p.name, v, s).as_posix() for v, s in self.found]


def _utc_stamp(now: float | None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))


def _fresh_folder(parent: Path, stem: str) -> Path:
    """A new, empty folder ``parent/stem`` (``stem-2``, ... if taken), made here so no one else gets it."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = inside(parent, stem if n == 1 else f"{stem}-{n}", what="set-aside folder")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free set-aside folder name", str(parent / stem))


def _move(src: Path, dest: Path) -> None:
    """Move folder ``src`` onto ``dest`` (an empty folder or no file): a rename, or a copy then a
    removal across file systems."""
    try:
        os.rename(src, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(src)


def set_aside(cfg: dict, config_file: str, variant: str, seed: int, marker: str | Path,
              root: str | Path = RESULTS_ROOT, now: float | None = None) -> dict:
    """Move the run (variant, seed) of ``cfg`` out of ``<root>/runs/`` when it is not the config's
    own (:func:`foreign_problem`), with its checkpoint folder, and write ``marker`` (one of the
    run's markers, :func:`retrain_dir`). Returns the record written (``moved_to`` None: nothing
    was set aside, e.g. a retry after the move). ConfigError for a variant or seed that is not
    the config's or a marker elsewhere; :class:`mwm.lock.RunLocked` while a process writes the run."""
    from mwm.io import atomic_write_json

    name = cfg["name"]
    plan = Plan(cfg, root)
    if variant not in plan.variants or seed not in plan.seeds:
        raise ConfigError(f"{variant} seed {seed} is not a run of config {name!r} ({config_file}): its grid trains "
                          f"{', '.join(plan.variants)} at seeds {list(plan.seeds)}")
    target = plan.run(variant, seed)
    run = target.dir
    folder = retrain_dir(root, name, variant, seed)
    marker = Path(marker)
    if os.path.abspath(marker.parent) != os.path.abspath(folder) or not _MARKER.match(marker.name):
        raise ConfigError(f"marker {marker}: the markers of {variant} seed {seed} are "
                          f"{folder}/<n>.json (n = 1, 2, ...)")
    record = {"run": run.as_posix(), "config_file": config_file, "at": _utc_stamp(now), "moved_to": None,
              "why": "nothing set aside: no summary there that is not the config's (a retry after the move, or the run "
                     "was retrained meanwhile)"}
    problem = foreign_problem(plan, variant, seed)
    if problem:
        record = move_aside(run, target.ckpt_dir, root, name, variant, seed, problem, config_file, now)
    atomic_write_json(marker, record)
    return record


def move_aside(run: Path, ckpt: Path, root: str | Path, name: str, variant: str, seed: int, why: str,
               config_file: str, now: float | None = None) -> dict:
    """Move run folder ``run`` (and its checkpoint folder ``ckpt``, if one is left) to
    ``<root>/hand/foreign/<name>/<variant>/seed<S>-<UTC time>/`` with ``set_aside.json`` there saying from
    where and ``why``; returns that record. :class:`mwm.lock.RunLocked` while a process writes the run."""
    from mwm.io import atomic_write_json
    from mwm.lock import LOCK_NAME, RunLock

    record = {"run": run.as_posix(), "config_file": config_file, "at": _utc_stamp(now), "moved_to": None, "why": why}
    lock = RunLock(run)  # refuses while a process writes the run (names it)
    token = lock.token
    dest = None
    try:
        dest = _fresh_folder(inside(foreign_root(root, name), variant, what="set-aside folder (variant)"),
                             f"seed{seed}-{record['at']}")
        try:
            _move(run, dest)
        except OSError:
            try:  # the empty folder made for it; never one with files (a copy cut across file systems)
                dest.rmdir()
            except OSError:
                pass
            raise
    finally:
        lock.release()  # the lock moved with the folder: ours is removed below
        if dest is not None:
            moved = dest / LOCK_NAME
            if (RunLock._read(moved) or {}).get("token") == token:
                moved.unlink(missing_ok=True)
    if ckpt.is_dir() and any(ckpt.iterdir()):
        _move(ckpt, dest / "checkpoint")
    record["moved_to"] = dest.as_posix()
    atomic_write_json(dest / RECORD_FILE, record)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mwm.setaside", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config YAML the run belongs to")
    ap.add_argument("--variant", required=True, help="the run's variant (a grid variant of the config)")
    ap.add_argument("--seed", type=int, required=True, help="the run's seed")
    ap.add_argument("--marker", required=True,
                    help=f"the marker to write: <root>/runs/<name>/{RETRAIN_FOLDER}/<variant>/seed<seed>/<n>.json")
    ap.add_argument("--root", default=RESULTS_ROOT, help="results root (default: %(default)s, the workflow's)")
    args = ap.parse_args(argv)
    from mwm.config import load_config
    from mwm.lock import RunLocked

    try:
        record = set_aside(load_config(args.config), args.config, args.variant, args.seed, args.marker, args.root)
    except (ConfigError, RunLocked) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, permissions: the OS's words, one line
        print(f"error: setting aside {args.variant} seed {args.seed} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    if record["moved_to"]:
        print(f"set aside {record['run']} ({record['why']}) to {record['moved_to']}; wrote {args.marker}")
    else:
        print(f"{record['run']}: {record['why']}; wrote {args.marker}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
