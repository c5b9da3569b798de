"""mwm.workflow.publish: publish, restore and compare a config's records, on a fabricated results tree
(runs whose summaries carry the config's own identities; no training)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from mwm.config import load_config
from mwm.data.spec import dataset_dir
from mwm.numerics import VERSION
from mwm.plan.runs import Plan
from mwm.workflow import publish as pub
from mwm.workflow.compare import compare_config, compare_text
from mwm.workflow.records import BUDGET_BYTES, MANIFEST, RecordError, published_dir, verify

GRID = {"assignments": ["none", "stiefel"], "seeds": [0, 1]}
SPLITS = {"train": {"sha256": "a" * 64}, "val": {"sha256": "b" * 64}}


@pytest.fixture()
def ws(tmp_path, monkeypatch, tiny_config):
    """A checkout-like folder: a tiny config (two assignments, two seeds, a report of runs alone) and its data."""
    monkeypatch.chdir(tmp_path)
    cfg_file = tiny_config("tiny.yaml", folder=tmp_path / "config", grid=GRID, workflow={"report": "sweep"})
    cfg_file = os.path.relpath(cfg_file, tmp_path)
    cfg = load_config(cfg_file)
    data = dataset_dir(cfg["data"])
    data.mkdir(parents=True)
    (data / "meta.json").write_text(json.dumps({"splits": SPLITS}))
    return cfg_file, cfg


def fake_run(plan: Plan, variant: str, seed: int, loss: float = 4.25, step_time: float = 0.1, steps: int = 3,
             status: str = "completed", identity: dict | None = None) -> Path:
    d = plan.run(variant, seed).dir
    (d / "spectra").mkdir(parents=True, exist_ok=True)
    ident = identity or plan.identity(variant, seed)
    summary = {"identity": ident, "status": status, "steps_done": steps, "final_val_loss": loss,
               "mean_step_time": step_time, "code_version": "0.1.0+abc1234", "config_hash": "x"}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.csv").write_text("step,train_loss,step_time\n" + "".join(
        f"{s},{5.0 - s * 0.1 + loss / 1000:.6f},{step_time + s / 100}\n" for s in range(steps)))
    (d / "eval.csv").write_text(f"step,train_loss,val_loss\n0,5.0,{loss + 0.5}\n{steps},4.5,{loss}\n")
    for f in ("spectral.csv", "attention.csv", "solver.csv"):
        (d / f).write_text(f"step,layer,value\n0,0,{loss / 3:.6f}\n")
    np.savez(d / "spectra" / "step_000000.npz", sv=np.linspace(1, 2, 4) * loss)
    return d


def all_runs(plan: Plan, **kw) -> None:
    for v in plan.variants:
        for s in plan.seeds:
            fake_run(plan, v, s, **kw)


def test_publish_writes_hashed_records_and_restore_puts_them_back(ws):
    cfg_file, cfg = ws
    plan = Plan(cfg)
    all_runs(plan)
    rep = pub.publish(cfg, cfg_file)
    dest = published_dir("tiny")
    man = verify(dest)
    assert sorted(man["runs"]) == ["none/seed0", "none/seed1", "stiefel/seed0", "stiefel/seed1"]
    assert man["numerics"] == VERSION and man["data"] == {k: v["sha256"] for k, v in SPLITS.items()}
    assert rep["runs"] and len(man["slices"]) == 1 and man["slices"][0]["machine"]["cpu"]
    assert "runs/none/seed0/spectra/step_000000.npz" in man["files"]
    # a fresh machine: no results at all
    before = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    os.rename("results", "old-results")
    out = pub.restore(cfg, cfg_file)
    assert sorted(out["restored"]) == sorted(man["runs"]) and not out["refused"]
    for key in man["runs"]:
        for f in ("summary.json", "metrics.csv", "spectra/step_000000.npz"):
            restored, made = Path("results/runs/tiny") / key / f, Path("old-results/runs/tiny") / key / f
            assert restored.read_bytes() == made.read_bytes()
    assert {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    # restored runs are newer than their data (Snakemake's test), and a second restore finds them present
    data_time = (dataset_dir(cfg["data"]) / "meta.json").stat().st_mtime
    assert all(p.stat().st_mtime > data_time for p in Path("results/runs/tiny").rglob("*.csv"))
    again = pub.restore(cfg, cfg_file)
    assert not again["restored"] and len(again["present"]) == 4


@pytest.mark.parametrize("damage", ["edit", "delete", "add"])
def test_a_damaged_record_is_refused_by_name_and_nothing_written(ws, damage, capsys):
    cfg_file, cfg = ws
    all_runs(Plan(cfg))
    pub.publish(cfg, cfg_file)
    os.rename("results", "old-results")
    target = published_dir("tiny") / "runs/stiefel/seed1/eval.csv"
    if damage == "edit":  # one digit of one number
        target.write_text(target.read_text().replace("4.25", "4.26"))
    elif damage == "delete":
        target.unlink()
    else:
        (target.parent / "extra.csv").write_text("x\n1\n")
    assert pub.main(["restore", "--config", cfg_file]) == 1
    err = capsys.readouterr().err
    named = target.parent / "extra.csv" if damage == "add" else target
    assert str(named) in err
    assert not Path("results").exists()


def test_a_record_of_other_settings_or_numerics_is_never_restored_as_the_configs(ws, tiny_config):
    cfg_file, cfg = ws
    all_runs(Plan(cfg))
    pub.publish(cfg, cfg_file)
    os.rename("results", "old-results")
    # the config edited since: every run's identity differs, so none is restored
    tiny_config("tiny.yaml", folder=Path("config").resolve(), grid=GRID, workflow={"report": "sweep"},
                train__learning_rate=0.002)
    edited = load_config(cfg_file)
    out = pub.restore(edited, cfg_file)
    assert not out["restored"] and len(out["refused"]) == 4
    assert all("learning_rate" in r for r in out["refused"])
    assert not any(Path("results/runs/tiny").glob("*/seed*/summary.json"))
    # records of another numerics version: refused whole
    man_path = published_dir("tiny") / MANIFEST
    man = json.loads(man_path.read_text())
    man["numerics"] = VERSION - 1
    man_path.write_text(json.dumps(man))
    with pytest.raises(RecordError, match=f"numerics version {VERSION - 1}"):
        pub.restore(cfg, cfg_file)


def test_publish_in_slices_extends_and_keeps_unfinished_runs_out(ws):
    cfg_file, cfg = ws
    plan = Plan(cfg)
    fake_run(plan, "none", 0)
    fake_run(plan, "stiefel", 0, status="running")  # not finished
    first = pub.publish(cfg, cfg_file)
    assert first["runs"] == ["none/seed0"]
    assert any(s.startswith("stiefel/seed0") for s in first["skipped"])
    fake_run(plan, "stiefel", 0)
    fake_run(plan, "none", 1)
    second = pub.publish(cfg, cfg_file)
    assert sorted(second["runs"]) == ["none/seed1", "stiefel/seed0"]
    man = verify(published_dir("tiny"))
    assert len(man["slices"]) == 2 and man["runs"]["none/seed0"]["slice"] == 1
    assert pub.publish(cfg, cfg_file)["runs"] == []  # nothing new: no third slice
    assert len(verify(published_dir("tiny"))["slices"]) == 2
    # a published run retrained with other numbers: refused, nothing written
    fake_run(plan, "none", 0, loss=4.3)
    with pytest.raises(RecordError, match="differs"):
        pub.publish(cfg, cfg_file)
    assert len(verify(published_dir("tiny"))["slices"]) == 2
    # ... unless asked to replace it
    rep = pub.publish(cfg, cfg_file, replace=True)
    man = verify(published_dir("tiny"))
    assert rep["runs"] == ["none/seed0"] and man["runs"]["none/seed0"]["final_val_loss"] == 4.3
    assert json.loads((published_dir("tiny") / "runs/none/seed0/summary.json").read_text())["final_val_loss"] == 4.3


def test_records_of_an_edited_config_are_refused_then_dropped_on_request(ws, tiny_config):
    cfg_file, cfg = ws
    all_runs(Plan(cfg))
    pub.publish(cfg, cfg_file)
    tiny_config("tiny.yaml", folder=Path("config").resolve(), grid=GRID, workflow={"report": "sweep"},
                train__learning_rate=0.002)
    edited = load_config(cfg_file)
    with pytest.raises(RecordError, match="not the config's own now"):
        pub.publish(edited, cfg_file)  # never a folder of two settings
    all_runs(Plan(edited))  # retrained at the new setting
    rep = pub.publish(edited, cfg_file, replace=True)
    man = verify(published_dir("tiny"))
    assert len(rep["replaced"]) == 4 and sorted(rep["runs"]) == sorted(man["runs"]) and len(man["runs"]) == 4
    assert all(json.loads((published_dir("tiny") / "runs" / k / "summary.json").read_text())["identity"]["train"]
               ["learning_rate"] == 0.002 for k in man["runs"])


def test_publish_refuses_a_folder_over_the_budget(ws, monkeypatch):
    cfg_file, cfg = ws
    all_runs(Plan(cfg))
    monkeypatch.setattr(pub, "BUDGET_BYTES", 100)
    with pytest.raises(RecordError, match="over the"):
        pub.publish(cfg, cfg_file)
    assert not published_dir("tiny").exists()
    assert BUDGET_BYTES == 15_000_000


def test_restore_never_overwrites_a_run_that_is_there(ws):
    cfg_file, cfg = ws
    plan = Plan(cfg)
    all_runs(plan)
    pub.publish(cfg, cfg_file)
    fake_run(plan, "none", 1, loss=9.0)  # a different run of the same identity, here already
    out = pub.restore(cfg, cfg_file)
    assert any(k.startswith("none/seed1") for k in out["kept"])
    assert json.loads((plan.run("none", 1).dir / "summary.json").read_text())["final_val_loss"] == 9.0


def test_compare_tells_restored_copies_rounding_and_moved_numbers(ws):
    cfg_file, cfg = ws
    plan = Plan(cfg)
    all_runs(plan)
    pub.publish(cfg, cfg_file)
    folder = published_dir("tiny")

    def verdict():
        buf = io.StringIO()
        rc = compare_config(cfg, folder, "results", "paper_figures", out=buf)
        return rc, buf.getvalue()

    rc, text = verdict()  # results/ are the published files themselves
    assert rc == 2 and "restored, not rebuilt" in text
    all_runs(plan, step_time=0.2)  # a rebuild: other step times, the same numbers
    rc, text = verdict()
    assert rc == 0 and "bit for bit" in text
    all_runs(plan, step_time=0.2, loss=4.25 * (1 + 1e-5))  # float rounding of another CPU kind
    rc, text = verdict()
    assert rc == 0 and "within float rounding" in text
    fake_run(plan, "stiefel", 1, step_time=0.2, loss=4.4)
    rc, text = verdict()
    assert rc == 1 and "NOT REPRODUCED" in text and "stiefel/seed1/summary.json: final_val_loss published 4.25" in text


def test_compare_text_reads_csv_and_json_and_ignores_wall_clock():
    assert compare_text("a.csv", "step,loss,step_time\n0,1.5,0.1\n", "step,loss,step_time\n0,1.5,9.9\n").identical
    moved = compare_text("a.csv", "step,loss\n0,1.5\n", "step,loss\n0,1.6\n")
    assert moved.moved == [("line 2, loss", "1.5", "1.6")]
    assert compare_text("a.csv", "step,loss\n0,1.5\n", "step,loss\n0,1.5\n1,1.4\n").moved  # a row more
    j = compare_text("s.json", json.dumps({"status": "completed", "wall_seconds": 3, "x": [1.0, 2.0]}),
                     json.dumps({"status": "unstable", "wall_seconds": 9, "x": [1.0, 2.0]}))
    assert j.moved == [("status", "completed", "unstable")]
    ledger = "id,paper,rebuilt,verdict\ncost.step,1,2,x\nval.hetero,3.35,3.4,reproduced\n"
    changed = compare_text("figures/ledger.csv", ledger, ledger.replace("cost.step,1,2", "cost.step,1,7")
                           .replace("3.4,reproduced", "3.4,not reproduced"))
    assert changed.moved == [("row val.hetero, verdict", "reproduced", "not reproduced")]


def test_cli_help_and_bad_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        pub.main(["--help"])
    assert exc.value.code == 0 and "restore" in capsys.readouterr().out
    assert pub.main(["restore", "--config", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert pub.main(["verify", "--config", str(tmp_path / "none.yaml")]) == 2


# --- the checkout's own published configs -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted(p.parent.name for p in (ROOT / "published").glob(f"*/{MANIFEST}"))


def _job_counts(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table of a dry run: {rule: count}."""
    counts, table = {}, False
    for line in text.splitlines():
        if line.startswith("Job stats"):
            table = True
        elif table and line.strip() and not line.startswith(("job", "---", "total")):
            rule, n = line.split()
            counts[rule] = int(n)
        elif table and not line.strip() and counts:
            break
    return counts


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_config_is_intact_and_of_this_codes_numerics(name):
    """A numerics change makes every published number stale: publish the config anew (or remove it)."""
    man = verify(ROOT / "published" / name)
    assert man["numerics"] == VERSION, (f"published/{name} was made with numerics version {man['numerics']}, this "
                                        f"code is {VERSION}: rerun the config and publish it anew")
    assert (ROOT / man["config"]).is_file() and load_config(ROOT / man["config"])["name"] == name


