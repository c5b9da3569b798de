"""mwm.plan.runs: a run's identity, and how a summary is compared with the config's own run."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from mwm.config import config_hash, load_config
from mwm.plan.runs import config_run_identity, expected_identity, identity_diff, identity_problem


def _cfg(tiny_config, **over):
    return load_config(tiny_config(**over))


def test_expected_identity_merges_train_overrides_and_reads_the_retraction_from_the_variant(tiny_config):
    cfg = _cfg(tiny_config, grid__assignments=["dgram", "none"],
               grid__train_overrides={"dgram": {"learning_rate": 0.5}})
    ident = expected_identity(cfg, "dgram-colnorm", 1)
    assert ident["train"]["learning_rate"] == 0.5 and ident["retraction"] == "colnorm" and ident["seed"] == 1
    assert expected_identity(cfg, "dgram", 1)["retraction"] == cfg["train"]["dgram_retraction"]
    assert expected_identity(cfg, "none", 0)["train"]["learning_rate"] == cfg["train"]["learning_rate"]
    assert config_run_identity(cfg, "dgram", 1, "colnorm") == ident


def test_diff_names_every_differing_key_with_both_values(tiny_config):
    cfg = _cfg(tiny_config)
    own = expected_identity(cfg, "none", 0)
    other = copy.deepcopy(own)
    other["train"]["learning_rate"] = 0.02
    other["model"]["n_layer"] = 3
    del other["data"]
    diff = identity_diff(other, own)
    assert f"train.learning_rate: run 0.02, config {cfg['train']['learning_rate']}" in diff
    assert f"model.n_layer: run 3, config {cfg['model']['n_layer']}" in diff
    assert any(d.startswith("data: run (not recorded)") for d in diff) and len(diff) == 3
    assert identity_diff(copy.deepcopy(own), own) == []


def test_a_summary_is_checked_by_its_identity_else_by_its_hash(tiny_config):
    cfg = _cfg(tiny_config)
    own = expected_identity(cfg, "none", 0)
    # what summary.json holds after a JSON round trip is the config's own run
    stored = yaml.safe_load(yaml.safe_dump(own))
    assert identity_problem({"identity": stored, "config_hash": config_hash(own)}, own) is None
    hand = copy.deepcopy(own)
    hand["train"]["learning_rate"] = 0.02
    msg = identity_problem({"identity": hand, "config_hash": config_hash(hand)}, own)
    assert "not the config's" in msg and "train.learning_rate: run 0.02" in msg
    # an older summary: only its hash, so the keys cannot be named
    assert identity_problem({"config_hash": config_hash(own)}, own) is None
    msg = identity_problem({"config_hash": config_hash(hand)}, own)
    assert config_hash(hand) in msg and "cannot be named" in msg
    assert "cannot be checked" in identity_problem({"status": "completed"}, own)


@pytest.mark.slow
def test_workflow_names_a_finished_run_that_is_not_the_configs_at_load(tmp_path):
    """A finished run whose identity is a hand run's (an override) over the config's run: Snakemake
    names the run and the keys when it loads, before any job, and plans to set it aside (its marker
    is an input of its train job), rather than planning only the report."""
    import pytest

    from fakedata import HAS_SNAKEMAKE, repo_copy, snakemake_in

    if not HAS_SNAKEMAKE:
        pytest.skip("snakemake not installed")
    from mwm.io import atomic_write_json

    repo = repo_copy(tmp_path / "repo")
    cfg = load_config(repo / "config" / "ci.yaml")
    hand = copy.deepcopy(expected_identity(cfg, "none", 0))
    hand["train"]["learning_rate"] = 0.02
    atomic_write_json(repo / "results" / "runs" / "ci" / "none" / "seed0" / "summary.json",
                      {"status": "completed", "identity": hand, "config_hash": config_hash(hand)})
    proc = snakemake_in(repo, "--configfile", "config/ci.yaml", "--dry-run", "--cores", "1", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert ("results/runs/ci/none/seed0/summary.json: trained with settings that are not the config's: "
            f"train.learning_rate: run 0.02, config {cfg['train']['learning_rate']}") in out, out[-3000:]
    assert "rule set_aside_foreign_run moves each to results/hand/foreign/ci/<variant>/seed<S>-<UTC time>/" in out
    assert re.search(r"^set_aside_foreign_run\s+1$", out, re.M), out[-3000:]
    assert "results/runs/ci/.retrain/none/seed0/1.json" in out, out[-3000:]


def _overwrite_identity(summary_path, cfg, variant, seed, lr):
    """What an older ``mwm.train ... train.learning_rate=<lr> --out results`` left: the run's
    summary records the hand run's identity."""
    from mwm.io import atomic_write_json

    summary = json.loads(summary_path.read_text())
    hand = copy.deepcopy(expected_identity(cfg, variant, seed))
    hand["train"]["learning_rate"] = lr
    atomic_write_json(summary_path, {**summary, "identity": hand, "config_hash": config_hash(hand)})


