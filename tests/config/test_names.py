"""mwm.config.names: the torch-free vocabulary (assignments, variants) the workflow reads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mwm.config import names
from mwm.config.names import (COLNORM_SUFFIX, NAMED_ASSIGNMENTS, PAPER_ASSIGNMENTS, STUDY_MANIFOLDS, assignment_pair,
                       parse_variant, uses_dgram, variant_name)

ROOT = Path(__file__).resolve().parents[2]

# What the Snakefile and rules/common.smk import, and the parse-time calls they make.
PARSE_TIME = """
import sys
from mwm.config import PLANNED_ENV, ConfigError, exponent_floats, load_config, planned_stamp, validate
from mwm.data import DataError, TokenDataset, dataset_dir
from mwm.workflow.dvc import PERSISTENT
from mwm.train.launch import ranks_per_run
from mwm.config.names import UNCONSTRAINED
from mwm.numerics import VERSION
from mwm.paths import checkout_relative, first_on_pythonpath, inside, leads_out
from mwm.plan.runs import RUN_FILES, Plan, check_grid, config_dir
from mwm.setaside import foreign_problem, foreign_root, next_marker, retrain_markers
from mwm.workflow.site import site_resources
from mwm.plan.checks import check_config, check_splits
from mwm.workflow.owner import check_owner, claim
cfg = load_config("config/ci.yaml")
check_grid(cfg["grid"])
ranks_per_run(cfg)
dataset_dir(cfg["data"])
plan = Plan(cfg)
plan.runs()
check_config(cfg)
check_splits(cfg, {"splits": {"val": {"tokens": 10 ** 6}}}, "meta.json")
check_owner("/nonexistent", cfg, "config/ci.yaml")
plan.problem({}, "dgram-colnorm", 0)
plan.train("dgram-hot")
plan.capture("dgram", 0)
foreign_problem(Plan(cfg, "/nonexistent"), "dgram-colnorm", 0)
foreign_root("/nonexistent", cfg["name"])
retrain_markers("/nonexistent", cfg["name"], "none", "0")
next_marker("/nonexistent", cfg["name"], "none", "0")
planned_stamp("config/ci.yaml", cfg)
plan.path()
config_dir("runs", cfg["name"])
leads_out("data/x/train.bin")
site_resources(1, {"MWM_SLURM_GPU_PARTITION": "gpu"})
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_snakefile_parse_imports_no_torch():
    common = (ROOT / "rules" / "common.smk").read_text()
    imported = set()
    for line in common.splitlines():
        if line.startswith("from mwm"):  # `from mwm.pkg import module` names the module
            pkg, name = line.split()[1], line.split()[3].rstrip(",")
            module = ROOT / "src" / pkg.replace(".", "/") / f"{name}.py"
            imported.add(f"{pkg}.{name}" if module.is_file() else pkg)
    assert imported == {"mwm.plan.checks", "mwm.config", "mwm.data", "mwm.workflow.dvc", "mwm.train.launch",
                        "mwm.config.names", "mwm.numerics", "mwm.workflow.owner", "mwm.paths",
                        "mwm.plan.runs", "mwm.setaside", "mwm.workflow.site", "mwm.workflow.stages"}, \
        "rules/common.smk imports changed: update PARSE_TIME in this test"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", PARSE_TIME], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"parsing the Snakefile imports torch: {proc.stdout}"


def test_names_is_standard_library_only():
    """names reads the optimizer's vocabulary from mwm.optim.vocab, itself standard library only, and
    importing that runs mwm.optim's __init__, which must import nothing either."""
    def imports(path):
        lines = Path(path).read_text().splitlines()
        return {line.split()[1] for line in lines if line.startswith(("import ", "from "))}

    assert imports(names.__file__) <= {"__future__", "typing", "mwm.optim.vocab"}
    assert imports(ROOT / "src" / "mwm" / "optim" / "vocab.py") <= {"__future__", "typing", "fnmatch"}
    assert imports(ROOT / "src" / "mwm" / "optim" / "__init__.py") == set()


def test_assignment_table():
    assert PAPER_ASSIGNMENTS == ("none", "stiefel", "dgram", "hetero", "hetero-inv")
    assert set(PAPER_ASSIGNMENTS) <= set(NAMED_ASSIGNMENTS)
    assert assignment_pair("hetero") == ("stiefel", "dgram")
    assert assignment_pair("hetero-inv") == ("dgram", "stiefel")
    assert assignment_pair("adamw") is None
    with pytest.raises(ValueError, match=r"unknown assignment 'nope'; choose one of none, stiefel"):
        assignment_pair("nope")


def test_uses_dgram():
    assert [a for a in NAMED_ASSIGNMENTS if uses_dgram(a)] == ["dgram", "hetero", "hetero-inv"]
    assert uses_dgram("mine", {"mine": {"*.mlp.*": "dgram"}})
    assert not uses_dgram("mine", {"mine": {"*.mlp.*": "stiefel"}})
    assert not uses_dgram("unknown")


@pytest.mark.parametrize("assignment", list(NAMED_ASSIGNMENTS) + ["mine"])
@pytest.mark.parametrize("retraction", ["paper", "colnorm"])
def test_variant_round_trip(assignment, retraction):
    custom = {"mine": {"*.attn.*": "dgram"}}
    v = variant_name(assignment, retraction, custom)
    a, r = parse_variant(v)
    assert a == assignment
    if uses_dgram(assignment, custom):
        assert r == retraction
        assert v.endswith(COLNORM_SUFFIX) == (retraction == "colnorm")
    else:  # the colnorm retraction does not exist without DGram: the variant is the assignment
        assert (v, r) == (assignment, "paper")


def test_variant_names_of_the_ablation():
    assert variant_name("hetero-inv", "colnorm") == "hetero-inv-colnorm"
    assert parse_variant("hetero-inv-colnorm") == ("hetero-inv", "colnorm")
    assert parse_variant("dgram") == ("dgram", "paper")


def test_unknown_names_refused():
    with pytest.raises(ValueError, match=r"unknown DGram retraction 'svd'; choose one of paper, colnorm"):
        variant_name("dgram", "svd")
    for bad in ("", COLNORM_SUFFIX, None):
        with pytest.raises(ValueError, match="not a variant name"):
            parse_variant(bad)


def test_study_manifolds():
    assert STUDY_MANIFOLDS == {"stiefel": ("stiefel", "paper"), "dgram-paper": ("dgram", "paper"),
                               "dgram-colnorm": ("dgram", "colnorm"), "oblique": ("oblique", "paper")}
    assert all(r in names.RETRACTIONS for _, r in STUDY_MANIFOLDS.values())
