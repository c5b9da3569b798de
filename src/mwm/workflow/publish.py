"""Published results: keep a config's records in git, put them back into results/, and compare a rebuild.

    python -m mwm.workflow.publish publish --config C    # results/ -> published/<name>/ (finished runs; extends)
    python -m mwm.workflow.publish restore --config C    # published/<name>/ -> results/, every hash checked first
    python -m mwm.workflow.publish compare --config C    # a rebuild in results/ against the published records
    python -m mwm.workflow.publish verify --config C     # the published records against their manifest

``results/`` lives only as long as its machine; ``published/<name>/`` (:mod:`mwm.workflow.records`) is in
git. A config too long for one sitting is run in slices: ``restore``, then ``snakemake`` trains only what
is not published yet, then ``publish`` adds the new runs (a partial grid is fine). Restored runs are
complete in Snakemake's eyes (its train rule declares exactly the published files), so nothing published
is trained again, and the report rebuilds every figure from them.

``restore`` checks every record against the manifest before it writes anything: an edited or damaged
record is refused, naming the file. A record that is not the config's own now (another numerics version,
settings changed since) is never restored as the config's run: Snakemake trains it anew. A run folder
already in ``results/`` is never overwritten. The config's dataset is prepared first when it is missing
(the data rule's own command, in this process), so the restored runs are newer than their data.

Exit status: 0 done (compare: reproduced), 1 refused or not reproduced, 2 bad arguments or records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from mwm.config import ConfigError, load_config
from mwm.numerics import VERSION
from mwm.plan.runs import FINAL_STATUSES, RESULTS_ROOT, Plan
from mwm.workflow.owner import check_owner, claim
from mwm.workflow.records import (BUDGET_BYTES, FIGURE_RECORDS, FORMAT, MANIFEST, PUBLISHED_ROOT, RUN_RECORDS,
                                  SPECTRA, RecordError, data_digest, holds_record, made_by, packed_size,
                                  parse_run_key, published_dir, run_key, sha256_file, study_settings, verify)
from mwm.workflow.stages import REPORT_INPUTS, study_files

__all__ = ["finished_problem", "publish", "restore", "main"]


def _say(msg: str) -> None:
    print(msg, flush=True)


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _run_files(run_dir: Path, spectra: bool) -> list[str]:
    """The files of a run folder that are its records (relative to it)."""
    out = list(RUN_RECORDS)
    if spectra and (run_dir / SPECTRA).is_dir():
        out += sorted(f"{SPECTRA}/{p.name}" for p in (run_dir / SPECTRA).glob("step_*.npz"))
    return out


def finished_problem(plan: Plan, variant: str, seed: int) -> str | None:
    """Why the run of (variant, seed) in the plan's results is not publishable (None: it is): every
    declared file there, a finished status, and the config's own identity."""
    d = plan.run(variant, seed).dir
    missing = [f for f in RUN_RECORDS if not (d / f).is_file()]
    if missing:
        return "not trained (no " + ", ".join(missing) + ")" if len(missing) == len(RUN_RECORDS) else \
            f"not finished (missing {', '.join(missing)})"
    summary = _read_json(d / "summary.json")
    if summary is None:
        return f"{d / 'summary.json'} cannot be read"
    if summary.get("status") not in FINAL_STATUSES:
        return f"status {summary.get('status')!r} is not a finished run"
    metrics_rows = sum(1 for _ in open(d / "metrics.csv")) - 1
    if summary.get("steps_done") != metrics_rows:
        return f"its summary says steps_done={summary.get('steps_done')}, metrics.csv holds {metrics_rows} steps"
    return plan.problem(summary, variant, seed)


def _entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size, "packed": packed_size(path)}


# --- publish ------------------------------------------------------------------------------


def _recover(dest: Path) -> None:
    """Finish or undo a publish cut between its two renames (the old folder is kept until the new is in place)."""
    old = dest.with_name(f".{dest.name}.old")
    if old.is_dir():
        if dest.is_dir():
            shutil.rmtree(old)
        else:
            os.rename(old, dest)
    stage = dest.with_name(f".{dest.name}.staging")
    if stage.exists():
        shutil.rmtree(stage)


