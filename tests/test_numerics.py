"""The numerics version: what a run records, how an old run is read, and the history's bookkeeping."""

import re
import subprocess
from pathlib import Path

import pytest

from mwm import numerics
from mwm.numerics import HISTORY, VERSION, commit_of, recorded_version, version_problem
from mwm.plan.runs import identity_problem, run_identity

ROOT = Path(__file__).resolve().parents[1]


def test_commit_of_reads_git_describe_forms():
    assert commit_of("0.1.0+be30d1d") == ("be30d1d", False)
    assert commit_of("0.1.0+be30d1d-dirty") == ("be30d1d", True)
    assert commit_of("0.1.0+v0.1-5-gabc1234") == ("abc1234", False)
    assert commit_of("0.1.0") is None and commit_of(None) is None


def test_a_recorded_version_is_read_from_the_identity():
    assert recorded_version({"identity": {"numerics": VERSION}}) == VERSION
    assert recorded_version({"identity": {"numerics": 1}, "code_version": "0.1.0+abcdef1"}) == 1
    assert recorded_version({"identity": {"numerics": "3"}}) is None  # not an integer: unknown
    assert recorded_version({"identity": {"numerics": True}}) is None


def test_an_unversioned_run_is_version_one_only_when_a_clean_commit_predates_the_first_change(monkeypatch):
    seen = []

    def fake(commit):
        seen.append(commit)
        return commit == "aaaaaaa"

    monkeypatch.setattr(numerics, "_predates_first_change", fake)
    assert recorded_version({"identity": {}, "code_version": "0.1.0+aaaaaaa"}) == 1
    assert recorded_version({"identity": {}, "code_version": "0.1.0+bbbbbbb"}) is None
    assert recorded_version({"identity": {}, "code_version": "0.1.0+aaaaaaa-dirty"}) is None
    assert recorded_version({"identity": {}}) is None
    assert seen == ["aaaaaaa", "bbbbbbb"]  # a dirty tree is unknown without asking git


def test_git_places_this_repository_s_commits_around_the_first_change():
    def known(commit):
        return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                              capture_output=True).returncode == 0

    first = numerics.FIRST_VERSIONED
    if not (known(first) and known(f"{first}^")):
        pytest.skip("this checkout has no history back to the first versioned change")
    parent = subprocess.run(["git", "rev-parse", "--short", f"{first}^"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    assert recorded_version({"identity": {}, "code_version": f"0.1.0+{parent}"}) == 1
    assert recorded_version({"identity": {}, "code_version": f"0.1.0+{first}"}) is None


def test_version_problem_names_both_versions_in_one_line():
    assert version_problem({"identity": {"numerics": VERSION}}) is None
    old = version_problem({"identity": {"numerics": VERSION - 1}})
    assert f"numerics version {VERSION - 1}" in old and f"this code's is {VERSION}" in old and "\n" not in old
    unknown = version_problem({"identity": {}, "code_version": "0.1.0+abc1234-dirty"})
    assert "unknown numerics" in unknown and "abc1234-dirty" in unknown
    assert "neither a numerics version nor its code" in version_problem({"identity": {}})


def test_a_run_of_other_numerics_is_not_the_config_s_run():
    run_cfg = {"model": {"n_layer": 2}, "train": {"muon_lr": 0.02}, "data": {"corpus": "shakespeare"}}
    own = run_identity(run_cfg, "dgram", 0, "paper")
    assert own["numerics"] == VERSION
    assert identity_problem({"identity": own}, own) is None
    old = dict(own, numerics=VERSION - 1)
    msg = identity_problem({"identity": old}, own)
    assert msg.startswith(f"made with numerics version {VERSION - 1}")
    before = {k: v for k, v in own.items() if k != "numerics"}  # a summary from before versions
    assert "unknown numerics" in identity_problem({"identity": before, "code_version": "0.1.0+abc1234-dirty"}, own)


def test_the_history_has_every_version_once_and_findings_lists_it():
    assert [c.version for c in HISTORY] == list(range(1, VERSION + 1))
    assert all(c.what and c.affects for c in HISTORY)
    assert all(c.commits for c in HISTORY[1:]), "every versioned change names its commits"
    text = (ROOT / "docs" / "findings.md").read_text()
    section = text.split("## Numerics changes", 1)[1].split("\n## ", 1)[0]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| ([^|]*) \|", section, re.M)}
    assert sorted(rows) == [c.version for c in HISTORY]
    for c in HISTORY:
        assert all(commit in rows[c.version] for commit in c.commits), (c.version, rows[c.version])
