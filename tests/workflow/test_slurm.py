"""The workflow as users run it on a cluster: `snakemake --profile slurm all`.

Dry runs only (a few seconds each): the paper config through the slurm profile
lists the expected jobs with the config's resources, `snakemake --lint` is clean,
and a bad config fails before any job starts, naming the key. The real run through
a SLURM cluster is in .ci/run (scripts/slurm_cluster.sh brings one up).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mwm.config import load_config, read_config
from mwm.config.names import uses_dgram
from mwm.plan.runs import grid_variants

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "config" / "paper.yaml"
CI = ROOT / "config" / "ci.yaml"

_MISSING = [m for m in ("snakemake", "snakemake_executor_plugin_slurm") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"{', '.join(_MISSING)} not installed (pip install -e '.[workflow]')"),
]

# Site settings as a user would export them (rules/common.smk reads them).
SITE_ENV = {"MWM_SLURM_GPU_PARTITION": "gpu-test", "MWM_SLURM_CPU_PARTITION": "cpu-test",
            "MWM_SLURM_ACCOUNT": "proj-test"}
_CLUSTER_ENV = ("MWM_SLURM_STATE", "MWM_SLURM_GPUS", "MWM_SLURM_MIN_JOB_AGE")  # the test cluster's own


def snakemake(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`snakemake ARGS` from the repository root (where `--profile slurm` is found)."""
    full_env = {k: v for k, v in os.environ.items()
                if k != "SNAKEMAKE_PROFILE" and (not k.startswith("MWM_SLURM_") or k in _CLUSTER_ENV)}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def parse_dry_run(text: str) -> list[dict]:
    """The jobs of a dry run's output: rule, wildcards, threads, resources (ints where they are)."""
    jobs = []
    job = None
    for line in text.splitlines():
        m = re.match(r"^(?:local)?rule (\S+):$", line)
        if m:
            job = {"rule": m.group(1), "wildcards": {}, "threads": 1, "resources": {}}
            jobs.append(job)
            continue
        if job is None or not line.startswith("    "):
            if not line.startswith("    "):
                job = None
            continue
        key, _, value = line.strip().partition(": ")
        if key == "wildcards":
            job["wildcards"] = dict(item.split("=", 1) for item in value.split(", "))
        elif key == "threads":
            job["threads"] = int(value)
        elif key == "resources":
            for item in value.split(", "):
                name, _, v = item.partition("=")
                job["resources"][name] = int(v) if v.isdigit() else v
    return jobs


def parse_job_stats(text: str) -> Counter:
    m = re.search(r"^Job stats:\njob +count\n[- ]+\n(.*?)^total +(\d+)", text, re.S | re.M)
    assert m, f"no job stats in the dry run:\n{text[-3000:]}"
    counts = Counter()
    for line in m.group(1).strip().splitlines():
        rule, n = line.split()
        counts[rule] = int(n)
    assert sum(counts.values()) == int(m.group(2))
    return counts