@pytest.mark.slow
def test_snakemake_retrains_a_finished_run_that_is_not_the_configs(tmp_path):
    """After such a hand run, `snakemake -n all` plans the run as out of date (not the report
    alone, which would refuse the run): it is moved to
    results/hand/foreign/ (nothing lost), retrained, the report remade, and a second
    `snakemake -n all` has nothing to do. (The ci config with two runs: the whole DAG, cheaper.)"""
    import pytest

    from fakedata import HAS_SNAKEMAKE, repo_copy, snakemake_in

    if not HAS_SNAKEMAKE:
        pytest.skip("snakemake not installed")
    repo = repo_copy(tmp_path / "repo")
    raw = yaml.safe_load((repo / "config" / "ci.yaml").read_text())
    raw["grid"] = {"assignments": ["none", "dgram"], "seeds": [0]}
    raw["studies"]["solvers"]["assignments"] = ["dgram"]  # captured by the grid's dgram run (source: grid)
    (repo / "config" / "ci.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(repo / "config" / "ci.yaml")
    sm = ("--configfile", "config/ci.yaml", "--cores", "2")
    first = snakemake_in(repo, *sm, "all", timeout=1200)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    summary = repo / "results" / "runs" / "ci" / "none" / "seed0" / "summary.json"
    _overwrite_identity(summary, cfg, "none", 0, 0.02)
    dry = snakemake_in(repo, *sm, "--dry-run", "all")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    assert "results/runs/ci/none/seed0/summary.json: trained with settings that are not the config's" in out
    for rule in ("set_aside_foreign_run", "train", "report"):
        assert re.search(rf"^{rule}\s+1$", out, re.M), (rule, out[-3000:])
    assert "wildcards: variant=none, seed=0" in out and "results/runs/ci/.retrain/none/seed0/1.json" in out

    again = snakemake_in(repo, *sm, "all", timeout=900)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert identity_problem(json.loads(summary.read_text()), expected_identity(cfg, "none", 0)) is None
    aside = list((repo / "results" / "hand" / "foreign" / "ci" / "none").glob("seed0-*Z"))
    assert len(aside) == 1, aside
    old = json.loads((aside[0] / "summary.json").read_text())
    assert old["identity"]["train"]["learning_rate"] == 0.02 and (aside[0] / "metrics.csv").is_file()
    record = json.loads((repo / "results" / "runs" / "ci" / ".retrain" / "none" / "seed0" / "1.json").read_text())
    assert record["moved_to"] == aside[0].relative_to(repo).as_posix() and "train.learning_rate" in record["why"]
    assert (repo / "paper_figures" / "ci" / "ledger.md").is_file()

    done = snakemake_in(repo, *sm, "--dry-run", "all")
    assert done.returncode == 0 and "Nothing to be done" in done.stdout + done.stderr, \
        (done.stdout + done.stderr)[-3000:]
    # written over again after the retrain: set aside again, with the next marker
    _overwrite_identity(summary, cfg, "none", 0, 0.03)
    dry = snakemake_in(repo, *sm, "--dry-run", "all")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0 and "results/runs/ci/.retrain/none/seed0/2.json" in out, out[-3000:]
    assert re.search(r"^train\s+1$", out, re.M), out[-3000:]


def test_capture_window_names_the_grid_runs_the_solver_study_reads(tiny_config):
    from mwm.plan.runs import capture_window

    cfg = load_config(tiny_config(grid__assignments=["none", "stiefel", "dgram"],
                                  grid__seeds=[0, 1]))
    sec = cfg["studies"]["solvers"]
    assert sec["source"] == "own" and capture_window(cfg, "stiefel", 0) is None  # the study captures itself
    sec.update(source="grid", capture_start=3, capture_length=2, seed=1)
    assert capture_window(cfg, "stiefel", 1) == {"start": 3, "length": 2}
    assert capture_window(cfg, "dgram", "1") == {"start": 3, "length": 2}  # a wildcard's string seed
    assert capture_window(cfg, "stiefel", 0) is None and capture_window(cfg, "none", 1) is None
    assert capture_window(cfg, "dgram-colnorm", 1) is None  # the ablation's variant is another run


#: The train keys with a schema default: each is part of every run's identity. A new key gets no default
#: (absent = the behaviour before it), or every finished run becomes foreign (docs/training.md, Run identity).
DEFAULTED_TRAIN_KEYS = frozenset({
    "admm_rho", "batch_size", "beta1", "beta2", "capture_pairs_step", "capture_sequence", "checkpoint_interval",
    "compile", "decay_lr", "device", "dgram_retraction", "dtype", "dual_ascent_alpha", "dual_ascent_steps",
    "eval_interval", "eval_iters", "eval_seed", "grad_accum", "grad_clip", "keep_final_checkpoint",
    "learning_rate", "log_interval", "lr_decay_iters", "max_iters", "min_lr",
    "msign_precision", "msign_steps", "muon_lr",
    "muon_momentum", "probe_batch", "solver", "solver_max_steps", "solver_tol", "tf32", "warm_start",
    "warmup_iters", "weight_decay",
})


def test_a_new_train_key_without_default_leaves_finished_runs_their_own():
    """The run-identity rule: a train key added without a schema default, unset in a config, leaves
    the identity of every run that config made before it unchanged; one with a default makes each
    of them foreign, naming the key."""
    import yaml

    from mwm.config import load_config
    from mwm.plan.runs import config_run_identity, identity_problem

    schema = yaml.safe_load((Path(__file__).resolve().parents[2] / "src" / "mwm" / "config" / "schema" / "train.yaml")
                            .read_text())["properties"]
    defaulted = {k for k, spec in schema.items() if "default" in spec or "$default" in spec}
    assert defaulted == DEFAULTED_TRAIN_KEYS, (
        f"train keys with a schema default changed ({sorted(defaulted ^ DEFAULTED_TRAIN_KEYS)}): a new key with a "
        "default makes every finished run foreign; give it none (docs/training.md, Run identity), or, for a "
        "numerics change, bump mwm.numerics.VERSION and update DEFAULTED_TRAIN_KEYS")
    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "ci.yaml")
    recorded = config_run_identity(cfg, "dgram", 0)
    unset = [k for k in schema if k not in defaulted and k not in cfg["train"]]
    assert unset and not set(unset) & set(recorded["train"])  # absent keys are not in the identity
    assert identity_problem({"identity": recorded, "numerics": recorded["numerics"]}, recorded) is None
    with_default = {**recorded, "train": {**recorded["train"], "new_key": 1}}
    problem = identity_problem({"identity": recorded, "numerics": recorded["numerics"]}, with_default)
    assert problem is not None and "train.new_key: run (not recorded), config 1" in problem


