"""DVC over the Snakemake workflow (dvc.yaml written from each config by `python -m mwm.workflow.dvc`).

Everything runs offline in a temporary copy of the repository (tracked files plus
untracked, non-ignored ones) with a temporary DVC remote. The committed layout (the
default config in the root dvc.yaml, the others in pipelines/<name>/dvc.yaml) is checked
with dry runs; one real run is shared by the module (fixture ``ws``), on the CI config made
the root pipeline (``python -m mwm.workflow.dvc --default config/ci.yaml``), so that a bare
``dvc repro`` is exercised at CI cost:

    dvc repro  ->  dvc push  ->  delete results/, data/, paper_figures/ (but what git tracks),
    the DVC cache and .snakemake/  ->  python -m mwm.workflow.dvc sync (dvc pull + snakemake --touch)
"""

from __future__ import annotations

import hashlib
import json
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CI = "config/ci.yaml"
PRODUCTS = ("results", "data", "paper_figures")  # nothing in them is hand-written
TABLE_SUFFIXES = (".csv", ".md", ".tex", ".json", ".txt")
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")

needs_tools = pytest.mark.skipif(
    importlib.util.find_spec("snakemake") is None or shutil.which("dvc") is None or shutil.which("git") is None,
    reason="needs snakemake, dvc (pip install -e '.[workflow,dvc]') and git",
)
slow = [needs_tools, pytest.mark.slow]


# --- helpers ------------------------------------------------------------------------------


