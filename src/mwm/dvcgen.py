"""``dvc.yaml`` generated from the Snakemake DAG, and the timestamp sync after ``dvc pull``.

Snakemake is the one engine that knows how each product is built; DVC versions the
products and shares them through a remote. This module asks Snakemake (its Python
API) which jobs the target ``all`` has for each config and writes one DVC stage per
(rule file, config): ``data-default``, ``train-default``, ``studies-ci``, ... (DVC
reserves ``@`` for names it generates from ``foreach``). Each stage

- ``cmd``:    ``snakemake --cores all --configfile <config> --allowed-rules <its rules> -- <targets>``,
              one target per job. ``--allowed-rules`` makes the inputs from other stages
              plain files to Snakemake, so a DVC stage never reruns another stage's jobs;
- ``deps``:   the jobs' inputs made by other stages, the rule file, the package code the
              rules' ``python -m`` entry points import (a subpackage as a folder), and the
              schema files of the config sections in ``params``;
- ``params``: ``<config file>: [sections]``: the rule's ``params:`` named like a config
              section (``train=CFG["train"]``), plus :data:`EXTRA_PARAMS`; values are never restated;
- ``outs``:   exactly the jobs' outputs (``temp()`` ones excepted); checkpoints
              (:data:`CHECKPOINTS`) get ``push: false`` when the config's
              ``workflow.dvc_push_checkpoints`` is false.

Top level ``metrics:`` lists every ``summary.json`` (``dvc metrics show``: final and best val
loss, status per run) and ``plots:`` a val-loss and a sigma_max plot per config, from the
runs' ``eval.csv`` and ``spectral.csv`` (template ``.dvc/plots/sigma_max.json``).

Command line (from the repository root)::

    python -m mwm.dvcgen --config config/config.yaml --config config/ci.yaml   # write dvc.yaml
    python -m mwm.dvcgen --check          # exit 1 (and a diff) if dvc.yaml is not what it would write
    python -m mwm.dvcgen sync --config config/ci.yaml   # dvc pull, then snakemake --touch

Without ``--config`` the generator uses the configs named in the header of the existing
``dvc.yaml``, and ``sync`` uses ``config/config.yaml``.

``sync``: DVC checkouts do not keep modification times, so after ``dvc pull`` Snakemake
would see outputs older than their inputs and rerun them. ``sync`` pulls the config's
stages, checks every output is there, and runs ``snakemake --touch`` for the config (in
DAG order, so every output is newer than its inputs); ``snakemake all -n`` then has
nothing to do.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import os
import re
import shlex
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["Job", "snakemake_jobs", "build", "render", "generate", "main"]

DVC_YAML = "dvc.yaml"
SNAKEFILE = "Snakefile"
PACKAGE = Path("src") / "mwm"
SCHEMA = PACKAGE / "schema"

#: Outputs that are checkpoints (large; kept out of ``dvc push`` by ``workflow.dvc_push_checkpoints``).
CHECKPOINTS = ("*.pt",)
#: Outputs listed under top-level ``metrics:``.
METRICS = ("summary.json",)
#: Plots per config: (plot id prefix, file name of the outputs it reads, plot properties).
PLOTS = (
    ("val_loss", "eval.csv", {"x": "step", "y": "val_loss", "template": "simple",
                              "x_label": "step", "y_label": "val loss"}),
    ("sigma_max", "spectral.csv", {"x": "step", "y": "sigma_max", "template": "sigma_max",
                                   "x_label": "step", "y_label": "sigma_max"}),
)
#: Config sections a rule's entry point reads besides the ones it passes as ``params:``.
#: ``grid``: a variant's assignment (``grid.custom``) is read from it.
EXTRA_PARAMS = {"train": ("grid",)}

_HEADER = (
    "# Generated from the Snakemake DAG by:  python -m mwm.dvcgen {args}\n"
    "# Do not edit: change the rules or the configs and rerun it (tests/test_dvc.py checks with --check).\n"
    "# Stages: <rule file>-<config name>; outputs are exactly the Snakemake rules' outputs.\n"
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
    outputs: list[str]  # temp() outputs left out
    params: list[str]  # names of the rule's params
    shellcmd: str = ""
    script: str | None = None


# --- the Snakemake side -------------------------------------------------------------------


def snakemake_jobs(configfile: str, snakefile: str = SNAKEFILE, target: str = "all") -> list[Job]:
    """The jobs Snakemake plans for ``target`` with ``--configfile configfile`` (all of them,
    whether or not they need to run), from the current directory (the repository root)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    root = Path.cwd()
    jobs = []
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wapi = api.workflow(resource_settings=ResourceSettings(cores=1),
                            config_settings=ConfigSettings(configfiles=[Path(configfile)]),
                            snakefile=Path(snakefile))
        wapi.dag(DAGSettings(targets={target}))
        # What `snakemake --summary` does, without printing: the DAG of every job of the target.
        # (Workflow._prepare_dag/_build_dag are not public API; snakemake is pinned in the
        # `workflow` extra and tests/test_dvc.py cross-checks the result with `--summary`.)
        wf = wapi._workflow
        wf._prepare_dag(forceall=False, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        for job in wf.dag.jobs:
            rule = job.rule
            outputs = [str(f) for f in job.output if not f.flags.get("temp")]
            script = getattr(rule, "script", None)
            jobs.append(Job(
                rule=rule.name,
                rulefile=_rel(rule.snakefile, root),
                inputs=[str(f) for f in job.input],
                outputs=outputs,
                params=list(getattr(job.params, "_names", {}) or {}),
                shellcmd=rule.shellcmd or "",
                script=_rel(script, root) if isinstance(script, (str, Path)) else None,
            ))
    return jobs


def _rel(path, root: Path) -> str:
    p = Path(str(path))
    try:
        return p.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.as_posix()


# --- code dependencies --------------------------------------------------------------------


def _module_file(mod: str) -> Path | None:
    parts = mod.split(".")
    if parts[0] != PACKAGE.name:
        return None
    base = PACKAGE.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports(mod: str) -> set[str]:
    path = _module_file(mod)
    if path is None:
        return set()
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            found.add(src)
            found.update(f"{src}.{a.name}" for a in node.names)
    return {m for m in found if _module_file(m) is not None}


def module_closure(entry: str) -> set[str]:
    """Every module of the package that ``python -m entry`` may import (imports anywhere in a
    module, function bodies included), with the packages above each."""
    todo = [entry]
    if _module_file(entry) and _module_file(entry).name == "__init__.py":
        todo.append(f"{entry}.__main__")
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen or _module_file(mod) is None:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(mod))
    return seen