def test_the_plan_is_the_functions_it_is_built_of(tiny_config):
    """A Plan names the same runs, configs, identities and folders as the functions each consumer used to
    call one by one, for the ablation's variants and a variant with its own overrides."""
    from mwm.plan.runs import Plan, checkpoint_dir, grid_variants, run_config, run_dir

    cfg = _cfg(tiny_config, grid__assignments=["none", "dgram", "hetero"], grid__seeds=[0, 3],
               grid__retraction_ablation=True, grid__train_overrides={"hetero": {"learning_rate": 0.5}})
    plan = Plan(cfg, "out")
    assert plan.variants == tuple(grid_variants(cfg["grid"])) and "hetero-colnorm" in plan.variants
    assert [(r.variant, r.seed) for r in plan.runs()] == [(v, s) for v in plan.variants for s in (0, 3)]
    for run in plan.runs():
        assert run.dir == run_dir("out", "tiny", run.variant, run.seed) == Path(plan.path(run.variant, run.seed))
        assert run.ckpt_dir == checkpoint_dir("out", "tiny", run.variant, run.seed)
        assert plan.identity(run.variant, run.seed) == expected_identity(cfg, run.variant, run.seed)
        assert plan.train(run.variant) == run_config(cfg, run.assignment)["train"]
    assert plan.run("hetero-colnorm", 0).retraction == "colnorm" and plan.run("hetero", 0).assignment == "hetero"
    assert plan.train("hetero")["learning_rate"] == 0.5 != plan.train("none")["learning_rate"]
    assert plan.config("hetero") is plan.config("hetero-colnorm")  # one validated config per assignment
    assert plan.folders["runs"] == "out/runs/tiny" and plan.folders["figures"] == "paper_figures/tiny"
    assert plan.path() == "out/runs/tiny/{variant}/seed{seed}"  # the rules' wildcard pattern