def run(args, cwd, env, check=True, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def copy_repo(dest: Path) -> None:
    """Tracked files and untracked, non-ignored ones (what a commit of the working tree would hold)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True).stdout
    for rel in sorted(set(out.decode().split("\0")) - {""}):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def make_env(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["DVC_NO_ANALYTICS"] = "1"
    env.pop("SNAKEMAKE_PROFILE", None)
    return env


def init_workspace(root: Path, env: dict) -> None:
    run(["git", "init", "-q"], root, env)
    run(["dvc", "config", "--local", "core.site_cache_dir", str(root.parent / "dvc-site-cache")], root, env)
    run(["dvc", "remote", "add", "--local", "-f", "-d", "tmp", str(root.parent / "remote")], root, env)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


#: The workflow's own records inside tracked folders, which .dvcignore leaves out.
IGNORED = {".owner.json", ".retrain", ".verified.json"}


def files_under(root: Path, rel: str) -> list[str]:
    p = root / rel
    if p.is_dir():
        return sorted(f.relative_to(root).as_posix() for f in p.rglob("*")
                      if f.is_file() and not IGNORED & set(f.relative_to(p).parts))
    return [rel]


def load_dvc_yaml(root: Path) -> dict:
    return yaml.safe_load((root / "dvc.yaml").read_text())


def out_path(out) -> str:
    return out if isinstance(out, str) else next(iter(out))


def ci_stages(root: Path) -> dict[str, dict]:
    stages = load_dvc_yaml(root)["stages"]
    return {n: s for n, s in stages.items() if f"--configfile {CI} " in s["cmd"]}


def stage_kind(stages: dict, kind: str) -> str | None:
    return kind if kind in stages else None


def pipeline_files(root: Path) -> list[Path]:
    return [root / "dvc.yaml", *sorted((root / "pipelines").glob("*/dvc.yaml"))]


def file_stages(root: Path, path: Path) -> list[str]:
    """Stage names of a pipeline file as `dvc repro` prints them."""
    names = list(yaml.safe_load(path.read_text())["stages"])
    rel = path.relative_to(root).as_posix()
    return names if rel == "dvc.yaml" else [f"{rel}:{n}" for n in names]


def tracked_files(root: Path, stages: dict) -> list[str]:
    return sorted(f for s in stages.values() for o in s["outs"] for f in files_under(root, out_path(o)))


def ran_stages(proc: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", proc.stdout + proc.stderr)


def changed_stages(root: Path, env: dict, stages=("dvc.yaml",)) -> set[str]:
    out = run(["dvc", "status", "dvc.yaml"], root, env).stdout
    return set(re.findall(r"^([\w-]+):\s*$", out, flags=re.M))


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A copy of the repository as it would be committed."""
    root = tmp_path_factory.mktemp("dvc-pristine") / "repo"
    copy_repo(root)
    env = make_env(root)
    run(["git", "init", "-q"], root, env)
    return root, env


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The CI config built through DVC, pushed, deleted and pulled back (see the module doc)."""
    root = tmp_path_factory.mktemp("dvc-ws") / "repo"
    copy_repo(root)
    env = make_env(root)
    init_workspace(root, env)
    run([sys.executable, "-m", "mwm.workflow.dvc", "--default", CI], root, env, timeout=300)
    stages = ci_stages(root)
    assert stages, "dvc.yaml has no stage for the CI config"
    assert not (root / "pipelines" / "ci" / "dvc.yaml").exists()
    assert (root / "pipelines" / "default" / "dvc.yaml").is_file()

    built = run(["dvc", "repro"], root, env, timeout=1800)  # bare: the root pipeline only
    assert sorted(ran_stages(built)) == sorted(stages)
    files = tracked_files(root, stages)
    before = {f: md5(root / f) for f in files}
    run(["dvc", "push", "dvc.yaml"], root, env)

    # a fresh clone: no products (everything under results/, data/, paper_figures/ but what git
    # tracks there, so an input the rules do not declare goes too), no cache, no Snakemake metadata
    for top in PRODUCTS:
        for p in sorted((root / top).iterdir()):
            if p.name not in (".gitkeep", ".gitignore"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    shutil.rmtree(root / ".dvc" / "cache")
    shutil.rmtree(root / ".snakemake")
    assert not any((root / f).exists() for f in files)

    synced = run([sys.executable, "-m", "mwm.workflow.dvc", "sync", "--config", CI], root, env, timeout=600)
    return {"root": root, "env": env, "stages": stages, "files": files, "before": before, "sync": synced}


# --- the pipeline files -------------------------------------------------------------------


def test_committed_pipelines_are_what_the_configs_give():
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        texts = dvcgen.pipelines(dvcgen.all_configs())
        assert dvcgen.check(texts) == 0, "a pipeline file is stale: run  python -m mwm.workflow.dvc"
    finally:
        os.chdir(cwd)
    assert Path("dvc.yaml") in texts and Path("pipelines/ci/dvc.yaml") in texts
    # one screen of stages per config: the per-run lines are metrics and plots only
    for path, text in texts.items():
        stages = yaml.safe_load(text)["stages"]
        assert set(stages) <= {"data", "runs", "studies", "figures"}, path
        assert len(yaml.safe_dump(stages).splitlines()) < 100, path


def test_check_fails_on_drift_and_on_a_pipeline_without_config(tmp_path, monkeypatch, capsys):
    from mwm.workflow import dvc as dvcgen

    monkeypatch.chdir(REPO)
    texts = dvcgen.pipelines(dvcgen.all_configs())
    monkeypatch.chdir(tmp_path)
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert dvcgen.check(texts) == 0
    ci = Path("pipelines/ci/dvc.yaml")
    ci.write_text(texts[ci].replace("    outs:\n", "    outs:\n    - results/elsewhere\n", 1))
    assert dvcgen.check(texts) == 1
    assert "-    - results/elsewhere" in capsys.readouterr().out
    ci.write_text(texts[ci])
    shutil.copytree("pipelines/ci", "pipelines/old")
    assert dvcgen.check(texts) == 1 and "pipelines/old/dvc.yaml (committed)" in capsys.readouterr().out


def test_each_stage_tracks_its_folder_with_its_params_and_code():
    """Stages by kind: each tracks one folder; runs and studies carry the numerics version and no
    code, data and figures their entry point's code; a shared dataset belongs to one pipeline."""
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        texts = dvcgen.pipelines(dvcgen.all_configs())
    finally:
        os.chdir(cwd)
    data_owner: dict[str, Path] = {}
    for path, text in texts.items():
        content = yaml.safe_load(text)
        cfg = re.match(r"# DVC pipeline of (\S+):", text).group(1)
        for kind, st in content["stages"].items():
            assert st["cmd"].endswith(f" {kind} -- {kind}") and f"--configfile {cfg} " in st["cmd"], (path, kind)
            assert st.get("wdir", ".") == ("." if path == Path("dvc.yaml") else "../.."), (path, kind)
            (out,) = st["outs"]
            folder = out_path(out)
            versioned = dvcgen.NUMERICS in st.get("params", [])
            code = [d for d in st["deps"] if d.startswith("src/mwm/") and "/schema/" not in d]
            assert versioned == (kind in ("runs", "studies")) and bool(code) == (not versioned), (path, kind)
            assert ("src/mwm/report" in code) == (kind == "figures"), (path, kind)
            assert out == {folder: {"persist": True}}, (path, kind)  # Snakemake decides what to remake
            if kind == "data":
                assert folder not in data_owner, f"{folder} is tracked by {data_owner.get(folder)} and {path}"
                data_owner[folder] = path
            else:
                assert folder.endswith("/" + yaml.safe_load((REPO / cfg).read_text())["name"])
    assert len(data_owner) >= 2


def test_a_scale_files_sections_are_params_of_the_scale_file(tmp_path):
    """A config extending a scale: each stage's sections are params of the file that sets them (DVC
    refuses a param its file lacks), so an edit of the scale reruns the stages that read what changed."""
    from mwm.config import load_config
    from mwm.workflow import dvc as dvcgen

    folder = tmp_path / "config"
    (folder / "scales").mkdir(parents=True)
    scale = folder / "scales" / "s.yaml"
    scale.write_text("data: {corpus: shakespeare, vocab_size: 256}\nmodel: {n_layer: 2, n_head: 2, n_embd: 32}\n"
                     "train: {batch_size: 8}\n")
    path = folder / "x.yaml"
    path.write_text("extends: scales/s.yaml\ntrain: {max_iters: 16}\ngrid: {assignments: [none], seeds: [0]}\n")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        stages = dvcgen.pipeline(str(path), load_config(path), set())["stages"]
    finally:
        os.chdir(cwd)
    params = {kind: {f: set(keys) for p in st.get("params", []) for f, keys in p.items()}
              for kind, st in stages.items()}
    assert params["data"] == {str(scale): {"data"}}
    assert params["runs"][str(scale)] == {"model", "train"} and {"train", "grid"} <= params["runs"][str(path)]
    assert "model" not in params["runs"][str(path)]
    assert "studies" in params["studies"][str(path)]  # a section no file sets stays the config file's


def test_every_param_of_a_committed_pipeline_is_set_by_its_file():
    """DVC fails a stage whose params file lacks a key it lists: each is set by the config or its scale."""
    from mwm.config import read_mapping
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        files = {path: yaml.safe_load(path.read_text()) for path in dvcgen.written()}
        scaled = set()
        for path, content in files.items():
            for kind, st in content["stages"].items():
                for file, keys in ((f, k) for entry in st.get("params", []) for f, k in entry.items()):
                    if file in dvcgen.NUMERICS:
                        continue
                    raw = read_mapping(file)
                    scaled |= {file} if file.startswith("config/scales/") else set()
                    missing = [k for k in keys if not dvcgen._file_sets(raw, k)]
                    assert not missing, (path, kind, file, missing)
    finally:
        os.chdir(cwd)
    assert {"config/scales/ci.yaml", "config/scales/laptop.yaml"} <= scaled


def test_code_deps_cover_every_module_the_entry_point_imports():
    """Read independently of the generator: every package module a data or figures stage's tracked
    code imports (inside functions too) lies under one of the stage's code deps."""
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        deps = {e: dvcgen.code_deps(e) for e in ("mwm.data", "mwm.report")}
    finally:
        os.chdir(cwd)
    for entry, code in deps.items():
        sources = [p for d in code for p in ([REPO / d] if d.endswith(".py") else (REPO / d).rglob("*.py"))]
        used = set()
        for p in sources:
            text = p.read_text()
            found = re.findall(r"^\s*(?:from|import)\s+(mwm(?:\.\w+)+)", text, flags=re.M)
            used.update(m.replace(".", "/") for m in found)
            rel = p.relative_to(REPO / "src").with_suffix("").parts
            for dots, mod in re.findall(r"^\s*from\s+(\.+)(\w*(?:\.\w+)*)\s+import", text, flags=re.M):
                base = rel[: len(rel) - len(dots)]
                used.add("/".join([*base, *filter(None, mod.split("."))]))
        for mod in sorted(used - {"mwm/numerics"}):  # a param of the versioned stages, not a code dep
            parts = mod.split("/")
            if len(parts) < 2:
                continue
            top = f"src/mwm/{parts[1]}"
            tracked = (top, f"{top}.py", f"src/{mod}.py", f"src/{mod}/__init__.py")
            assert any(t in code for t in tracked), f"{entry}: imports {mod} without tracking it"


def test_a_room_reached_only_through_its_vocabulary_is_tracked_by_file():
    """Preparing data reads the config, whose names come from the optimizer's torch-free vocabulary:
    a change to the optimizer's math must not rerun tokenization, a change to the vocabulary must."""
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        data, train = dvcgen.code_deps("mwm.data"), dvcgen.code_deps("mwm.train")
    finally:
        os.chdir(cwd)
    assert "src/mwm/optim/vocab.py" in data and "src/mwm/optim/__init__.py" in data
    assert not any(d == "src/mwm/optim" or d.startswith("src/mwm/optim/") and "vocab" not in d
                   and "__init__" not in d for d in data)
    assert "src/mwm/optim" in train and "src/mwm/config" in train


@pytest.mark.slow
@needs_tools
def test_stage_folders_hold_exactly_the_rules_outputs():
    """Cross-check with `snakemake --summary`: every output of a config lies in the folder of the stage
    whose rules make it, and each stage's target needs nothing outside the stages before it."""
    from concurrent.futures import ThreadPoolExecutor

    root = REPO
    env = make_env(root)
    paths = pipeline_files(root)
    configs = [re.match(r"# DVC pipeline of (\S+):", path.read_text()).group(1) for path in paths]
    # one snakemake per config, two at a time (each is a single-threaded parse of the DAG)
    with ThreadPoolExecutor(max_workers=2) as pool:
        summaries = list(pool.map(
            lambda cfg: run(["snakemake", "--configfile", cfg, "--summary", "--nolock", "all"], root, env).stdout,
            configs))
    for path, cfg, summary in zip(paths, configs, summaries):
        stages = yaml.safe_load(path.read_text())["stages"]
        rows = [ln.split("\t") for ln in summary.splitlines() if "\t" in ln][1:]
        folders = {}
        for name, st in stages.items():
            allowed = re.search(r"--allowed-rules (.+?) -- ", st["cmd"]).group(1).split()
            folders[out_path(st["outs"][0])] = allowed
        for out, _date, rule, *_ in rows:
            if IGNORED & set(Path(out).parts):
                continue  # the workflow's own records (.dvcignore)
            if rule == "prepare_data" and not any(out.startswith(f + "/") for f in folders):
                continue  # a dataset another pipeline tracks
            owner = [f for f in folders if out == f or out.startswith(f + "/")]
            assert owner and rule in folders[owner[0]], f"{cfg}: {out} ({rule}) lies in no stage that runs {rule}"


@pytest.mark.slow
@needs_tools
def test_bare_repro_is_the_default_pipeline(pristine):
    """`dvc repro` in the root reproduces the embedded default's stages only; another config's
    pipeline runs when named (dry runs: nothing is built)."""
    root, env = pristine

    def touched(*targets) -> list[str]:
        proc = run(["dvc", "repro", "--dry", "-k", *targets], root, env, check=False, timeout=300)
        out = proc.stdout + proc.stderr
        names = re.findall(r"Running stage '([^']+)'", out) + re.findall(r"failed to reproduce '([^']+)'", out)
        for skipped in re.findall(r"Stages? (.+) will be skipped", out):
            names += re.findall(r"'([^']+)'", skipped)
        return sorted(set(names))

    assert touched() == sorted(file_stages(root, root / "dvc.yaml"))  # bare, as users type it
    ci = root / "pipelines" / "ci" / "dvc.yaml"
    assert touched(ci.relative_to(root).as_posix()) == sorted(file_stages(root, ci))


# --- the shared CI run --------------------------------------------------------------------


@pytest.mark.slow
@needs_tools
def test_round_trip_is_byte_identical(ws):
    root, before = ws["root"], ws["before"]
    assert ws["files"] and set(before) == set(ws["files"])
    changed = [f for f in ws["files"] if not (root / f).is_file() or md5(root / f) != before[f]]
    assert not changed, f"pulled files differ from the pushed ones: {changed[:5]}"


@pytest.mark.slow
@needs_tools
def test_snakemake_has_nothing_to_do_after_sync(ws):
    root, env = ws["root"], ws["env"]
    dry = ["snakemake", "--cores", "1", "--configfile", CI, "-n", "all"]
    assert "Nothing to be done" in run(dry, root, env).stdout
    # a checkout that leaves the inputs newer than the outputs (what DVC may do) ...
    for o in ws["stages"]["data"]["outs"]:
        for f in files_under(root, out_path(o)):
            os.utime(root / f)
    assert "Nothing to be done" not in run(dry, root, env).stdout
    # ... is what sync's touch step repairs
    run([sys.executable, "-m", "mwm.workflow.dvc", "sync", "--no-pull", "--config", CI], root, env)
    assert "Nothing to be done" in run(dry, root, env).stdout


@pytest.mark.slow
@needs_tools
def test_repro_after_pull_reruns_nothing_and_status_is_clean(ws):
    root, env = ws["root"], ws["env"]
    proc = run(["dvc", "repro"], root, env)  # bare, as users type it
    assert ran_stages(proc) == []
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout


@pytest.mark.slow
@needs_tools
def test_metrics_and_plots(ws, tmp_path):
    root, env = ws["root"], ws["env"]
    shown = run(["dvc", "metrics", "show"], root, env).stdout
    # one metrics file per config: each variant's final val loss over its seeds
    assert "final_val_loss_mean" in shown and "final_val_loss_std" in shown and "completed" in shown
    assert "summary.json" not in shown
    plots = run(["dvc", "plots", "show", "-o", str(tmp_path / "plots")], root, env)
    html = (tmp_path / "plots" / "index.html").read_text()
    assert "val loss (ci)" in html and "sigma_max (ci)" in html, plots.stdout
    shown = json.loads(run(["dvc", "plots", "show", "--json"], root, env).stdout)["data"]
    # the sigma_max plot is drawn with its own template: one panel per run, a line per matrix
    sigma = json.dumps(shown["sigma_max (ci)"])
    assert '"facet"' in sigma and '"detail"' in sigma, sigma[:2000]
    assert '"facet"' not in json.dumps(shown["val loss (ci)"])


def test_every_plot_template_is_referenced_and_exists():
    from mwm.workflow import dvc as dvcgen

    own = {p.stem for p in (REPO / ".dvc" / "plots").glob("*.json")}
    used = {t for *_, t in dvcgen.PLOTS}
    assert own <= used, f"templates in .dvc/plots/ no plot uses: {own - used}"
    builtin = {"linear", "simple", "scatter", "smooth", "confusion", "confusion_normalized", "bar_horizontal",
               "bar_horizontal_sorted"}
    assert used <= own | builtin, used - own - builtin
    stages = yaml.safe_load((REPO / "pipelines" / "ci" / "dvc.yaml").read_text())
    assert {t for p in stages["plots"] for v in p.values() for t in [v["template"]]} == used


@pytest.mark.slow
@needs_tools
def test_report_rebuilds_tables_identically(ws):
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    report = stage_kind(stages, "figures")
    if report is None:
        pytest.skip("no report stage for the CI config")
    outs = [f for o in stages[report]["outs"] for f in files_under(root, out_path(o))]
    tables = [f for f in outs if f.endswith(TABLE_SUFFIXES)]
    figures = [f for f in outs if f.endswith(FIGURE_SUFFIXES)]
    assert tables and figures
    pulled = {f: md5(root / f) for f in tables}
    proc = run(["dvc", "repro", "--force", "--single-item", report], root, env, check=False)
    if proc.returncode != 0:
        run(["dvc", "checkout", "--force", report], root, env)  # leave the pulled outputs for the next tests
        logs = "".join(f"--- {p.relative_to(root)}\n{p.read_text()[-3000:]}"
                       for p in (root / "logs").rglob("report*.log"))
        pytest.fail(f"the report does not rebuild from the pulled files (does it read a file no rule declares?)\n"
                    f"{proc.stderr[-3000:]}\n{logs}")
    assert ran_stages(proc) == [report]
    assert {f: md5(root / f) for f in tables} == pulled
    assert all((root / f).stat().st_size > 0 for f in figures)
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout


@pytest.mark.slow
@needs_tools
def test_corrupted_file_is_reported_and_restored(ws):
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    victim = next(f for f in ws["files"] if f.endswith("eval.csv"))
    folder = out_path(stages["runs"]["outs"][0])
    (root / victim).write_text("step,train_loss,val_loss\n0,nan,nan\n")
    status = run(["dvc", "status", "dvc.yaml"], root, env).stdout
    assert "modified" in status and folder in status
    run(["dvc", "checkout", "--force", folder], root, env)
    assert md5(root / victim) == ws["before"][victim]
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout


@pytest.mark.slow
@needs_tools
def test_outputs_are_ignored_by_git(ws):
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    outs = [out_path(o) for s in stages.values() for o in s["outs"]]
    proc = run(["git", "check-ignore", "--no-index", *outs], root, env, check=False)
    assert set(proc.stdout.split()) == set(outs)


def _edit_config(root: Path, section: str, key: str, value) -> str:
    path = root / CI
    old = path.read_text()
    raw = yaml.safe_load(old)
    raw.setdefault(section, {})[key] = value
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return old


@pytest.mark.slow
@needs_tools
def test_a_forced_repro_of_the_runs_stage_deletes_no_finished_run(ws):
    """DVC removes a stage's outputs before its command unless they persist: beside a running snakemake
    (whose lock then refused DVC's own) that deleted every finished run, never in DVC's cache yet. The
    folders persist, so Snakemake alone decides, and here it has nothing to do."""
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    runs = [f for f in ws["files"] if f.startswith("results/runs/")]
    before = {f: (root / f).stat().st_mtime_ns for f in runs}
    forced = run(["dvc", "repro", "-f", "-s", stage_kind(stages, "runs")], root, env, timeout=600)
    assert "Nothing to be done" in forced.stdout + forced.stderr, (forced.stdout + forced.stderr)[-3000:]
    assert {f: (root / f).stat().st_mtime_ns for f in runs} == before


@pytest.mark.slow
@needs_tools
def test_training_parameter_marks_training_stale(ws):
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    train = stage_kind(stages, "runs")
    max_iters = yaml.safe_load((root / CI).read_text())["train"]["max_iters"]
    old = _edit_config(root, "train", "max_iters", max_iters + 10)
    try:
        changed = changed_stages(root, env, ["dvc.yaml"])
        assert train in changed and stage_kind(stages, "data") not in changed
        status = run(["dvc", "status", train], root, env).stdout
        assert re.search(rf"{re.escape(CI)}:\s+modified:\s+train\b", status), status
    finally:
        (root / CI).write_text(old)
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout


@pytest.mark.slow
@needs_tools
def test_a_numerics_bump_reruns_training_and_studies_in_both_tools(ws):
    """Bumping mwm.numerics.VERSION: DVC sees the param of the train and study stages change (not the
    data's), and Snakemake plans every run of the grid to be set aside and retrained."""
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    path = root / "src" / "mwm" / "numerics.py"
    old = path.read_text()
    bumped, n = re.subn(r"^VERSION = (\d+)$", lambda m: f"VERSION = {int(m.group(1)) + 1}", old, count=1, flags=re.M)
    assert n == 1
    path.write_text(bumped)
    try:
        changed = changed_stages(root, env, ["dvc.yaml"])
        train = stage_kind(stages, "runs")
        assert {train, stage_kind(stages, "studies")} <= changed and stage_kind(stages, "data") not in changed
        status = run(["dvc", "status", train], root, env).stdout
        assert re.search(r"src/mwm/numerics\.py:\s+modified:\s+VERSION\b", status), status
        dry = run(["snakemake", "--cores", "1", "--configfile", CI, "-n", "all"], root, env)
        out = dry.stdout + dry.stderr
        runs = sum(f.endswith("/summary.json") for f in ws["files"])
        assert runs and len(re.findall(r"^(?:local)?rule set_aside_foreign_run:", out, flags=re.M)) == runs
        assert out.count("made with numerics version") == runs
    finally:
        path.write_text(old)
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout
    assert "Nothing to be done" in run(["snakemake", "--cores", "1", "--configfile", CI, "-n", "all"], root,
                                       env).stdout


@pytest.mark.slow
@needs_tools
def test_a_refactor_reruns_no_training_or_study_in_either_tool(ws):
    """An edit of the optimizer's code that moves no number (here a comment) leaves the train and study
    stages up to date in DVC and gives Snakemake nothing to do."""
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    path = root / "src" / "mwm" / "optim" / "muon.py"
    old = path.read_text()
    path.write_text(old + "\n# a refactor that moves no number\n")
    try:
        changed = changed_stages(root, env, ["dvc.yaml"])
        assert not changed & {stage_kind(stages, "runs"), stage_kind(stages, "studies")}, changed
        assert "Nothing to be done" in run(["snakemake", "--cores", "1", "--configfile", CI, "-n", "all"], root,
                                           env).stdout
    finally:
        path.write_text(old)


def _change_plotting_parameter(root: Path, report: dict) -> tuple[Path, str] | None:
    """Change a plotting parameter of the report stage: a key of a config section it reads
    (params), else the figures' resolution in the report's style module (code deps)."""
    for section in [s for p in report.get("params", []) for s in p.get(CI, [])]:
        schema = yaml.safe_load((root / "src" / "mwm" / "config" / "schema" / f"{section}.yaml").read_text())
        raw = yaml.safe_load((root / CI).read_text()).get(section) or {}
        for key, spec in schema.get("properties", {}).items():
            value = raw.get(key, spec.get("default"))
            if spec.get("type") == "integer" and isinstance(value, int):
                return root / CI, _edit_config(root, section, key, value + 1)
    style = root / "src" / "mwm" / "report" / "style.py"
    if style.is_file() and any(d.startswith("src/mwm/report") for d in report["deps"]):
        old = style.read_text()
        new = re.sub(r'("savefig\.dpi":\s*)(\d+)', lambda m: f"{m.group(1)}{int(m.group(2)) + 1}", old, count=1)
        if new != old:
            style.write_text(new)
            return style, old
    return None


@pytest.mark.slow
@needs_tools
def test_plotting_parameter_reruns_only_the_report(ws):
    root, env, stages = ws["root"], ws["env"], ws["stages"]
    report = stage_kind(stages, "figures")
    if report is None:
        pytest.skip("no report stage for the CI config")
    changed = _change_plotting_parameter(root, stages[report])
    if changed is None:
        pytest.skip("found no plotting parameter to change")
    path, old = changed
    try:
        assert changed_stages(root, env) == {report}
        proc = run(["dvc", "repro", "--dry"], root, env)  # bare (test_report_rebuilds... runs it for real)
        assert ran_stages(proc) == [report]
    finally:
        path.write_text(old)
    assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout


@pytest.mark.slow
@needs_tools
def test_snakemake_html_report_from_the_ci_run(ws):
    """`snakemake --report paper_figures/<name>/report.html` builds from the CI run (here the pulled
    one): every figure and table of the report folder is in it with a caption; DVC ignores the file."""
    root, env = ws["root"], ws["env"]
    html_path = root / "paper_figures" / "ci" / "report.html"
    try:
        run(["snakemake", "--configfile", CI, "--report", str(html_path.relative_to(root))], root, env, timeout=600)
        html = html_path.read_text()
        folder = root / "paper_figures" / "ci"
        items = sorted(p.name for p in folder.iterdir() if p.suffix in (".png", ".gif", ".csv"))
        assert any(i.endswith(".png") for i in items) and "ledger.csv" in items
        for item in items:
            key = f'"paper_figures/ci/{item}": {{'
            assert key in html, f"{item} is not in the report"
            entry = html[html.index(key): html.index(key) + 4000]
            caption = re.search(r'"caption": "((?:[^"\\]|\\.)*)"', entry)
            assert caption and len(caption.group(1)) > 80, f"{item} has no caption"
            assert "Uncaptioned" not in caption.group(1), f"{item}: {caption.group(1)[:200]}"
        assert "Paper" in html and "3.3544" in html  # captions say what the paper claimed
        assert all(c in html for c in ('"Studies"', '"Training"', '"Tables"', '"Ledger"'))
        assert "Rebuild of" in html  # the workflow description
        assert "up to date" in run(["dvc", "status", "dvc.yaml"], root, env).stdout  # .dvcignore
    finally:
        html_path.unlink(missing_ok=True)


@needs_tools
def test_sync_says_first_that_the_remote_folder_or_the_lock_file_is_missing(tmp_path, monkeypatch, capsys):
    """`dvc pull` with the default remote's folder missing and no dvc.lock prints "Everything
    is up to date" and then one "checkout failed" per path; sync says why before pulling."""
    from mwm.workflow import dvc as dvcgen

    env = dict(os.environ)
    repo = tmp_path / "repo"
    repo.mkdir()
    run(["dvc", "init", "--no-scm", "-q"], repo, env)
    run(["dvc", "remote", "add", "-d", "local", "../remote"], repo, env)
    pipeline = Path("pipelines") / "x" / "dvc.yaml"
    (repo / pipeline).parent.mkdir(parents=True)
    monkeypatch.chdir(repo)
    (repo / pipeline).write_text("stages:\n  s:\n    cmd: 'true'\n    outs: [results/a]\n")
    monkeypatch.setattr(dvcgen, "config_pipeline", lambda cfg: pipeline)
    ran = []
    monkeypatch.setattr(dvcgen, "_run", lambda cmd: ran.append(cmd) or 0)

    assert dvcgen.sync(["config/x.yaml"]) == 1
    err = capsys.readouterr().err
    assert ran == []  # nothing pulled, nothing touched
    assert "pipelines/x/dvc.lock does not exist" in err
    assert f"the folder of DVC remote 'local', {tmp_path / 'remote'}, does not exist" in err
    assert dvcgen.sync(["config/x.yaml"], remote="elsewhere") == 1
    assert "DVC remote 'elsewhere' is not configured" in capsys.readouterr().err

    (repo / pipeline).with_name("dvc.lock").write_text("schema: '2.0'\n")
    (tmp_path / "remote").mkdir()
    assert dvcgen.pull_problems(pipeline) == []
    assert dvcgen.sync(["config/x.yaml"]) == 1  # pulled, then the missing output is named
    assert ran and ran[0][:2] == ["dvc", "pull"]
    assert "tracked folders of config/x.yaml are missing" in capsys.readouterr().err


@needs_tools
def test_sync_refuses_what_a_damaged_remote_object_checked_out(tmp_path, monkeypatch, capsys):
    """DVC checks out a pulled object without hashing it again (`dvc status` stays clean): sync hashes every
    tracked file against dvc.lock and touches nothing when one differs, naming it."""
    from mwm.workflow import dvc as dvcgen

    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    repo = tmp_path / "repo"
    (repo / "results" / "r" / "seed0").mkdir(parents=True)
    run(["git", "init", "-q"], repo, env)
    run(["dvc", "init", "-q"], repo, env)
    run(["dvc", "remote", "add", "-d", "local", str(tmp_path / "remote")], repo, env)
    (repo / "results" / "r" / "seed0" / "eval.csv").write_text("step,val_loss\n0,4.5\n")
    (repo / "results" / "r" / "summary.json").write_text("{}\n")
    (repo / "dvc.yaml").write_text("stages:\n  runs:\n    cmd: 'true'\n    outs: [{results/r: {persist: true}}]\n")
    run(["dvc", "commit", "-f", "-q", "dvc.yaml"], repo, env)
    run(["dvc", "push", "-q"], repo, env)
    monkeypatch.chdir(repo)
    cache = dvcgen._cache_dir()
    assert dvcgen.pulled_problems(Path("dvc.yaml"), cache) == []
    # the remote's object of eval.csv damaged; a clone without cache pulls it
    victim = Path("results/r/seed0/eval.csv")
    digest = md5(victim)
    obj = next((tmp_path / "remote").rglob(digest[2:]))
    obj.write_text("step,val_loss\n0,9.9\n")
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "results")
    monkeypatch.setattr(dvcgen, "config_pipeline", lambda cfg: Path("dvc.yaml"))
    touched = []
    real_run = dvcgen._run
    monkeypatch.setattr(dvcgen, "_run", lambda cmd: real_run(cmd) if cmd[0] == "dvc" else touched.append(cmd) or 0)
    assert dvcgen.sync(["config/x.yaml"]) == 1
    err = capsys.readouterr().err
    assert f"{victim}: md5 " in err and f"not {digest}" in err and touched == []
    assert "9.9" in victim.read_text()  # what DVC checked out, and its status calls clean
    assert dvcgen.pulled_problems(Path("dvc.yaml"), cache) != []