def code_deps(jobs: list[Job]) -> list[str]:
    """The code a set of jobs runs: rule files, scripts, and the package modules their
    ``python -m`` commands import (top-level modules as files, subpackages as folders)."""
    deps = set()
    for job in jobs:
        deps.add(job.rulefile)
        if job.script:
            deps.add(job.script)
        for entry in re.findall(r"python3?\s+-m\s+([A-Za-z_][\w.]*)", job.shellcmd):
            for mod in module_closure(entry):
                parts = mod.split(".")
                if len(parts) > 2 or (len(parts) == 2 and _module_file(mod).name == "__init__.py"):
                    deps.add((PACKAGE / parts[1]).as_posix())
                else:
                    deps.add(_module_file(mod).as_posix())
    return sorted(deps)


# --- dvc.yaml -----------------------------------------------------------------------------


def _raw_config(path: str) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def stage_name(kind: str, config_name: str) -> str:
    return "".join("_" if c in _INVALID else c for c in f"{kind}-{config_name}")


def _is_checkpoint(path: str) -> bool:
    return any(fnmatch.fnmatch(Path(path).name, pat) for pat in CHECKPOINTS)


def build(configs: list[str], jobs_of=snakemake_jobs) -> dict:
    """The dvc.yaml content (a dict) for ``configs``, in order. An output already made by a
    stage of an earlier config (two configs sharing a dataset) stays with that stage."""
    from .config import load_config

    stages: dict[str, dict] = {}
    owner: dict[str, str] = {}  # output -> stage name
    metrics: list[str] = []
    plots: list[dict] = []
    for cfg_path in configs:
        cfg_path = Path(os.path.normpath(cfg_path)).as_posix()
        cfg = load_config(cfg_path)
        raw = _raw_config(cfg_path)
        push_ckpt = cfg["workflow"].get("dvc_push_checkpoints", True)
        jobs = [j for j in jobs_of(cfg_path) if j.outputs]
        by_kind: dict[str, list[Job]] = {}
        for job in jobs:
            kind = Path(job.rulefile).stem if job.rulefile != SNAKEFILE else job.rule
            by_kind.setdefault(kind, []).append(job)
        outs_here: list[str] = []
        for kind in _kind_order(by_kind):
            # jobs whose outputs an earlier config's stage already tracks stay with that stage
            kjobs = [j for j in by_kind[kind] if any(o not in owner for o in j.outputs)]
            if not kjobs:
                continue
            name = stage_name(kind, cfg["name"])
            if name in stages:
                raise DvcGenError(f"two configs give the stage name {name!r}: config names must differ")
            outs = sorted(o for j in kjobs for o in j.outputs if o not in owner)
            own = set(outs)
            for o in outs:
                owner[o] = name
            outs_here += outs
            # inputs made by the config's other stages, by an earlier config's stage, or source files
            inputs = {i for j in kjobs for i in j.inputs} - own
            sections = []
            for j in kjobs:
                for s in [*j.params, *EXTRA_PARAMS.get(j.rule, ())]:
                    if s in raw and s != "name" and s not in sections:
                        sections.append(s)
            deps = sorted(inputs) + code_deps(kjobs) + [
                (SCHEMA / f"{s}.yaml").as_posix() for s in sections if (SCHEMA / f"{s}.yaml").is_file()]
            rules = sorted({j.rule for j in kjobs})
            targets = sorted({next(o for o in j.outputs if o in own) for j in kjobs})
            cmd = (f"snakemake --cores all --configfile {shlex.quote(cfg_path)} --allowed-rules {' '.join(rules)} -- "
                   + " ".join(shlex.quote(t) for t in targets))
            stage = {"cmd": cmd, "deps": _unique(deps)}
            if sections:
                stage["params"] = [{cfg_path: sections}]
            stage["outs"] = [o if push_ckpt or not _is_checkpoint(o) else {o: {"push": False}} for o in outs]
            stages[name] = stage
        outs_here.sort()
        metrics += [o for o in outs_here if Path(o).name in METRICS]
        for pid, fname, props in PLOTS:
            files = [o for o in outs_here if Path(o).name == fname]
            if files:
                plot = dict(props)
                y = plot.pop("y")
                plots.append({f"{pid}-{cfg['name']}": {
                    **{k: v for k, v in plot.items() if k != "template"},
                    "title": f"{props['y_label']} ({cfg['name']})",
                    "template": props["template"],
                    "y": {f: y for f in files},
                }})
    out: dict = {"stages": stages}
    if metrics:
        out["metrics"] = metrics
    if plots:
        out["plots"] = plots
    return out