@pytest.mark.slow
@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_config_rebuilds_its_figures_and_verdicts_without_training(tmp_path, name):
    import fakedata

    if not fakedata.HAS_SNAKEMAKE:
        pytest.skip("snakemake is not installed")
    repo = fakedata.repo_copy(tmp_path / "repo")
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "published" / name, repo / "published" / name)
    man = verify(repo / "published" / name)
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=600)

    restored = run("mwm.workflow.publish", "restore", "--config", man["config"])
    assert restored.returncode == 0, restored.stdout + restored.stderr
    dry = fakedata.snakemake_in(repo, "--cores", "2", "--configfile", man["config"], "-n", "all")
    jobs = _job_counts(dry.stdout + dry.stderr)
    assert dry.returncode == 0 and "train" not in jobs and "prepare_data" not in jobs, dry.stdout + dry.stderr
    assert not any(j.startswith("study_") for j in jobs) or not man.get("studies"), jobs
    report = run("mwm.report", "--config", man["config"])
    assert report.returncode == 0, report.stdout + report.stderr
    if "figures/ledger.csv" in man["files"]:
        import csv

        def verdicts(path):
            with open(path, newline="") as fh:
                return {r["id"]: r["verdict"] for r in csv.DictReader(fh) if not r["id"].startswith("cost.")}

        assert verdicts(repo / "paper_figures" / name / "ledger.csv") == \
            verdicts(repo / "published" / name / "figures" / "ledger.csv")