@needs_tools
def test_applying_an_experiment_loses_no_folder_that_dvc_never_recorded(tmp_path, monkeypatch):
    """`dvc exp apply` checks out every pipeline: another config's folder that no dvc.lock records (built by
    snakemake alone) is deleted, and it exits 255. `python -m mwm.workflow.dvc apply` keeps it, then touches."""
    from mwm.workflow import dvc as dvcgen

    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    repo = tmp_path / "repo"
    (repo / "pipelines" / "other").mkdir(parents=True)
    run(["git", "init", "-q"], repo, env)
    run(["git", "config", "user.email", "t@example.org"], repo, env)
    run(["git", "config", "user.name", "t"], repo, env)
    run(["dvc", "init", "-q"], repo, env)
    (repo / "params.yaml").write_text("x: 1\n")
    (repo / "dvc.yaml").write_text("stages:\n  runs:\n    cmd: mkdir -p results/a && cp params.yaml results/a/p\n"
                                   "    params: [x]\n    outs: [{results/a: {persist: true}}]\n")
    (repo / "pipelines" / "other" / "dvc.yaml").write_text(
        "stages:\n  runs:\n    wdir: ../..\n    cmd: 'true'\n    outs: [{results/b: {persist: true}}]\n")
    (repo / ".gitignore").write_text("/results/\n")
    run(["dvc", "repro", "-q", "dvc.yaml"], repo, env)
    run(["git", "add", "-A"], repo, env)
    run(["git", "commit", "-qm", "base"], repo, env)
    (repo / "results" / "b").mkdir(parents=True)
    (repo / "results" / "b" / "finished.csv").write_text("a finished grid that DVC never recorded\n")
    run(["dvc", "exp", "run", "-q", "dvc.yaml", "-S", "x=2"], repo, env, timeout=300)
    name = run(["dvc", "exp", "list", "--name-only"], repo, env).stdout.split()[0]
    monkeypatch.chdir(repo)
    assert dvcgen.unrecorded_outputs() == [Path("results/b")]
    touched = []
    monkeypatch.setattr(dvcgen, "sync", lambda configs, pull=True, **kw: touched.append((configs, pull)) or 0)
    assert dvcgen.apply_experiment(name, ["config/x.yaml"]) == 0
    assert (repo / "results" / "b" / "finished.csv").is_file()  # plain `dvc exp apply` deletes it
    assert (repo / "params.yaml").read_text() == "x: 2\n" and touched == [(["config/x.yaml"], False)]
    assert not list((repo / ".dvc" / "tmp").glob("mwm-apply-*"))


