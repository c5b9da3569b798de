"""DVC pipelines generated from the Snakemake DAG, and the timestamp sync after ``dvc pull``.

Snakemake builds; DVC versions and shares the products. Each config is one DVC pipeline: the
embedded default (``config/config.yaml``) in the root ``dvc.yaml`` (a bare ``dvc repro`` is it),
every other ``config/<name>.yaml`` in ``pipelines/<name>/dvc.yaml`` (stages run from the
repository root: ``wdir: ../..``). The jobs come from Snakemake's command line
(``snakemake --dry-run --forceall --printshellcmds``); one stage per rule file and config:

- ``cmd``:    ``snakemake --cores all --configfile C --allowed-rules <its rules> -- <targets>``
              (other stages' outputs are plain inputs: a stage never reruns another's jobs);
- ``deps``:   inputs made by other stages, the rule file, the schema of each ``params`` section,
              and for the stages that carry no numerics version (data, report) the package code
              their ``python -m mwm...`` entry points import (:func:`code_deps`);
- ``params``: ``C: [sections]`` from :data:`PARAMS`, and ``src/mwm/numerics.py: [VERSION]`` where
              the rule carries it (train, studies: :func:`numerics_rules`), so these rerun on a
              numerics change, as in Snakemake, and not on a refactor; ``outs``: exactly the jobs' outputs
              (checkpoints ``push: false`` when ``workflow.dvc_push_checkpoints`` is false; the data
              stage's ``persist: true``, :data:`PERSISTENT`);
- top level:  ``metrics:`` every ``summary.json``; ``plots:`` val loss and sigma_max per config.

    python -m mwm.dvcgen                 # write dvc.yaml and pipelines/*/dvc.yaml (config/*.yaml)
    python -m mwm.dvcgen --check         # exit 1 with a diff if any of them is stale
    python -m mwm.dvcgen sync [--config config/ci.yaml]   # dvc pull, then snakemake --touch

``sync``: a DVC checkout does not keep modification times, so Snakemake would rerun pulled
outputs; ``sync`` pulls the config's pipeline, checks its outputs arrived, and runs
``snakemake --touch`` (in DAG order); ``snakemake all -n`` then has nothing to do.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import functools
import os
import re
import shlex
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from .io import atomic_write_text
from .paths import leads_out
from .stages import STAGES, rule_file_sections

__all__ = ["Job", "snakemake_jobs", "build", "render", "generate", "check", "sync", "main"]

DVC_YAML = "dvc.yaml"
SNAKEFILE = "Snakefile"
DEFAULT_CONFIG = "config/config.yaml"
PIPELINES = Path("pipelines")
PACKAGE = Path("src") / "mwm"
SCHEMA = PACKAGE / "schema"

#: Config sections (DVC ``params``) the entry points of each rule file read, besides ``name``: the
#: union of its stages' in the manifest (:mod:`mwm.stages`, where each is explained). DVC's dotted keys
#: are listed where the config file sets them (DVC refuses a param its file lacks; a schema default is
#: covered by the schema file, a dependency of the stage).
PARAMS = {rf: rule_file_sections(rf) for rf in dict.fromkeys(st.rule_file for st in STAGES.values())}
#: Outputs that are checkpoints (large; kept out of ``dvc push`` by ``workflow.dvc_push_checkpoints``).
CHECKPOINTS = ("*.pt",)
#: Rule files whose outputs DVC leaves in place when it reruns their stage (``persist``): Snakemake
#: decides what to remake, as without DVC, and refuses at load what DVC could not track afterwards (a
#: ``data/`` linked out of the repository) before anything is deleted. Tokenized data is hours at
#: paper scale.
PERSISTENT = ("data",)
#: Outputs listed under top-level ``metrics:``.
METRICS = ("summary.json",)
#: Plots per config: (plot id prefix, file name of the outputs it reads, plot properties).
PLOTS = (
    ("val_loss", "eval.csv", {"x": "step", "y": "val_loss", "template": "simple",
                              "x_label": "step", "y_label": "val loss"}),
    ("sigma_max", "spectral.csv", {"x": "step", "y": "sigma_max", "template": "sigma_max",
                                   "x_label": "step", "y_label": "sigma_max"}),
)

_HEADER = (
    "# Generated from the Snakemake DAG by:  python -m mwm.dvcgen   (tests/test_dvc.py runs --check)\n"
    "# Do not edit: change the rules or the configs and rerun it.\n"
    "# Pipeline of {config}:  dvc repro{target}\n"
)
_INVALID = set(string.punctuation) - {"_", "-"}


class DvcGenError(RuntimeError):
    pass


@dataclass
class Job:
    """One Snakemake job, as far as DVC needs it."""

    rule: str
    rulefile: str  # the .smk (or Snakefile) the rule is defined in, relative to the repository
    inputs: list[str]
    outputs: list[str]
    shellcmd: str = ""


# --- the Snakemake side -------------------------------------------------------------------


def _rule_blocks(snakefile: str = SNAKEFILE):
    """(rule name, defining file, its text up to the next rule) over the Snakefile and ``rules/*.smk``."""
    for path in [Path(snakefile), *sorted(Path("rules").glob("*.smk"))]:
        for block in re.split(r"^(?=(?:local)?rule\s+\w+\s*:)", path.read_text(), flags=re.M):
            if m := re.match(r"(?:local)?rule\s+(\w+)\s*:", block):
                yield m.group(1), path.as_posix(), block


def rule_files(snakefile: str = SNAKEFILE) -> dict[str, str]:
    """Rule name -> the file defining it (the Snakefile and ``rules/*.smk``)."""
    return {name: path for name, path, _ in _rule_blocks(snakefile)}


#: The numerics version, a DVC param where a rule carries it (``numerics=NUMERICS``): a bump reruns
#: those stages in DVC as in Snakemake.
NUMERICS_PARAM = {(PACKAGE / "numerics.py").as_posix(): ["VERSION"]}


def numerics_rules(snakefile: str = SNAKEFILE) -> set[str]:
    """The rules whose params carry the numerics version (``numerics=NUMERICS``)."""
    return {name for name, _, block in _rule_blocks(snakefile)
            if re.search(r"^\s+numerics=NUMERICS,", block, flags=re.M)}


def snakemake_jobs(configfile: str, snakefile: str = SNAKEFILE, target: str = "all") -> list[Job]:
    """Every job of ``target`` with ``--configfile configfile`` (whether or not it needs to run),
    from ``snakemake --dry-run --forceall --printshellcmds`` in the repository root."""
    cmd = ["snakemake", "--snakefile", snakefile, "--configfile", configfile, "--dry-run", "--forceall",
           "--printshellcmds", "--nolock", target]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise DvcGenError("snakemake is not on PATH: activate the environment .ci/install.sh installed into "
                          "(e.g. `source .venv/bin/activate`)") from exc
    if proc.returncode != 0:
        raise DvcGenError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    files = rule_files(snakefile)
    jobs: list[Job] = []
    in_shell = False  # a shell command may span lines, up to the next blank line
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        if in_shell and line.strip():
            jobs[-1].shellcmd += "\n" + line
            continue
        in_shell = False
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            jobs.append(Job(m.group(1), files.get(m.group(1), snakefile), [], []))
        elif jobs and (m := re.match(r"^\s+(input|output): (.*)$", line)):
            (jobs[-1].inputs if m.group(1) == "input" else jobs[-1].outputs).extend(m.group(2).split(", "))
        elif jobs and line.startswith("Shell command: "):
            jobs[-1].shellcmd, in_shell = line.removeprefix("Shell command: "), True
    if not jobs:
        raise DvcGenError(f"{' '.join(cmd)} listed no jobs")
    return local_bookkeeping_dropped(jobs)


def local_bookkeeping_dropped(jobs: list[Job]) -> list[Job]:
    """``jobs`` without the workflow's local bookkeeping, which is in the DAG only while this
    working tree holds a run that is not the config's own (or the markers of one set aside,
    :mod:`mwm.setaside`): its rule's jobs and the markers among the train jobs' inputs. The
    pipelines stay those of the configs, whatever runs this checkout holds."""
    from .setaside import RETRAIN_FOLDER, SET_ASIDE_RULE

    def marker(path: str) -> bool:
        return RETRAIN_FOLDER in Path(path).parts

    out = []
    for job in jobs:
        if job.rule != SET_ASIDE_RULE:
            job.inputs = [i for i in job.inputs if not marker(i)]
            out.append(job)
    return out


# --- code dependencies --------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    """The file of package module ``mwm.a.b`` (a package's ``__init__.py``), or None."""
    base = PACKAGE.joinpath(*name.split(".")[1:])
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imports_of(name: str, path: Path) -> set[str]:
    """The package modules named by the import statements of module ``name`` (file ``path``),
    wherever they stand: inside functions too."""
    package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "mwm")
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if mod.split(".")[0] == "mwm":
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return out


@functools.lru_cache(maxsize=None)
def imported_files(entry: str) -> tuple[str, ...]:
    """The package's files that ``python -m entry`` may import, relative to ``src/mwm``: the
    closure of the import statements from the entry module (a package's ``__main__`` too),
    read from the source so that imports inside functions count, with every module's parent
    packages (importing ``mwm.a.b`` runs ``mwm/a/__init__.py``)."""
    if _module_file(entry) is None:
        raise DvcGenError(f"entry point {entry}: no such module under {PACKAGE}")
    todo, seen = [entry, f"{entry}.__main__"], {}
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in seen:
                seen[name] = _module_file(name)
                if seen[name] is not None:
                    todo.extend(_imports_of(name, seen[name]))
    return tuple(sorted(f.relative_to(PACKAGE).as_posix() for f in seen.values() if f is not None))


def code_deps(kind: str, jobs: list[Job], imports=imported_files) -> list[str]:
    """Rule files, then the package code the jobs' ``python -m mwm...`` entry points import: a
    top-level module as its file, a subpackage as its folder (:func:`imported_files`: imports
    inside functions count, so the solver study, which trains, tracks the training code)."""
    found = set()
    for job in jobs:
        # `python -m mwm.x`, and launchers that take a module the same way (`torchrun ... -m mwm.train`)
        entries = re.findall(r"(?:^|\s)-m\s+(mwm(?:\.\w+)*)", job.shellcmd)
        if not entries:
            raise DvcGenError(f"rule {job.rule}: no `-m mwm...` entry point in its shell command, so its code "
                              f"dependencies are unknown:\n{job.shellcmd}")
        for entry in entries:
            found.update(imports(entry))
    files = sorted((PACKAGE / f).as_posix() for f in found if "/" not in f)
    pkgs = sorted({(PACKAGE / f.split("/")[0]).as_posix() for f in found if "/" in f})
    return sorted({j.rulefile for j in jobs}) + files + pkgs


# --- dvc.yaml -----------------------------------------------------------------------------


def stage_name(kind: str, config_name: str) -> str:
    return "".join("_" if c in _INVALID else c for c in f"{kind}-{config_name}")


def pipeline_file(config_name: str, default: bool) -> Path:
    """Where a config's pipeline lives: the root ``dvc.yaml`` for the default config."""
    return Path(DVC_YAML) if default else PIPELINES / config_name / DVC_YAML


def _out_entry(path: str, push: bool, persist: bool):
    """A ``dvc.yaml`` ``outs`` entry: the bare path unless an option differs from DVC's default."""
    opts = {**({} if push else {"push": False}), **({"persist": True} if persist else {})}
    return {path: opts} if opts else path


def _is_checkpoint(path: str) -> bool:
    return any(fnmatch.fnmatch(Path(path).name, pat) for pat in CHECKPOINTS)


def build(configs: list[str], default: str = DEFAULT_CONFIG, jobs_of=snakemake_jobs) -> dict[Path, dict]:
    """The content of each config's pipeline file (a dict per file), ``configs`` in order. An
    output already made by an earlier config's stage (two configs sharing a dataset) stays
    with that stage and is a dependency of the later one."""
    from .config import load_config

    files: dict[Path, dict] = {}
    owner: dict[str, str] = {}  # output -> stage name
    versioned = numerics_rules()
    for cfg_path in configs:
        cfg_path = Path(os.path.normpath(cfg_path)).as_posix()
        cfg = load_config(cfg_path)
        raw = yaml.safe_load(Path(cfg_path).read_text()) or {}
        dest = pipeline_file(cfg["name"], cfg_path == os.path.normpath(default))
        if dest in files:
            raise DvcGenError(f"{cfg_path}: config name {cfg['name']!r} is used by another config")
        back = os.path.relpath(".", dest.parent)  # from the pipeline's folder to the repository root
        push_ckpt = cfg["workflow"].get("dvc_push_checkpoints", True)
        by_kind: dict[str, list[Job]] = {}
        for job in jobs_of(cfg_path):
            if job.outputs and any(o not in owner for o in job.outputs):
                by_kind.setdefault(Path(job.rulefile).stem if job.rulefile != SNAKEFILE else job.rule, []).append(job)
        stages: dict[str, dict] = {}
        outs_here: list[str] = []
        for kind in _kind_order(by_kind):
            if kind not in PARAMS:
                raise DvcGenError(f"rule file {kind!r} has no entry in mwm.dvcgen.PARAMS (its config sections)")
            kjobs = by_kind[kind]
            name = stage_name(kind, cfg["name"])
            outs = sorted(o for j in kjobs for o in j.outputs if o not in owner)
            for o in outs:
                owner[o] = name
            outs_here += outs
            sections = [s for s in PARAMS[kind] if (s in cfg if "." not in s else _file_sets(raw, s))]
            inputs = sorted({i for j in kjobs for i in j.inputs} - set(outs))
            rules = sorted({j.rule for j in kjobs})
            # a versioned stage reruns on a numerics change (its param), not on every edit of its code
            is_versioned = bool(set(rules) & versioned)
            code = sorted({j.rulefile for j in kjobs}) if is_versioned else code_deps(kind, kjobs)
            deps = inputs + code + [
                (SCHEMA / f"{s}.yaml").as_posix() for s in dict.fromkeys(s.split(".")[0] for s in sections)]
            targets = sorted({next(o for o in j.outputs if o in outs) for j in kjobs})
            stage: dict = {"cmd": f"snakemake --cores all --configfile {shlex.quote(cfg_path)} --allowed-rules {' '.join(rules)} -- "
                                  + " ".join(shlex.quote(t) for t in targets)}
            if back != ".":
                stage["wdir"] = back
            stage["deps"] = list(dict.fromkeys(deps))
            if sections:
                stage["params"] = [{cfg_path: sections}]
            if is_versioned:
                stage.setdefault("params", []).append({k: list(v) for k, v in NUMERICS_PARAM.items()})
            stage["outs"] = [_out_entry(o, push_ckpt or not _is_checkpoint(o), kind in PERSISTENT) for o in outs]
            stages[name] = stage
        content: dict = {"stages": stages}
        outs_here.sort()
        # top-level metrics and plots are relative to the dvc.yaml's folder, not to a stage's wdir
        metrics = [os.path.join(back, o) if back != "." else o for o in outs_here if Path(o).name in METRICS]
        plots = []
        for pid, fname, props in PLOTS:
            ys = {(os.path.join(back, o) if back != "." else o): props["y"] for o in outs_here if Path(o).name == fname}
            if ys:
                plots.append({f"{pid}-{cfg['name']}": {
                    **{k: v for k, v in props.items() if k not in ("y", "template")},
                    "title": f"{props['y_label']} ({cfg['name']})", "template": props["template"], "y": ys}})
        if metrics:
            content["metrics"] = metrics
        if plots:
            content["plots"] = plots
        content["_config"] = cfg_path
        files[dest] = content
    return files


def _file_sets(raw: dict, dotted: str) -> bool:
    """Whether the config file itself sets the key ``a.b.c``."""
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _kind_order(by_kind: dict[str, list[Job]]) -> list[str]:
    """Stage kinds in dependency order (then by name), for a dvc.yaml that reads top-down."""
    made = {o: k for k, js in by_kind.items() for j in js for o in j.outputs}
    needs = {k: {made[i] for j in js for i in j.inputs if i in made} - {k} for k, js in by_kind.items()}
    order: list[str] = []
    while len(order) < len(needs):
        ready = sorted(k for k in needs if k not in order and needs[k] <= set(order))
        order.extend(ready or sorted(k for k in needs if k not in order))
    return order


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, data):
    if len(data) > 100 and " -- " in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def render(dest: Path, content: dict) -> str:
    content = dict(content)
    config = content.pop("_config")
    target = "" if dest == Path(DVC_YAML) else f" {dest.as_posix()}"
    body = yaml.dump(content, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False)
    return _HEADER.format(config=config, target=target) + body


def all_configs(default: str = DEFAULT_CONFIG) -> list[str]:
    """The default config first, then every other ``config/*.yaml`` by name (the file's stem, so ``ci``
    comes before ``ci-sweep`` and keeps the dataset they share)."""
    others = sorted((p.as_posix() for p in Path(default).parent.glob("*.yaml") if p.as_posix() != default),
                    key=lambda p: Path(p).stem)
    return [default, *others]


def generate(configs: list[str], default: str = DEFAULT_CONFIG) -> dict[Path, str]:
    return {dest: render(dest, content) for dest, content in build(configs, default).items()}


def generated_files() -> list[Path]:
    """The pipeline files this generator wrote (by their header)."""
    cands = [Path(DVC_YAML), *sorted(PIPELINES.glob(f"*/{DVC_YAML}"))]
    return [p for p in cands if p.is_file() and p.read_text().startswith(_HEADER.splitlines()[0])]