@pytest.mark.slow
def test_restored_runs_are_planned_as_done_and_retrained_after_a_config_edit(tmp_path):
    """In a checkout that has no Snakemake records (a fresh clone that restored): the restored runs are done,
    and once the config changes they are set aside and retrained, as where they were trained."""
    import subprocess
    import sys

    import fakedata

    if not fakedata.HAS_SNAKEMAKE:
        pytest.skip("snakemake is not installed")
    repo = fakedata.repo_copy(tmp_path / "repo")
    cfg_file = "config/ci.yaml"
    cfg = load_config(repo / cfg_file)
    plan = Plan(cfg, repo / "results")
    for v in plan.variants:
        for s in plan.seeds:
            fake_run(plan, v, s)
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "mwm.workflow.publish", *args, "--config", cfg_file], cwd=repo,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("publish")
    import shutil

    shutil.rmtree(repo / "results")
    assert "restored" in run("restore")  # prepares the data first: a fresh clone has none

    def jobs():
        dry = fakedata.snakemake_in(repo, "--cores", "2", "--configfile", cfg_file, "-n", "runs")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        return _job_counts(dry.stdout + dry.stderr)

    runs = len(plan.variants) * len(plan.seeds)
    assert "train" not in jobs()
    scale = repo / "config" / "scales" / "ci.yaml"  # the config's own scale: an edit there is an edit of it
    assert "extends: scales/ci.yaml" in (repo / cfg_file).read_text() and "eval_iters: 2" in scale.read_text()
    scale.write_text(scale.read_text().replace("eval_iters: 2", "eval_iters: 3"))
    after = jobs()
    assert after.get("set_aside_foreign_run") == runs and after.get("train") == runs, after