@pytest.mark.slow
@needs_tools
def test_a_data_folder_linked_out_of_the_repository_is_refused_before_dvc_deletes_it(tmp_path):
    """DVC cannot git-ignore outputs whose folder leads out of the repository and fails after the stage
    ran; the data stage's outputs persist and the workflow refuses the stage first, so the data stays."""
    root = tmp_path / "repo"
    copy_repo(root)
    env = make_env(root)
    init_workspace(root, env)
    scratch = tmp_path / "scratch" / "data"
    scratch.parent.mkdir()
    shutil.move(str(root / "data"), str(scratch))
    (root / "data").symlink_to(scratch, target_is_directory=True)
    stages = yaml.safe_load((root / "pipelines" / "ci" / "dvc.yaml").read_text())["stages"]
    run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", CI, "--", "data"], root, env)
    data_files = files_under(root, out_path(stages["data"]["outs"][0]))
    before = {f: (root / f).stat().st_mtime_ns for f in data_files}

    repro = run(["dvc", "repro", "pipelines/ci/dvc.yaml"], root, env, check=False)
    out = repro.stdout + repro.stderr
    data_stage = f"pipelines/ci/dvc.yaml:{stage_kind(stages, 'data')}"
    assert repro.returncode != 0 and ran_stages(repro) == [data_stage], out[-3000:]
    assert "outside the repository" in out and "nothing was deleted" in out, out[-3000:]
    assert {f: (root / f).stat().st_mtime_ns for f in data_files} == before

    synced = run([sys.executable, "-m", "mwm.workflow.dvc", "sync", "--config", CI], root, env, check=False)
    assert synced.returncode == 1 and "outside the repository" in synced.stderr, synced.stderr[-2000:]
    assert "nothing pulled" in synced.stderr