def _drop(man: dict, prefix: str) -> None:
    """Forget the records under ``prefix`` (a run's folder, ``studies/``)."""
    for rel in [r for r in man["files"] if r.startswith(prefix)]:
        del man["files"][rel]


def publish(cfg: dict, config_file: str, root: str | Path = RESULTS_ROOT, figures_root: str | Path = "paper_figures",
            published_root: str | Path = PUBLISHED_ROOT, spectra: bool = True, replace: bool = False,
            now: float | None = None) -> dict:
    """Write or extend ``published/<name>/`` from the finished runs, studies and ledger in ``root``.
    Returns what was done, with the new manifest. RecordError when the published folder is damaged, or
    holds records of other numerics or settings, or a run or studies whose numbers differ from those here
    (``replace``: those records are replaced or dropped instead), or would pass :data:`BUDGET_BYTES`;
    nothing is written then."""
    plan = Plan(cfg, root)
    dest = published_dir(cfg["name"], published_root)
    _recover(dest)
    fresh = {"format": FORMAT, "name": cfg["name"], "numerics": VERSION, "files": {}, "runs": {}, "slices": []}
    man = verify(dest) if dest.is_dir() else fresh
    if man["numerics"] != VERSION:
        if not replace:
            raise RecordError(f"{dest} holds records of numerics version {man['numerics']}; this code is version "
                              f"{VERSION}: they cannot be extended (publish --replace starts the folder anew)")
        man = {**fresh, "slices": []}
    foreign = []
    for key in sorted(man["runs"]):
        variant, seed = parse_run_key(key)
        summary = _read_json(dest / "runs" / key / "summary.json") or {}
        why = ("not a run of the config's grid now" if variant not in plan.variants or seed not in plan.seeds
               else plan.problem(summary, variant, seed))
        if why:
            foreign.append(f"{key}: {why}")
            if replace:
                _drop(man, f"runs/{key}/")
                del man["runs"][key]
    if foreign and not replace:
        raise RecordError(f"{dest} holds runs that are not the config's own now (its settings changed since?); "
                          "nothing published (publish --replace drops them):\n  " + "\n  ".join(foreign))
    man["config"] = config_file
    man["grid"] = {"variants": list(plan.variants), "seeds": list(plan.seeds)}
    data_meta = _read_json(Path(plan.folders["data"]) / "meta.json")
    digest = data_digest(data_meta or {})
    if man.get("data") and digest and man["data"] != digest:
        raise RecordError(f"{plan.folders['data']}/meta.json: the tokens here (sha256 {digest}) are not those the "
                          f"published runs of {dest} trained on ({man['data']})")
    man["data"] = man.get("data") or digest
    add: dict[str, Path] = {}  # published relative path -> source file
    conflicts, skipped, new_runs = [], [], []
    for r in plan.runs():
        key = run_key(r.variant, r.seed)
        why = finished_problem(plan, r.variant, r.seed)
        if why:
            if key not in man["runs"]:
                skipped.append(f"{key}: {why}")
            continue
        files = {f"runs/{key}/{f}": r.dir / f for f in _run_files(r.dir, spectra)}
        if key in man["runs"]:
            differ = [rel for rel in files if rel in man["files"] and not holds_record(man, rel, files[rel])]
            if not differ:
                continue
            conflicts.append(f"{r.dir / Path(differ[0]).relative_to(f'runs/{key}')} differs from the published "
                             f"{dest / differ[0]}")
            if not replace:
                continue
            _drop(man, f"runs/{key}/")
        summary = _read_json(r.dir / "summary.json") or {}
        man["runs"][key] = {"identity": summary.get("config_hash"), "status": summary.get("status"),
                            "final_val_loss": summary.get("final_val_loss"),
                            "code_version": summary.get("code_version"),
                            "spectra": any(rel.startswith(f"runs/{key}/{SPECTRA}/") for rel in files),
                            "slice": len(man["slices"]) + 1}
        add.update(files)
        new_runs.append(key)
    if conflicts and not replace:
        raise RecordError("a published run differs from the one in results/ (retrained since?); nothing "
                          "published (publish --replace replaces it):\n  " + "\n  ".join(conflicts))
    studies, reads_runs = REPORT_INPUTS[cfg["workflow"]["report"]]
    study_dir = Path(plan.folders["studies"])
    names = study_files(studies)
    complete = all(run_key(v, s) in man["runs"] for v in plan.variants for s in plan.seeds) or not reads_runs
    studies_added = figures_added = False
    if names and all((study_dir / n).is_file() for n in names):
        files = {f"studies/{n}": study_dir / n for n in names}
        old = man.get("studies") or {}
        same = old.get("settings") == study_settings(cfg) and all(holds_record(man, r, p) for r, p in files.items())
        if not same:
            if old and not replace:
                raise RecordError(f"the studies in {study_dir} differ from those published in {dest}/studies"
                                  + ("" if old.get("settings") == study_settings(cfg) else
                                     " (made with other studies, train or model settings)")
                                  + ": nothing published (publish --replace replaces them)")
            _drop(man, "studies/")
            add.update(files)
            man["studies"] = {"settings": study_settings(cfg), "slice": len(man["slices"]) + 1}
            studies_added = True
    if replace and (foreign or conflicts or studies_added):  # the ledger was drawn from what is replaced
        _drop(man, "figures/")
        man.pop("figures", None)
    fig_dir = Path(figures_root) / cfg["name"]
    if complete and (man.get("studies") or not names) and all((fig_dir / n).is_file() for n in FIGURE_RECORDS):
        files = {f"figures/{n}": fig_dir / n for n in FIGURE_RECORDS}
        if not all(holds_record(man, rel, p) for rel, p in files.items()):
            add.update(files)
            man["figures"] = {"slice": len(man["slices"]) + 1, "runs": len(man["runs"])}
            figures_added = True
    for rel, src in add.items():
        man["files"][rel] = _entry(src)
    total = sum(e.get("packed", e["bytes"]) for e in man["files"].values())
    if total > BUDGET_BYTES:
        raise RecordError(f"{dest} would add {total / 1e6:.1f} MB to git (compressed), over the "
                          f"{BUDGET_BYTES / 1e6:.0f} MB a config may keep; publish without spectra (--no-spectra) or "
                          "fewer runs. Nothing published")
    report = {"dest": dest, "runs": new_runs, "skipped": skipped, "studies": studies_added, "figures": figures_added,
              "manifest": man, "total_bytes": total, "replaced": foreign + conflicts if replace else []}
    if not add and not report["replaced"]:
        return report
    man["slices"].append({"slice": len(man["slices"]) + 1, **made_by(now), "runs": new_runs,
                          "studies": studies_added, "figures": figures_added})
    _write_folder(dest, man, add)
    return report


