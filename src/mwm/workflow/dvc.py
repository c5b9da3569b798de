"""The DVC pipelines: one per config, a stage per kind of product, each running its Snakemake target.

Snakemake builds; DVC versions and shares what it built. The embedded default is the root
``dvc.yaml`` (a bare ``dvc repro``), every other ``config/<name>.yaml`` is
``pipelines/<name>/dvc.yaml``. Each is rendered from the config alone (no Snakemake run) by
:func:`pipeline`: the stages ``data``, ``runs``, ``studies``, ``figures`` the config makes
(:func:`mwm.workflow.stages.products`), each ``snakemake --allowed-rules <its rules> -- <its target>`` tracking
one folder. A stage reruns on its config sections (``params``: of the config file, and of the scale file it
extends where that sets them), its rule file and schema, and:

- ``runs``, ``studies``: the numerics version, not their code (a refactor retrains nothing; a
  numerics change retrains all, as in Snakemake);
- ``data``, ``figures``: the package code their entry point imports, by subpackage.

A dataset shared by configs belongs to the first pipeline that uses it (the default first).

    python -m mwm.workflow.dvc                 # write dvc.yaml and pipelines/*/dvc.yaml
    python -m mwm.workflow.dvc --check         # exit 1 with a diff when one is stale
    python -m mwm.workflow.dvc sync [--config config/ci.yaml]   # dvc pull, then snakemake --touch
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from mwm.config import ConfigError, compose, load_config, read_mapping, scale_file
from mwm.io import atomic_write_text
from mwm.paths import leads_out
from mwm.plan.runs import Plan
from mwm.workflow.stages import REPORT_INPUTS, SET_ASIDE_RULE, STAGES, products, rule_file_sections

__all__ = ["PERSISTENT", "pipeline", "pipelines", "render", "check", "sync", "main"]

DVC_YAML = "dvc.yaml"
DEFAULT_CONFIG = "config/config.yaml"
PIPELINES = Path("pipelines")
PACKAGE = Path("src") / "mwm"
SCHEMA = PACKAGE / "config" / "schema"
NUMERICS = {(PACKAGE / "numerics.py").as_posix(): ["VERSION"]}
NUMERICS_MODULE = "mwm.numerics"

#: Per kind of product: its rule file, the rules its stage may run, and the entry point whose imports
#: are its code (None: versioned by the numerics instead).
KINDS = {
    "data": ("data", ("prepare_data",), "mwm.data"),
    # a finished run trained with other settings (an experiment's -S) is set aside before it is retrained
    "runs": ("train", ("train", SET_ASIDE_RULE), None),
    "studies": ("studies", ("study_alpha", "study_absorption", "study_audits", "study_solvers"), None),
    "figures": ("report", ("report",), "mwm.report"),
}
#: Kinds whose folder DVC leaves in place when it reruns the stage: Snakemake decides what to remake
#: (tokenized data is hours at paper scale; finished runs are not in DVC's cache until a stage ends,
#: so a folder DVC deleted, beside a running snakemake or before one that is refused, is gone).
PERSISTENT = ("data", "runs", "studies", "figures")
#: Plots per config: (name, run file, column, template: a file of .dvc/plots/ or one of DVC's own).
PLOTS = (("val loss", "eval.csv", "val_loss", "linear"),
         ("sigma_max", "spectral.csv", "sigma_max", "sigma_max"))  # several rows per step: one line per matrix

_HEADER = ("# DVC pipeline of {config}: dvc repro{target}\n"
           "# Written by `python -m mwm.workflow.dvc` from the config (docs/dvc.md); edit the config, not this file.\n")


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # each stage spelled out, no YAML anchors
        return True


def _module_file(name: str) -> Path | None:
    base = PACKAGE.joinpath(*name.split(".")[1:])
    return next((f for f in (base / "__init__.py", base.with_suffix(".py")) if f.is_file()), None)


def _imports(name: str, path: Path) -> set[str]:
    """The package modules the import statements of module ``name`` name, inside functions too."""
    package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "mwm")
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if mod.split(".")[0] == "mwm":
                out |= {mod, *(f"{mod}.{a.name}" for a in node.names)}
    return out


def code_deps(entry: str) -> list[str]:
    """What ``python -m entry`` may import: top-level modules as files, subpackages as folders. A
    folder is tracked whole, so every module in it counts as imported, unless the stage reaches it
    only through modules that import nothing of the package (a torch-free vocabulary): those are
    tracked as files, so a change to the rest of that room does not rerun the stage."""
    todo, seen, whole = [entry, f"{entry}.__main__"], set(), set()
    while todo:
        name = todo.pop()
        if name in seen or (path := _module_file(name)) is None:
            continue
        seen.add(name)
        imports = _imports(name, path)
        todo.extend(imports)
        parts = name.split(".")
        if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
            todo.append(f"mwm.{parts[1]}")  # importing a module runs its subpackage's __init__
            if imports and parts[1] not in whole:  # the rest of its subpackage
                whole.add(parts[1])
                todo.extend(".".join(["mwm", *f.relative_to(PACKAGE).with_suffix("").parts])
                            for f in (PACKAGE / parts[1]).rglob("*.py") if f.name != "__init__.py")
    deps = set()
    for name in seen - {NUMERICS_MODULE}:  # the numerics version is a param of the stages it versions
        parts = name.split(".")
        if len(parts) > 1:
            top = PACKAGE / parts[1]
            if not top.is_dir():
                deps.add(top.with_suffix(".py").as_posix())
            else:
                deps.add((top if parts[1] in whole else _module_file(name)).as_posix())
    return sorted(deps)


def _file_sets(raw: dict, dotted: str) -> bool:
    """Whether the config file itself sets ``a.b.c`` (DVC refuses a param its file lacks)."""
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _posix(path: Path) -> str:
    return Path(os.path.normpath(path)).as_posix()


def pipeline(cfg_path: str, cfg: dict, owned_data: set[str]) -> dict:
    """The pipeline of one config (``cfg``, loaded from ``cfg_path``); ``owned_data``: the data folders
    earlier pipelines track (updated)."""
    own = read_mapping(cfg_path)
    scale = scale_file(cfg_path, own)
    scale_raw = read_mapping(scale, what="scale file") if scale else {}
    raw = compose(own, cfg_path)
    plan = Plan(cfg)
    where = plan.folders
    kinds = products(cfg)
    made = [k for k in kinds if not (k == "data" and where["data"] in owned_data)]
    owned_data.add(where["data"])
    studies, with_runs = REPORT_INPUTS[cfg["workflow"]["report"]]
    reads = {"runs": ["data"], "studies": ["data", *(["runs"] if "runs" in kinds else [])],
             "figures": [*(["runs"] if with_runs else []), *(["studies"] if studies else [])]}
    stages = {}
    for kind in made:
        rule_file, rules, entry = KINDS[kind]
        sections = [s for s in rule_file_sections(rule_file) if _file_sets(raw, s) or "." not in s and s in cfg]
        ups = [where[k] for k in reads.get(kind, [])]
        schemas = [(SCHEMA / f"{s}.yaml").as_posix() for s in dict.fromkeys(s.split(".")[0] for s in sections)]
        where_jobs = (f"--profile {shlex.quote(cfg['workflow']['dvc_profile'])}" if cfg["workflow"]["dvc_profile"]
                      else "--cores all")
        stage = {"cmd": f"snakemake {where_jobs} --configfile {shlex.quote(cfg_path)} --allowed-rules "
                        f"{' '.join(rules)} {kind} -- {kind}",
                 "deps": [*ups, f"rules/{rule_file}.smk", *schemas, *(code_deps(entry) if entry else [])]}
        # each section from the file that sets it: DVC refuses a param its file lacks (one no file sets stays
        # the config file's, as without a scale)
        mine = [s for s in sections if _file_sets(own, s) or "." not in s and not _file_sets(scale_raw, s)]
        scaled = [s for s in sections if _file_sets(scale_raw, s)]
        params = ([{cfg_path: mine}] if mine else []) + ([{_posix(scale): scaled}] if scaled else []) \
            + ([] if entry else [dict(NUMERICS)])
        if params:
            stage["params"] = params
        stage["outs"] = [{where[kind]: {"persist": True}} if kind in PERSISTENT else where[kind]]
        stages[kind] = stage
    content = {"stages": stages}
    if "runs" in made and with_runs:
        runs = [plan.path(v, s) for v in plan.variants for s in plan.seeds]
        content["metrics"] = [f"{where['figures']}/{STAGES['report'].file('metrics')}"]
        content["plots"] = [{f"{title} ({cfg['name']})": {"x": "step", "y": {f"{r}/{f}": col for r in runs},
                                                          "template": template}}
                            for title, f, col, template in PLOTS]
    return content


def pipeline_file(cfg: dict, default: bool) -> Path:
    return Path(DVC_YAML) if default else PIPELINES / cfg["name"] / DVC_YAML


def all_configs(default: str = DEFAULT_CONFIG) -> list[str]:
    """The default config first, then every other ``config/*.yaml`` by name."""
    others = sorted((p.as_posix() for p in Path(default).parent.glob("*.yaml") if p.as_posix() != default),
                    key=lambda p: Path(p).stem)
    return [default, *others]


def render(dest: Path, cfg_path: str, content: dict) -> str:
    """The file's text; a pipeline below the root runs its stages from the root (``wdir``), and its
    top-level metrics and plots are relative to its own folder."""
    back = os.path.relpath(".", dest.parent)
    if back != ".":
        content["stages"] = {k: {"cmd": st["cmd"], "wdir": back, **st} for k, st in content["stages"].items()}
        rel = lambda p: f"{back}/{p}"  # noqa: E731
        content["metrics"] = [rel(m) for m in content.get("metrics", [])] or None
        content["plots"] = [{k: {**v, "y": {rel(f): c for f, c in v["y"].items()}}} for p in content.get("plots", [])
                            for k, v in p.items()] or None
    content = {k: v for k, v in content.items() if v}
    target = "" if dest == Path(DVC_YAML) else f" {dest.as_posix()}"
    body = yaml.dump(content, Dumper=_Dumper, sort_keys=False, width=110)
    return _HEADER.format(config=cfg_path, target=target) + body


def pipelines(configs: list[str], default: str = DEFAULT_CONFIG) -> dict[Path, str]:
    """Each config's pipeline file and its text."""
    texts: dict[Path, str] = {}
    owned: set[str] = set()
    for cfg_path in configs:
        cfg_path = _posix(cfg_path)
        cfg = load_config(cfg_path)
        dest = pipeline_file(cfg, cfg_path == os.path.normpath(default))
        if dest in texts:
            raise ConfigError(f"{cfg_path}: name {dest.parent.name!r} is another config's too")
        texts[dest] = render(dest, cfg_path, pipeline(cfg_path, cfg, owned))
    return texts


def written() -> list[Path]:
    """The pipeline files in the checkout (the root one and ``pipelines/*/dvc.yaml``)."""
    return [p for p in [Path(DVC_YAML), *sorted(PIPELINES.glob(f"*/{DVC_YAML}"))] if p.is_file()]


def check(texts: dict[Path, str]) -> int:
    """0 when every file holds what would be written and no other pipeline file exists."""
    stale = 0
    for path in sorted(set(texts) | set(written())):
        old = path.read_text() if path.is_file() else ""
        if old != texts.get(path, ""):
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), texts.get(path, "").splitlines(True),
                                                       f"{path} (committed)", f"{path} (from the config)"))
    if stale:
        print(f"\n{stale} pipeline file(s) out of date: run  python -m mwm.workflow.dvc", file=sys.stderr)
        return 1
    print(f"up to date: {len(texts)} pipeline files")
    return 0


def write(texts: dict[Path, str]) -> None:
    for path in written():
        if path not in texts:  # its config is gone
            path.unlink()
            print(f"removed {path}")
    for path, text in texts.items():
        atomic_write_text(path, text)
        print(f"wrote {path}: {len(text.splitlines())} lines")


# --- sync ---------------------------------------------------------------------------------


def _run(cmd: list[str]) -> int:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.call(cmd)


def config_pipeline(configfile: str) -> Path | None:
    """The pipeline file of ``configfile``, by its first line."""
    want = f"# DVC pipeline of {os.path.normpath(configfile)}:"
    return next((p for p in written() if p.read_text().startswith(want)), None)


def pull_problems(pipeline_path: Path, remote: str | None = None) -> list[str]:
    """Why ``dvc pull`` of a pipeline cannot fetch anything, in words ([] when it can try): no
    ``dvc.lock`` beside it, no remote, or a folder remote whose folder does not exist (``dvc pull``
    itself would print "Everything is up to date" and one "checkout failed" per path)."""
    problems = []
    lock = pipeline_path.with_name("dvc.lock")
    if not lock.is_file():
        p = pipeline_path.as_posix()
        problems.append(f"{lock.as_posix()} does not exist: this pipeline's results were never committed "
                        f"(`dvc repro {p}` or `dvc commit -f {p}`, then `dvc push {p}` and commit {lock.as_posix()})")
    try:
        from dvc.repo import Repo
    except ImportError:  # no dvc: the pull itself says so
        return problems
    try:
        with Repo(".") as repo:
            name = remote or repo.config["core"].get("remote")
            remotes = dict(repo.config["remote"])
    except Exception as exc:  # noqa: BLE001 - not a DVC repository, an unreadable config
        return problems + [f"cannot read the DVC configuration here ({type(exc).__name__}: {exc})"]
    if not name:
        problems.append("no DVC remote given (--remote) and no default remote set (`dvc remote add -d NAME URL`)")
    elif name not in remotes:
        problems.append(f"DVC remote {name!r} is not configured (configured: {', '.join(remotes) or 'none'}; "
                        "`dvc remote list`)")
    else:
        url = str(remotes[name].get("url", ""))
        local = url[len("file://"):] if url.startswith("file://") else (url if "://" not in url else None)
        if local is not None and not os.path.isdir(local):
            problems.append(f"the folder of DVC remote {name!r}, {local}, does not exist (a disk not mounted? "
                            f"point it elsewhere: `dvc remote modify --local {name} url PATH`)")
    return problems


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pulled_problems(pipeline_path: Path, cache: Path) -> list[str]:
    """Every file a pipeline tracks whose bytes are not those its ``dvc.lock`` records, in words. DVC
    checks out what it pulled without hashing it again, so a damaged object in a remote (or in ``cache``,
    the md5 object folder) would pass into the workspace with ``dvc status`` clean."""
    lock = yaml.safe_load(pipeline_path.with_name("dvc.lock").read_text()) or {}
    stages = (yaml.safe_load(pipeline_path.read_text()) or {}).get("stages", {})
    problems = []
    for name, st in (lock.get("stages") or {}).items():
        wdir = pipeline_path.parent / stages.get(name, {}).get("wdir", ".")
        for out in st.get("outs") or []:
            want, path = str(out.get("md5") or ""), Path(os.path.normpath(wdir / out["path"]))
            if not want:
                continue
            if not want.endswith(".dir"):
                listing = [(path, want)]
            else:
                obj = cache / want[:2] / want[2:]
                if not obj.is_file() or _md5(obj) != want[:-4]:
                    problems.append(f"{obj}: the DVC listing of {path} is missing or damaged (remove it, then pull "
                                    "again)")
                    continue
                listing = [(path / e["relpath"], e["md5"]) for e in json.loads(obj.read_text())]
            for f, md5 in listing:
                if not f.is_file():
                    problems.append(f"{f}: missing (dvc.lock lists it)")
                elif (got := _md5(f)) != md5:
                    problems.append(f"{f}: md5 {got}, not {md5} as dvc.lock records: a damaged object in the remote "
                                    f"or the cache (remove {cache / md5[:2] / md5[2:]}, repair the remote with `dvc "
                                    "push` from a checkout that has the right file, then pull again)")
    return problems


def _cache_dir() -> Path | None:
    try:
        from dvc.repo import Repo

        with Repo(".") as repo:
            return Path(repo.cache.local.path)
    except Exception:  # noqa: BLE001 - no dvc, not a DVC repository
        return None


def sync(configs: list[str], remote: str | None = None, pull: bool = True, cores: str = "1") -> int:
    """``dvc pull`` the configs' pipelines, check their folders arrived, then ``snakemake --touch``
    each config: a DVC checkout does not keep modification times, which Snakemake would take for stale."""
    for cfg in configs:
        path = config_pipeline(cfg)
        if path is None:
            print(f"error: no dvc.yaml holds the pipeline of {cfg}; run  python -m mwm.workflow.dvc", file=sys.stderr)
            return 1
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
        outs = [o if isinstance(o, str) else next(iter(o)) for st in stages.values() for o in st.get("outs", [])]
        linked = next(((p, real) for p in outs if (real := leads_out(f"{p}/-"))), None)
        if linked:  # DVC would fetch, then fail to git-ignore the folder there
            print(f"error: {linked[0]} lies in {linked[1]}, outside the repository, where DVC cannot check out "
                  f"or track files; nothing pulled or touched (docs/dvc.md, 'Data on scratch')", file=sys.stderr)
            return 1
        if pull:
            problems = pull_problems(path, remote)
            if problems:
                print(f"error: cannot pull the pipeline of {cfg} ({path.as_posix()}): " + "; ".join(problems)
                      + "; nothing pulled or touched", file=sys.stderr)
                return 1
            if _run(["dvc", "pull", *(["-r", remote] if remote else []), path.as_posix()]) != 0:
                return 1
        missing = [p for p in outs if not Path(p).is_dir()]
        if missing:
            print(f"error: {len(missing)} tracked folders of {cfg} are missing, e.g. {missing[0]}; nothing touched "
                  "(is the remote complete? `dvc status -c`)", file=sys.stderr)
            return 1
        cache = _cache_dir()
        damaged = pulled_problems(path, cache) if cache is not None and path.with_name("dvc.lock").is_file() else []
        if damaged:
            lock = path.with_name("dvc.lock").as_posix()
            print(f"error: {len(damaged)} file(s) of {cfg} are not what {lock} records; nothing touched, "
                  "so the workflow does not take them for results:\n  " + "\n  ".join(damaged[:10])
                  + (f"\n  ... and {len(damaged) - 10} more" if len(damaged) > 10 else ""), file=sys.stderr)
            return 1
        if _run(["snakemake", "--cores", cores, "--configfile", cfg, "--touch", "--quiet", "all", "--", "all"]) != 0:
            return 1
    return 0


# --- apply an experiment ----------------------------------------------------------------


def unrecorded_outputs(files: list[Path] | None = None, existing: bool = True) -> list[Path]:
    """The stage outputs, over every pipeline of the checkout, that no ``dvc.lock`` records (a config built by
    ``snakemake`` alone, never committed to DVC; with ``existing``, those that exist here): ``dvc exp apply``
    checks out every pipeline, deletes them, having no copy to put back, and fails for each."""
    out = []
    for path in files if files is not None else written():
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
        lock_file = path.with_name("dvc.lock")
        lock = (yaml.safe_load(lock_file.read_text()) or {}).get("stages", {}) if lock_file.is_file() else {}
        for name, st in stages.items():
            wdir = path.parent / st.get("wdir", ".")
            recorded = {o["path"] for o in (lock.get(name) or {}).get("outs") or [] if o.get("md5")}
            for o in st.get("outs") or []:
                rel = o if isinstance(o, str) else next(iter(o))
                target = Path(os.path.normpath(wdir / rel))
                if rel not in recorded and (target.exists() or not existing):
                    out.append(target)
    return sorted(set(out))


def apply_experiment(name: str, configs: list[str]) -> int:
    """``dvc exp apply name`` that loses nothing: the outputs no ``dvc.lock`` records are moved aside while it
    runs and put back, DVC's failure to check those out (its exit 255) is not taken for the experiment's, and
    the applied configs' folders are then touched (``sync --no-pull``), so Snakemake does not take the applied
    results for stale."""
    keep = unrecorded_outputs()
    aside = Path(".dvc") / "tmp" / f"mwm-apply-{os.getpid()}"
    moved = []
    try:
        for target in keep:
            dest = aside / target
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, dest)
            moved.append((dest, target))
        print("+ dvc exp apply " + shlex.quote(name), flush=True)
        done = subprocess.run(["dvc", "exp", "apply", name], capture_output=True, text=True)
    finally:
        for dest, target in moved:
            home = target
            if home.exists():  # the experiment made it after all: ours goes beside it, not over it
                home = target.with_name(f"{target.name}.kept-{os.getpid()}")
                print(f"mwm: {target} exists after the apply; yours is at {home}", file=sys.stderr)
            os.rename(dest, home)
        shutil.rmtree(aside, ignore_errors=True)
    failed = re.search(r"Checkout failed for following targets:\n(.*?)\n(?:Is your cache|$)", done.stderr, re.S)
    failed_paths = {os.path.abspath(t.strip()) for t in failed.group(1).splitlines() if t.strip()} if failed else set()
    unrecorded = {os.path.abspath(k) for k in unrecorded_outputs(existing=False)}
    if done.returncode != 0 and not (failed and failed_paths <= unrecorded):
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done.returncode
    sys.stdout.write(done.stdout)
    if keep:
        print(f"mwm: kept {len(keep)} folder(s) no dvc.lock records, which dvc exp apply would have deleted: "
              + ", ".join(p.as_posix() for p in keep))
    return sync(configs, pull=False)


# --- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mwm.workflow.dvc",
                                description="write dvc.yaml (the default config's pipeline) and "
                                            "pipelines/<name>/dvc.yaml (every other config); run from the repository "
                                            "root. With the sync command: pull a config's results instead")
    p.add_argument("--default", default=DEFAULT_CONFIG,
                   help=f"the config whose pipeline is the root dvc.yaml (default: {DEFAULT_CONFIG})")
    p.add_argument("--check", action="store_true", help="exit 1 with a diff if a pipeline file is stale")
    sub = p.add_subparsers(dest="command", metavar="{sync,apply}", title="commands (none: write the pipeline files)")
    sp = sub.add_parser("sync", help="dvc pull a config's pipeline, then snakemake --touch",
                        description="dvc pull a config's pipeline, then snakemake --touch, so that "
                                    "`snakemake all -n` has nothing to do")
    sp.add_argument("--config", action="append", help=f"config file (repeatable; default: {DEFAULT_CONFIG})")
    sp.add_argument("--remote", "-r", default=None, help="DVC remote (default: the default remote)")
    sp.add_argument("--no-pull", action="store_true", help="only touch (after your own `dvc pull`)")
    ap = sub.add_parser("apply", help="dvc exp apply, losing no folder DVC never recorded, then touch",
                        description="dvc exp apply NAME with the stage outputs no dvc.lock records moved aside and "
                                    "put back (dvc exp apply deletes them), then sync --no-pull of the configs, so "
                                    "that `snakemake all -n` has nothing to do")
    ap.add_argument("name", help="the experiment (dvc exp show)")
    ap.add_argument("--config", action="append",
                    help=f"the experiment's config (repeatable; default: {DEFAULT_CONFIG})")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.command == "sync":
        return sync(a.config or [DEFAULT_CONFIG], remote=a.remote, pull=not a.no_pull)
    if a.command == "apply":
        return apply_experiment(a.name, a.config or [DEFAULT_CONFIG])
    default = os.path.normpath(a.default)
    if not Path(default).is_file():
        p.error(f"--default {a.default}: no such config file (run from the repository root)")
    try:
        texts = pipelines(all_configs(default), default)
    except ConfigError as exc:  # one line, not a traceback
        print(f"mwm.workflow.dvc: error: {exc}", file=sys.stderr)
        return 2
    if a.check:
        return check(texts)
    write(texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