def test_help_names_the_sync_command(capsys):
    from mwm.workflow import dvc as dvcgen

    with pytest.raises(SystemExit) as exc:
        dvcgen.main(["--help"])
    assert exc.value.code == 0 and "sync" in capsys.readouterr().out


def test_a_cluster_configs_stages_submit_through_its_profile_and_the_others_run_locally():
    """workflow.dvc_profile: `dvc repro` of the paper submits its jobs to SLURM instead of training on the
    machine it runs on (a login node); a config without one runs its jobs where DVC runs."""
    from mwm.config import load_config
    from mwm.workflow import dvc as dvcgen

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        texts = dvcgen.pipelines(dvcgen.all_configs())
        profiles = {c: load_config(c)["workflow"]["dvc_profile"] for c in dvcgen.all_configs()}
    finally:
        os.chdir(cwd)
    assert profiles["config/paper.yaml"] == "slurm" and profiles[CI] is None
    for path, text in texts.items():
        cfg = re.match(r"# DVC pipeline of (\S+):", text).group(1)
        for name, stage in yaml.safe_load(text)["stages"].items():
            want = f"--profile {profiles[cfg]}" if profiles[cfg] else "--cores all"
            assert stage["cmd"].startswith(f"snakemake {want} "), (path, name, stage["cmd"])
            assert ("--cores" in stage["cmd"]) == (profiles[cfg] is None), (path, name)


