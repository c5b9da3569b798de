"""envs/*.yaml (conda, for the rules) pin the same versions as pyproject.toml."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = set(data["project"]["dependencies"])
    reqs |= set(data["project"]["optional-dependencies"].get("workflow", []))
    return {r.replace(" ", "") for r in reqs}


def test_every_env_agrees_with_pyproject():
    want = pyproject_requirements()
    envs = sorted((ROOT / "envs").glob("*.yaml"))
    assert envs, "no conda environments under envs/"
    for env in envs:
        spec = yaml.safe_load(env.read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict) and "pip" in d)
        got = {p.replace(" ", "") for p in pip if not p.startswith("-e")}
        assert got == want, f"{env.name}: only in env {sorted(got - want)}, only in pyproject {sorted(want - got)}"
        assert any(p.startswith("-e") for p in pip), f"{env.name} must install the project itself"


def test_rules_use_an_existing_env():
    for smk in (ROOT / "rules").glob("*.smk"):
        for line in smk.read_text().splitlines():
            if line.strip().startswith('"../envs/'):
                assert (ROOT / "rules" / line.strip().strip('",')).resolve().exists(), f"{smk.name}: {line}"