def test_a_plan_reads_a_summary_as_the_identity_functions_do(tiny_config):
    from mwm.plan.runs import Plan

    cfg = _cfg(tiny_config, grid__assignments=["none", "dgram"])
    plan = Plan(cfg)
    own = {"identity": expected_identity(cfg, "dgram", 0), "numerics": expected_identity(cfg, "dgram", 0)["numerics"]}
    assert plan.problem(own, "dgram", 0) is None
    assert "seed: run 0, config 1" in plan.problem(own, "dgram", 1)
    assert plan.problem(own, "none", 0) == identity_problem(own, expected_identity(cfg, "none", 0))


@pytest.mark.parametrize("name", ["..", ".hidden", "a/b"])
def test_no_product_folder_leaves_its_parent(name):
    from mwm.paths import UnsafePathError
    from mwm.plan.runs import CONFIG_KINDS, config_dir, run_dir

    for kind in CONFIG_KINDS:
        with pytest.raises(UnsafePathError, match="config name"):
            config_dir(kind, name)
    with pytest.raises(UnsafePathError):
        run_dir("results", "ok", name, 0)
    with pytest.raises(ValueError, match="unknown kind of product 'logs'"):
        config_dir("logs", "ok")


def test_hand_runs_of_the_same_overrides_share_one_root(tiny_config):
    from mwm.plan.runs import HAND_FOLDER, hand_root

    path = tiny_config()
    a, b = load_config(path, ["train.learning_rate=0.02"]), load_config(path, ["train.learning_rate=0.03"])
    assert hand_root(a) == hand_root(load_config(path, ["train.learning_rate=0.02"])) != hand_root(b)
    assert hand_root(a, "out") == Path("out") / HAND_FOLDER / config_hash(a)


def test_the_plan_names_what_the_studies_read(tiny_config):
    """The policy the rules' input functions call: the records of every run, the absorption study's pairs
    (hetero first: both manifolds), the audit's spectral log (DGram attention first) and the solver study's
    grid captures; none where the config asks for none."""
    from mwm.plan.runs import RUN_FILES, RUN_FOLDERS, Plan

    cfg = _cfg(tiny_config, grid__assignments=["none", "stiefel", "dgram", "hetero"], grid__seeds=[2, 5],
               train__capture_pairs_step=3)
    plan = Plan(cfg, "out")
    assert plan.records() == [f"out/runs/tiny/{v}/seed{s}/{f}" for v in plan.variants for s in (2, 5)
                              for f in (*RUN_FILES, *RUN_FOLDERS)]
    assert plan.pairs_summaries() == [f"out/runs/tiny/{v}/seed2/summary.json" for v in ("hetero", "stiefel", "dgram")]
    assert plan.probe_run(("hetero-inv", "dgram")) == ("dgram", 2)
    assert plan.probe_run(()) == ("stiefel", 2)  # else the first that uses a manifold
    assert plan.spectral_logs() == ["out/runs/tiny/dgram/seed2/spectral.csv"]
    bare = Plan(_cfg(tiny_config, grid__assignments=["none", "adamw"], train__capture_pairs_step=None), "out")
    assert bare.pairs_summaries() == [] and bare.probe_run(("dgram",)) is None and bare.spectral_logs() == []
    own = Plan(_cfg(tiny_config, studies={"solvers": {"source": "own"}}), "out")
    assert own.solver_sequences() == []
    grid = Plan(_cfg(tiny_config, grid__assignments=["none", "dgram", "hetero"],
                     studies={"solvers": {"source": "grid", "seed": 0}}), "out")
    assert grid.capture_variants and grid.solver_sequences() == [
        f"out/runs/tiny/{v}/seed0/{f}" for v in grid.capture_variants for f in ("summary.json", "metrics.csv")]