def _write_folder(dest: Path, man: dict, add: dict[str, Path]) -> None:
    """The published folder with ``add`` copied in and ``man`` as its manifest, swapped into place whole: a
    reader sees the old folder or the new, never a mix."""
    from mwm.io import atomic_write_json

    stage = dest.with_name(f".{dest.name}.staging")
    if stage.exists():
        shutil.rmtree(stage)
    if dest.is_dir():
        shutil.copytree(dest, stage)
        for p in sorted(stage.rglob("*"), reverse=True):  # records the manifest no longer lists (replaced)
            rel = p.relative_to(stage).as_posix()
            if p.is_file() and rel != MANIFEST and rel not in man["files"]:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    for rel, src in add.items():
        target = stage / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        if _entry(target) != man["files"][rel]:  # the source changed while it was copied
            shutil.rmtree(stage)
            raise RecordError(f"{src} changed while it was published (a job still writing?); nothing published")
    atomic_write_json(stage / MANIFEST, man)
    old = dest.with_name(f".{dest.name}.old")
    if dest.is_dir():
        os.rename(dest, old)
    os.rename(stage, dest)
    if old.is_dir():
        shutil.rmtree(old)


# --- restore ------------------------------------------------------------------------------


def _ensure_data(cfg: dict, folder: Path) -> bool:
    """Prepare the config's dataset when it is missing (the data rule's own work); True when it did."""
    if (folder / "meta.json").is_file():
        return False
    from mwm.data.prepare import prepare

    _say(f"restore: {folder} is missing; preparing it first (python -m mwm.data prepare), so the restored runs "
         "are newer than their data")
    prepare(cfg["data"], log=lambda m: print(m, file=sys.stderr))
    return True