def _kind_order(by_kind: dict[str, list[Job]]) -> list[str]:
    """Stage kinds in dependency order (then by name), for a dvc.yaml that reads top-down."""
    made = {o: k for k, js in by_kind.items() for j in js for o in j.outputs}
    needs = {k: {made[i] for j in js for i in j.inputs if i in made} - {k} for k, js in by_kind.items()}
    order: list[str] = []
    while len(order) < len(needs):
        ready = sorted(k for k in needs if k not in order and needs[k] <= set(order))
        if not ready:  # a cycle between rule files: keep the rest by name
            ready = sorted(k for k in needs if k not in order)
        order.extend(ready)
    return order


def _unique(items):
    return list(dict.fromkeys(items))


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, data):
    if len(data) > 100 and " -- " in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def render(content: dict, configs: list[str]) -> str:
    args = " ".join(f"--config {c}" for c in configs)
    body = yaml.dump(content, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False)
    return _HEADER.format(args=args) + body


def configs_from_header(path: str = DVC_YAML) -> list[str]:
    p = Path(path)
    if not p.is_file():
        return []
    first = p.read_text().splitlines()[:1]
    return re.findall(r"--config\s+(\S+)", first[0]) if first else []


def generate(configs: list[str]) -> str:
    return render(build(configs), configs)