@pytest.fixture(scope="module")
def paper_dry_run():
    # --forceall: every job, whatever is already on disk; --cores: a dry run otherwise
    # caps threads at 1 (on the cluster nothing caps them).
    proc = snakemake("--profile", "slurm", "--dry-run", "--forceall", "--nolock", "--cores", "1024", "all",
                     env=SITE_ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def test_slurm_profile_settings():
    prof = yaml.safe_load((ROOT / "slurm" / "config.v8+.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["configfile"] == "config/paper.yaml"
    assert prof["slurm-status-command"] == "squeue"  # no slurmdbd needed
    assert prof["rerun-incomplete"] is True
    assert isinstance(prof["retries"], int) and prof["retries"] >= 1
    assert prof["jobs"] >= 1
    text = (ROOT / "slurm" / "config.v8+.yaml").read_text()
    # site names come from the environment, never from the profile
    for key in ("slurm_partition", "slurm_account", "default-resources", "--gres", "slurm_extra"):
        assert not re.search(rf"^[^#]*{re.escape(key)}", text, re.M), key
    local = yaml.safe_load((ROOT / "local" / "config.v8+.yaml").read_text())
    assert "executor" not in local and local["cores"] and local["rerun-incomplete"] is True


def _train_extras(*args):
    proc = snakemake("all", "--profile", "slurm", "--configfile", "config/ci.yaml", "--dry-run", "--forceall",
                     "--nolock", *args, env=SITE_ENV)
    jobs = parse_dry_run(proc.stdout + proc.stderr) if proc.returncode == 0 else []
    return proc, {j["resources"].get("slurm_extra") for j in jobs if j["rule"] == "train"}


def test_a_site_slurm_extra_keeps_the_warning_signal():
    """The site's --default-resources slurm_extra reaches the training jobs with the signal added;
    a --set-resources train:slurm_extra that would drop it is refused in one message."""
    proc, extras = _train_extras("--default-resources", "slurm_extra=--exclusive")
    assert proc.returncode == 0 and extras == {"--exclusive --signal=USR1@300"}, proc.stderr[-2000:]
    proc, extras = _train_extras("--set-resources", "train:slurm_extra='--exclusive --signal=USR1@600'")
    assert proc.returncode == 0 and extras == {"--exclusive --signal=USR1@600"}, proc.stderr[-2000:]
    proc, _ = _train_extras("--set-resources", "train:slurm_extra=--exclusive")
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "--set-resources train:slurm_extra=--exclusive replaces the training jobs' --signal=USR1@300" in said, said
    assert "train:slurm_extra='--exclusive --signal=USR1@300'" in said


def test_paper_dry_run_lists_the_grid_with_resources(paper_dry_run):
    cfg = load_config(PAPER)
    res = cfg["workflow"]["resources"]
    grid = cfg["grid"]
    jobs = parse_dry_run(paper_dry_run)
    stats = parse_job_stats(paper_dry_run)
    assert "Config file(s): [PosixPath('" + str(PAPER) + "')]" in paper_dry_run

    # the grid: the five assignments x 3 seeds, plus the colnorm retraction ablation
    # of the DGram-using assignments (grid.retraction_ablation)
    assert grid["assignments"] == ["none", "stiefel", "dgram", "hetero", "hetero-inv"]
    assert grid["seeds"] == [0, 1, 2] and grid["retraction_ablation"] is True
    ablation = [f"{a}-colnorm" for a in grid["assignments"] if uses_dgram(a)]
    assert ablation == ["dgram-colnorm", "hetero-colnorm", "hetero-inv-colnorm"]
    assert sorted(grid_variants(grid)) == sorted(grid["assignments"] + ablation)
    expected = {(v, str(s)) for v in grid["assignments"] + ablation for s in grid["seeds"]}

    train = [j for j in jobs if j["rule"] == "train"]
    assert len(train) == stats["train"] == 15 + 9
    assert {(j["wildcards"]["variant"], j["wildcards"]["seed"]) for j in train} == expected
    for j in train:
        r = j["resources"]
        assert r["gpu"] == res["train"]["gpu"] == 1, j
        assert r["mem_mb"] == res["train"]["mem_mb"] and r["runtime"] == res["train"]["runtime"], j
        assert j["threads"] == res["train"]["threads"], j

    (prep,) = [j for j in jobs if j["rule"] == "prepare_data"]
    assert stats["prepare_data"] == 1
    assert prep["resources"]["mem_mb"] == res["data"]["mem_mb"]
    assert prep["resources"]["runtime"] == res["data"]["runtime"]
    assert prep["threads"] == res["data"]["threads"]
    assert "gpu" not in prep["resources"]  # gpu only when the stage asks for one

    # the studies (one job each) and the report, with their stages' resources
    stage_of = {"prepare_data": "data", "train": "train", "report": "report",
                "study_alpha": "study", "study_absorption": "study", "study_audits": "study",
                "study_solvers": "study"}
    assert {rule: n for rule, n in stats.items() if rule != "all"} == {
        "prepare_data": 1, "train": 24, "study_alpha": 1, "study_absorption": 1, "study_audits": 1,
        "study_solvers": 1, "report": 1}
    for j in jobs:
        if j["rule"] == "all":
            continue
        r, want = j["resources"], res[stage_of[j["rule"]]]
        assert (r["mem_mb"], r["runtime"], r.get("gpu", 0), j["threads"]) == (
            want["mem_mb"], want["runtime"], want["gpu"], want["threads"]), j

    # every job that is submitted (all but the target rule) carries the site settings of its kind
    # (GPU or CPU) from the environment
    submitted = [j for j in jobs if j["rule"] != "all"]
    assert len(submitted) == sum(n for rule, n in stats.items() if rule != "all")
    kinds = set()
    for j in submitted:
        r = j["resources"]
        kind = "GPU" if r.get("gpu", 0) else "CPU"
        kinds.add(kind)
        assert r["slurm_partition"] == SITE_ENV[f"MWM_SLURM_{kind}_PARTITION"], j
        assert r["slurm_account"] == SITE_ENV["MWM_SLURM_ACCOUNT"], j
    assert kinds == {"GPU", "CPU"}  # training on the GPU partition, tokenization and the report not


def test_configfile_on_the_command_line_replaces_the_profiles():
    """What CI does: the same profile with the reduced config (and no site settings)."""
    proc = snakemake("--profile", "slurm", "--configfile", str(CI), "--dry-run", "--forceall", "--nolock", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Config file(s): [PosixPath('" + str(CI) + "')]" in out
    jobs = parse_dry_run(out)
    cfg = load_config(CI)
    train = [j for j in jobs if j["rule"] == "train"]
    assert len(train) == len(grid_variants(cfg["grid"])) * len(cfg["grid"]["seeds"])
    assert "results/runs/ci/" in out and "results/runs/paper/" not in out
    for j in jobs:
        assert "slurm_partition" not in j["resources"] and "slurm_account" not in j["resources"], j


def test_a_solver_report_config_runs_the_solver_study_alone():
    """config/widths.yaml (workflow.report: solvers): `all` is the data, the solver study
    (its own capture trainings inside) and a report of it; no training job, no other study."""
    widths = ROOT / "config" / "widths.yaml"
    assert load_config(widths)["workflow"]["report"] == "solvers"
    proc = snakemake("--profile", "slurm", "--configfile", str(widths), "--dry-run", "--forceall", "--nolock", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert parse_job_stats(out) == Counter(prepare_data=1, study_solvers=1, report=1, all=1)
    report = next(j for j in parse_dry_run(out) if j["rule"] == "report")
    assert report["resources"]["runtime"] == load_config(widths)["workflow"]["resources"]["report"]["runtime"]


def test_lint_is_clean():
    proc = snakemake("--profile", "slurm", "--lint", "--nolock")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Congratulations, your workflow is in a good condition!" in out


BAD_CONFIGS = {
    # case: (edit of config/ci.yaml, text the error must contain)
    "unknown assignment": (lambda c: c["grid"].update(assignments=["none", "stiefle"]),
                           ["grid.assignments", "stiefle"]),
    "negative lr": (lambda c: c["train"].update(learning_rate=-1e-3), ["train.learning_rate", "-0.001"]),
    "unknown key": (lambda c: c["train"].update(learning_rat=1e-3), ["train", "learning_rat"]),
    "missing value": (lambda c: c["workflow"]["resources"]["train"].update(mem_mb=None),
                      ["workflow.resources.train.mem_mb", "None is not of type"]),
    "unknown section": (lambda c: c.update(optimiser={"lr": 1}), ["optimiser"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_error_fails_before_any_job(case, tmp_path):
    edit, needles = BAD_CONFIGS[case]
    cfg = read_config(CI)  # on its scale: the copy lies outside config/
    name = "badcfg-" + re.sub(r"\W", "", case)
    cfg["name"] = name
    edit(cfg)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = snakemake("--profile", "slurm", "--configfile", str(path), "--dry-run", "--nolock", "all", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    if case != "unknown assignment":  # check_grid's message names the key, not the file
        assert str(path) in out, out[-3000:]
    for needle in needles:
        assert needle in out, f"{needle!r} not in:\n{out[-3000:]}"
    # nothing was planned, submitted or written
    assert "Job stats" not in out and "rule train" not in out and "Building DAG" not in out
    assert not (ROOT / "logs" / name).exists() and not (ROOT / "results" / "runs" / name).exists()


def test_cluster_script_parses_and_refuses_unknown_commands():
    script = ROOT / "scripts" / "slurm_cluster.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script), "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2 and "start|stop|status" in proc.stderr


def test_the_data_job_runs_on_the_submit_host_where_a_config_says_so():
    """workflow.data_on_submit_host (the OpenWebText configs): the download and tokenization run where
    Snakemake runs, for clusters whose compute nodes are offline; other configs submit it."""
    script = (
        "import sys\nfrom pathlib import Path\nfrom snakemake.api import SnakemakeApi\n"
        "from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings\n"
        "with SnakemakeApi(OutputSettings(quiet=None)) as api:\n"
        "    wf = api.workflow(resource_settings=ResourceSettings(cores=1), storage_settings=StorageSettings(),\n"
        "                      config_settings=ConfigSettings(configfiles=[Path(sys.argv[1])]),\n"
        "                      snakefile=Path('Snakefile'), workdir=Path('.'))\n"
        "    print(sorted(wf._workflow._localrules))\n")
    for config, local in (("config/paper.yaml", True), ("config/ci.yaml", False)):
        assert load_config(ROOT / config)["workflow"]["data_on_submit_host"] is local
        env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
        proc = subprocess.run([sys.executable, "-c", script, config], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rules = proc.stdout.strip().splitlines()[-1]
        assert ("'prepare_data'" in rules) is local, (config, rules)
        assert "'set_aside_foreign_run'" in rules  # the workflow's own local rule, for comparison


def _cluster_up() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _cluster_up(), reason="no SLURM cluster here (bash scripts/slurm_cluster.sh start)")
def test_the_warning_signal_before_the_time_limit_checkpoints_and_the_retry_resumes(tmp_path):
    """On a real scheduler: a training job whose time limit is too short for the run gets SIGUSR1
    (workflow.warning_signal_s) while it trains, checkpoints there (its only checkpoint: the interval is
    past the run), exits 75, and Snakemake's retry resumes from it to a completed run with every step
    once. About 3 minutes, so .ci/run (30 minutes in all) does not run it; it runs wherever a cluster
    is up (bash scripts/slurm_cluster.sh start)."""
    import test_workflow_runs as W
    from fakedata import repo_copy

    repo = repo_copy(tmp_path / "repo")
    cfg = yaml.safe_load(yaml.safe_dump(W.BASE))
    cfg["name"] = "warned"
    cfg["train"].update({"max_iters": 30000, "lr_decay_iters": 30000, "eval_interval": 10000,
                         "checkpoint_interval": 10 ** 6, "log_interval": 1000})
    cfg["grid"] = {"assignments": ["none"], "seeds": [0]}
    cfg["workflow"].update({"retries": 2, "warning_signal_s": 90})
    cfg["workflow"]["resources"]["train"] = {"threads": 1, "mem_mb": 500, "runtime": 3}
    (repo / "config" / "warned.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE" and not k.startswith("MWM_SLURM_")}
    env.update(PYTHONPATH=str(repo / "src"), MWM_SLURM_PARTITION="debug")
    run = "results/runs/warned/none/seed0/summary.json"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", str(ROOT / "slurm"), "--configfile", "config/warned.yaml",
         "--jobs", "1", "--latency-wait", "10", "--slurm-init-seconds-before-status-checks", "2",
         "--seconds-between-status-checks", "2", "--", run],
        cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # one SLURM job: the warning came inside it, and the job's own snakemake (which ignores it) retried
    # the run there; without the warning the job would time out and a second one be submitted
    assert len(re.findall(r"has been submitted with SLURM jobid \d+ \(log: \S*rule_train", out)) == 1, out[-4000:]
    log = (repo / "logs" / "warned" / "train" / "none" / "seed0.log").read_text()
    m = re.search(r"resumed from \S+ at step (\d+)", log)
    assert m and 0 < int(m.group(1)) < 30000, log[-3000:]
    summary = yaml.safe_load((repo / run).read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == 30000
    steps = [line.split(",")[0] for line in (repo / run).with_name("metrics.csv").read_text().splitlines()[1:]]
    assert steps == [str(i) for i in range(30000)]