def _place(stage: Path, target: Path, when: float) -> None:
    """Give every file under ``stage`` the time ``when``, then rename it to ``target`` (whole, or not at all)."""
    for p in sorted(stage.rglob("*"), reverse=True):
        os.utime(p, (when, when))
    os.utime(stage, (when, when))
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(stage, target)


def restore(cfg: dict, config_file: str, root: str | Path = RESULTS_ROOT, published_root: str | Path = PUBLISHED_ROOT,
            prepare_data: bool = True) -> dict:
    """Put the published records of ``cfg`` into ``root`` (see the module doc). Returns what was done:
    ``restored``, ``present`` (already there, the same), ``kept`` (a different run there, left alone),
    ``refused`` (not the config's own now, with why), ``studies`` (restored, present, refused: why, or None)."""
    plan = Plan(cfg, root)
    src = published_dir(cfg["name"], published_root)
    man = verify(src)  # every hash, before anything is written
    if man["name"] != cfg["name"]:
        raise RecordError(f"{src / MANIFEST} is config {man['name']!r}'s, not {cfg['name']!r}'s")
    if man["numerics"] != VERSION:
        raise RecordError(f"{src} holds records made with numerics version {man['numerics']}; this code is version "
                          f"{VERSION}, so they are not this code's results: nothing restored (the workflow "
                          "retrains them; publish anew)")
    check_owner(root, cfg, config_file)
    out = {"restored": [], "present": [], "kept": [], "refused": [], "studies": None, "data_prepared": False}
    todo = []
    for key in sorted(man["runs"]):
        variant, seed = parse_run_key(key)
        if variant not in plan.variants or seed not in plan.seeds:
            out["refused"].append(f"{key}: not a run of the config's grid now")
            continue
        prefix = f"runs/{key}/"
        rels = sorted(r[len(prefix):] for r in man["files"] if r.startswith(prefix))
        summary = _read_json(src / "runs" / key / "summary.json") or {}
        problem = plan.problem(summary, variant, seed)
        if problem:
            out["refused"].append(f"{key}: {problem}")
            continue
        target = plan.run(variant, seed).dir
        if target.exists():
            if all(holds_record(man, prefix + r, target / r) for r in rels):
                out["present"].append(key)
            else:
                out["kept"].append(f"{key}: {target} is there and differs from the published record (left as it is)")
            continue
        todo.append((key, target, rels))
    studies_todo = []
    sec = man.get("studies")
    study_dir = Path(plan.folders["studies"])
    if sec:
        names = sorted(r[len("studies/"):] for r in man["files"] if r.startswith("studies/"))
        missing = [n for n in names if not (study_dir / n).is_file()]
        clash = [n for n in names if n not in missing and not holds_record(man, f"studies/{n}", study_dir / n)]
        if sec.get("settings") != study_settings(cfg):
            out["studies"] = "refused: the config's studies, train or model settings changed since they were published"
        elif clash:
            out["studies"] = f"kept: {study_dir / clash[0]} is there and differs from the published record"
        elif not missing:
            out["studies"] = "present"
        else:
            studies_todo, out["studies"] = missing, "restored"
    if not todo and not studies_todo:
        return out
    data = Path(plan.folders["data"])
    if prepare_data:
        out["data_prepared"] = _ensure_data(cfg, data)
    meta = _read_json(data / "meta.json")
    if meta is not None and man.get("data") and data_digest(meta) != man["data"]:
        raise RecordError(f"{data}/meta.json: the tokens here are not those the published runs trained on "
                          f"(sha256 {data_digest(meta)}, published {man['data']}): nothing restored")
    claim(root, cfg, config_file)
    # Snakemake compares times: runs newer than their data, studies newer than the runs they read.
    when = time.time() + 1
    for key, target, rels in todo:
        stage = target.with_name(f".{target.name}.restoring")
        if stage.exists():
            shutil.rmtree(stage)
        for rel in rels:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "runs" / key / rel, stage / rel)
        (stage / SPECTRA).mkdir(exist_ok=True)  # a declared folder, empty when its spectra were not published
        _place(stage, target, when)
        out["restored"].append(key)
    for n in studies_todo:
        from mwm.io import atomic_write_bytes

        atomic_write_bytes(study_dir / n, (src / "studies" / n).read_bytes())
        os.utime(study_dir / n, (when + 1, when + 1))
    return out


