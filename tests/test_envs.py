"""envs/*.yaml (conda, for the rules) pin the same versions as pyproject.toml."""

import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = set(data["project"]["dependencies"])
    for extra in ("workflow", "loggers"):  # what the rules run (a config may choose a logger)
        reqs |= set(data["project"]["optional-dependencies"].get(extra, []))
    return {r.replace(" ", "") for r in reqs}


def test_every_env_agrees_with_pyproject():
    want = pyproject_requirements()
    envs = sorted((ROOT / "envs").glob("*.yaml"))
    assert envs, "no conda environments under envs/"
    for env in envs:
        spec = yaml.safe_load(env.read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d)
        got = {p.replace(" ", "") for p in pip}
        assert got == want, f"{env.name}: only in env {sorted(got - want)}, only in pyproject {sorted(want - got)}"
        # Snakemake builds the env from a copy of the file elsewhere: nothing relative to its location
        assert not any(p.startswith(("-e", ".", "file:")) or "/" in p for p in pip), env.name


@pytest.mark.slow
def test_every_job_finds_the_package_of_its_checkout_without_installing_it(tmp_path):
    """What --sdm conda relies on: a job's python imports mwm from the checkout's src/ (PYTHONPATH, set
    by the workflow), not from whatever the environment has installed."""
    import os
    import subprocess
    import sys

    from fakedata import repo_copy

    repo = repo_copy(tmp_path / "repo")
    init = repo / "src" / "mwm" / "__init__.py"
    init.write_text(init.read_text() + '\nimport os as _os\nif _os.environ.get("MWM_PROBE"):\n'
                    '    open(_os.environ["MWM_PROBE"], "a").write(__file__ + "\\n")\n')
    probe = tmp_path / "imported.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SNAKEMAKE_PROFILE")}
    env["MWM_PROBE"] = str(probe)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "config/ci.yaml",
                           "--", "data/shakespeare-v256-tail0.1/meta.json"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert probe.read_text().splitlines() == [str(init)]  # the data job's python, from the copy's src/


def test_rules_use_an_existing_env():
    for smk in (ROOT / "rules").glob("*.smk"):
        for line in smk.read_text().splitlines():
            if line.strip().startswith('"../envs/'):
                assert (ROOT / "rules" / line.strip().strip('",')).resolve().exists(), f"{smk.name}: {line}"