def check(texts: dict[Path, str]) -> int:
    """0 when every file holds what would be written and no other generated file exists."""
    stale = 0
    for path in sorted(set(texts) | set(generated_files())):
        old = path.read_text() if path.is_file() else ""
        new = texts.get(path, "")
        if old != new:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       f"{path} (committed)", f"{path} (generated)"))
    if stale:
        print(f"\n{stale} pipeline file(s) out of date: run  python -m mwm.dvcgen", file=sys.stderr)
        return 1
    print(f"up to date: {', '.join(p.as_posix() for p in sorted(texts))}")
    return 0


def write(texts: dict[Path, str]) -> None:
    for path in generated_files():
        if path not in texts:  # a config that no longer exists
            path.unlink()
            if path.parent != Path(".") and not any(path.parent.iterdir()):
                path.parent.rmdir()
            print(f"removed {path}")
    for path, text in texts.items():
        atomic_write_text(path, text)
        print(f"wrote {path}: {len(text.splitlines())} lines")


# --- sync ---------------------------------------------------------------------------------


def _run(cmd: list[str]) -> int:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.call(cmd)


def config_pipeline(configfile: str) -> tuple[Path, dict[str, dict]] | None:
    """(pipeline file, its stages) of the generated pipeline of ``configfile``."""
    want = f"# Pipeline of {os.path.normpath(configfile)}:"
    for path in generated_files():
        if want in path.read_text().splitlines()[2]:
            return path, (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    return None


def _out_path(out) -> tuple[str, bool]:
    """(path, pushed) of a dvc.yaml ``outs`` entry."""
    if isinstance(out, str):
        return out, True
    (path, opts), = out.items()
    return path, (opts or {}).get("push", True)


def pull_problems(pipeline: Path, remote: str | None = None) -> list[str]:
    """Why ``dvc pull`` of ``pipeline`` cannot fetch anything, in words ([] when it can
    try): no ``dvc.lock`` beside it (nothing was ever committed), no remote, or a local
    remote whose folder does not exist. ``dvc pull`` itself then prints "Everything is
    up to date" and hundreds of "checkout failed" paths."""
    problems = []
    lock = pipeline.with_name("dvc.lock")
    if not lock.is_file():
        problems.append(f"{lock.as_posix()} does not exist: this pipeline's results were never committed "
                        f"(`dvc repro {pipeline.as_posix()}` or `dvc commit -f {pipeline.as_posix()}`, then "
                        f"`dvc push {pipeline.as_posix()}` and commit {lock.as_posix()})")
    try:
        from dvc.repo import Repo
    except ImportError:  # no dvc: the pull itself will say so
        return problems
    try:
        with Repo(".") as repo:
            conf = repo.config
            name = remote or conf["core"].get("remote")
            remotes = dict(conf["remote"])
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


def sync(configs: list[str], remote: str | None = None, pull: bool = True, cores: str = "1") -> int:
    """``dvc pull`` the configs' pipelines, check their outputs are there, then
    ``snakemake --touch`` each config so that every output is newer than its inputs."""
    for cfg in configs:
        found = config_pipeline(cfg)
        if found is None:
            print(f"error: no generated dvc.yaml holds the pipeline of {cfg}; run  python -m mwm.dvcgen",
                  file=sys.stderr)
            return 1
        path, stages = found
        outs = [_out_path(o) for st in stages.values() for o in st.get("outs", [])]
        linked = next(((p, real) for p, _ in outs if (real := leads_out(p))), None)
        if linked:  # DVC would fetch, then fail to git-ignore the file there
            print(f"error: {linked[0]} lies in {linked[1]}, outside the repository, where DVC cannot check out "
                  f"or track files; nothing pulled or touched (docs/dvc.md, 'Data on scratch')", file=sys.stderr)
            return 1
        if pull:
            problems = pull_problems(path, remote)
            if problems:  # before dvc pull, which would report "Everything is up to date" and fail each path
                print(f"error: cannot pull the pipeline of {cfg} ({path.as_posix()}): " + "; ".join(problems)
                      + "; nothing pulled or touched", file=sys.stderr)
                return 1
            unpushed = not all(pushed for _, pushed in outs)
            cmd = ["dvc", "pull", *(["-r", remote] if remote else []),
                   *(["--allow-missing"] if unpushed else []), path.as_posix()]
            if _run(cmd) != 0:
                return 1
        missing = [p for p, pushed in outs if pushed and not Path(p).exists()]
        if missing:
            print(f"error: {len(missing)} tracked outputs of {cfg} are missing, e.g. {missing[0]}; "
                  "nothing touched (is the remote complete? `dvc status -c`)", file=sys.stderr)
            return 1
        skipped = [p for p, pushed in outs if not pushed and not Path(p).exists()]
        if skipped:
            print(f"note: {len(skipped)} outputs of {cfg} are not pushed (workflow.dvc_push_checkpoints: false), "
                  f"e.g. {skipped[0]}: Snakemake sees those jobs as incomplete; rebuild the figures with "
                  "`dvc repro --allow-missing`", file=sys.stderr)
        if _run(["snakemake", "--cores", cores, "--configfile", cfg, "--touch", "--quiet", "all", "--", "all"]) != 0:
            return 1
    return 0


# --- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sync"]:
        p = argparse.ArgumentParser(prog="python -m mwm.dvcgen sync",
                                    description="dvc pull a config's pipeline, then snakemake --touch, so that "
                                                "`snakemake all -n` has nothing to do")
        p.add_argument("--config", action="append", help=f"config file (repeatable; default: {DEFAULT_CONFIG})")
        p.add_argument("--remote", "-r", default=None, help="DVC remote (default: the default remote)")
        p.add_argument("--no-pull", action="store_true", help="only touch (after your own `dvc pull`)")
        a = p.parse_args(argv[1:])
        return sync(a.config or [DEFAULT_CONFIG], remote=a.remote, pull=not a.no_pull)
    p = argparse.ArgumentParser(prog="python -m mwm.dvcgen",
                                description="write dvc.yaml (the default config's pipeline) and pipelines/<name>/dvc.yaml "
                                            "(every other config) from the Snakemake DAG; run from the repository root")
    p.add_argument("--default", default=DEFAULT_CONFIG,
                   help=f"the config whose pipeline is the root dvc.yaml (default: {DEFAULT_CONFIG})")
    p.add_argument("--config", action="append",
                   help="config file (repeatable; default: the --default one and every other *.yaml beside it)")
    p.add_argument("--check", action="store_true", help="exit 1 with a diff if a pipeline file differs from what would be written")
    a = p.parse_args(argv)
    if not Path(SNAKEFILE).is_file():
        p.error("run from the repository root (no Snakefile here)")
    default = os.path.normpath(a.default)
    if not Path(default).is_file():
        p.error(f"--default {a.default}: no such config file")
    try:
        texts = generate(a.config or all_configs(default), default)
    except DvcGenError as exc:  # one line, not a traceback
        print(f"mwm.dvcgen: error: {exc}", file=sys.stderr)
        return 2
    if a.check:
        return check(texts)
    write(texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