# --- command line -------------------------------------------------------------------------


def _cmd_publish(args) -> int:
    cfg = load_config(args.config)
    rep = publish(cfg, args.config, args.results, args.figures, args.published, spectra=not args.no_spectra,
                  replace=args.replace)
    man = rep["manifest"]
    total = len(man["grid"]["variants"]) * len(man["grid"]["seeds"])
    if not (rep["runs"] or rep["studies"] or rep["figures"]):
        _say(f"{rep['dest']}: nothing new to publish ({len(man['runs'])} of {total} runs published)")
    else:
        _say(f"published to {rep['dest']}: {len(rep['runs'])} run(s) added, {len(man['runs'])} of {total} in all"
             + ("; the studies" if rep["studies"] else "") + ("; the ledger" if rep["figures"] else "")
             + f"; {rep['total_bytes'] / 1e6:.1f} MB in git. Commit it: git add {rep['dest']}")
    for line in rep["skipped"]:
        _say(f"  not published: {line}")
    for line in rep["replaced"]:
        _say(f"  replaced or dropped: {line}")
    return 0


def _cmd_restore(args) -> int:
    cfg = load_config(args.config)
    rep = restore(cfg, args.config, args.results, args.published)
    _say(f"restored {len(rep['restored'])} run(s) from {published_dir(cfg['name'], args.published)}"
         + (f", {len(rep['present'])} already here" if rep["present"] else "")
         + (f"; studies: {rep['studies']}" if rep["studies"] else "; no studies published"))
    for line in rep["kept"]:
        _say(f"  kept: {line}")
    for line in rep["refused"]:
        _say(f"  not restored (the workflow trains it anew): {line}")
    plan = Plan(cfg, args.results)
    total = len(plan.variants) * len(plan.seeds)
    have = len(rep["restored"]) + len(rep["present"])
    if have < total:
        _say(f"  {total - have} of the config's {total} runs are not published here: `snakemake ... all` trains them")
    return 1 if rep["refused"] else 0


def _cmd_compare(args) -> int:
    from mwm.workflow.compare import compare_config

    cfg = load_config(args.config)
    folder = Path(args.records) if args.records else published_dir(cfg["name"], args.published)
    return compare_config(cfg, folder, args.results, args.figures, out=sys.stdout)


def _cmd_verify(args) -> int:
    cfg = load_config(args.config)
    folder = published_dir(cfg["name"], args.published)
    man = verify(folder)
    stale = ("" if man["numerics"] == VERSION else
             f"; STALE: made with numerics version {man['numerics']}, this code {VERSION}")
    _say(f"{folder}: {len(man['files'])} records match {MANIFEST}; {len(man['runs'])} runs, "
         f"{len(man['slices'])} slice(s){stale}")
    return 0 if not stale else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mwm.workflow.publish", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{publish,restore,compare,verify}")

    def common(sp):
        sp.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
        sp.add_argument("--results", default=RESULTS_ROOT, help="results root (default: %(default)s, the workflow's)")
        sp.add_argument("--published", default=PUBLISHED_ROOT, help="published root (default: %(default)s)")
        return sp

    sp = common(sub.add_parser("publish", help="results/ -> published/<name>/ (finished runs; extends)"))
    sp.add_argument("--figures", default="paper_figures", help="the report's root (default: %(default)s)")
    sp.add_argument("--no-spectra", action="store_true", help="publish no spectra/ (a config over the budget)")
    sp.add_argument("--replace", action="store_true",
                    help="replace published records that differ from results/, drop those not the config's own now "
                         "(other settings or numerics); without it such records are refused")
    sp.set_defaults(func=_cmd_publish)
    common(sub.add_parser("restore", help="published/<name>/ -> results/ (hashes checked first)")).set_defaults(
        func=_cmd_restore)
    sp = common(sub.add_parser("compare", help="a rebuild in results/ against the published records"))
    sp.add_argument("--figures", default="paper_figures", help="the report's root (default: %(default)s)")
    sp.add_argument("--records", default=None,
                    help="compare against this published folder instead (another checkout's published/<name>)")
    sp.set_defaults(func=_cmd_compare)
    common(sub.add_parser("verify", help="check the published records against their manifest")).set_defaults(
        func=_cmd_verify)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if args.command != "restore" else 1
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