# --- sync ---------------------------------------------------------------------------------


def _run(cmd: list[str]) -> int:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.call(cmd)


def config_stages(configfile: str, path: str = DVC_YAML) -> dict[str, dict]:
    """The stages of ``dvc.yaml`` that run Snakemake with ``--configfile configfile``."""
    with open(path) as fh:
        stages = (yaml.safe_load(fh) or {}).get("stages", {})
    flag = f"--configfile {configfile} "
    return {name: st for name, st in stages.items() if flag in st.get("cmd", "")}


def _out_path(out) -> tuple[str, bool]:
    """(path, pushed) of a dvc.yaml ``outs`` entry."""
    if isinstance(out, str):
        return out, True
    (path, opts), = out.items()
    return path, (opts or {}).get("push", True)


def sync(configs: list[str], remote: str | None = None, pull: bool = True, cores: str = "1") -> int:
    """``dvc pull`` the configs' stages, check their outputs are there, then
    ``snakemake --touch`` each config so that every output is newer than its inputs."""
    for cfg in configs:
        stages = config_stages(cfg)
        if not stages:
            print(f"error: dvc.yaml has no stage for {cfg}; run  python -m mwm.dvcgen --config {cfg} ...",
                  file=sys.stderr)
            return 1
        outs = [_out_path(o) for st in stages.values() for o in st.get("outs", [])]
        if pull:
            unpushed = not all(pushed for _, pushed in outs)
            cmd = ["dvc", "pull", *(["-r", remote] if remote else []),
                   *(["--allow-missing"] if unpushed else []), *stages]
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
                                    description="dvc pull a config's stages, then snakemake --touch, so that "
                                                "`snakemake all -n` has nothing to do")
        p.add_argument("--config", action="append", help="config file (repeatable; default: config/config.yaml)")
        p.add_argument("--remote", "-r", default=None, help="DVC remote (default: the default remote)")
        p.add_argument("--no-pull", action="store_true", help="only touch (after your own `dvc pull`)")
        a = p.parse_args(argv[1:])
        configs = a.config or ["config/config.yaml"]
        return sync(configs, remote=a.remote, pull=not a.no_pull)
    p = argparse.ArgumentParser(prog="python -m mwm.dvcgen",
                                description="write dvc.yaml from the Snakemake DAG (run from the repository root)")
    p.add_argument("--config", action="append",
                   help="config file (repeatable; default: the configs in the header of the existing dvc.yaml)")
    p.add_argument("--check", action="store_true", help="exit 1 with a diff if dvc.yaml differs from what would be written")
    p.add_argument("--output", default=DVC_YAML)
    a = p.parse_args(argv)
    configs = a.config or configs_from_header(a.output) or ["config/config.yaml"]
    if not Path(SNAKEFILE).is_file():
        p.error("run from the repository root (no Snakefile here)")
    text = generate(configs)
    out = Path(a.output)
    if a.check:
        old = out.read_text() if out.is_file() else ""
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                       f"{out} (committed)", f"{out} (generated)"))
            print(f"\n{out} is out of date: run  python -m mwm.dvcgen {' '.join('--config ' + c for c in configs)}",
                  file=sys.stderr)
            return 1
        print(f"{out} is up to date ({', '.join(configs)})")
        return 0
    out.write_text(text)
    print(f"wrote {out}: {len(text.splitlines())} lines ({', '.join(configs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