def test_a_profile_name_that_is_not_a_name_is_refused(tmp_path):
    from mwm.config import ConfigError, load_config

    from mwm.config import read_config

    bad = tmp_path / "bad.yaml"
    raw = read_config(REPO / CI)  # on its scale: the copy lies outside config/
    raw["workflow"]["dvc_profile"] = "../../etc"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="dvc_profile"):
        load_config(bad)


@pytest.mark.slow
@needs_tools
def test_an_experiment_changes_a_param_reruns_and_compares(ws):
    """docs/dvc.md's experiment workflow as typed: change a param with ``dvc exp run -S``, then
    ``dvc exp show`` and ``dvc metrics diff`` put the two runs side by side. Last in the module: it
    changes the shared workspace."""
    root, env = ws["root"], dict(ws["env"])
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-q", "-m", "baseline"], root, env)  # experiments start from a commit
    before = json.loads((root / "paper_figures" / "ci" / "metrics.json").read_text())
    run(["dvc", "exp", "run", "-n", "warm3", "-S", f"{CI}:train.warmup_iters=3"], root, env, timeout=1200)
    assert "warmup_iters: 3" in (root / CI).read_text()
    after = json.loads((root / "paper_figures" / "ci" / "metrics.json").read_text())
    assert after.keys() == before.keys() and after != before  # every variant retrained, with new losses

    shown = json.loads(run(["dvc", "exp", "show", "--json"], root, env).stdout)
    assert "warm3" in json.dumps(shown) and "final_val_loss_mean" in json.dumps(shown)
    diff = json.loads(run(["dvc", "metrics", "diff", "--json"], root, env).stdout)
    changed = diff[next(iter(diff))]
    assert any(k.endswith("final_val_loss_mean") and v["diff"] for k, v in changed.items()), changed

    # keep it as docs/dvc.md says: nothing lost, nothing left for Snakemake to redo
    kept = run([sys.executable, "-m", "mwm.workflow.dvc", "apply", "warm3", "--config", CI], root, env, timeout=600)
    assert "warmup_iters: 3" in (root / CI).read_text(), kept.stdout
    dry = run(["snakemake", "--cores", "1", "--configfile", CI, "-n", "all"], root, env)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
