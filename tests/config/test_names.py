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
import yaml
from mwm.config import ConfigError
from mwm.numerics import VERSION
from mwm.paths import CONFIG_ENV, checkout_relative
from mwm.plan.ranks import ranks_per_run
from mwm.plan.runs import RUN_FILES, RUN_FOLDERS
from mwm.setaside import RETRAIN_FOLDER, ForeignRuns
from mwm.workflow import stages
from mwm.workflow.owner import claim
from mwm.workflow.preflight import preflight
from mwm.workflow.site import stage_resources
from mwm.workflow.targets import Targets
env = {}
with open("config/ci.yaml") as fh:
    plan = preflight("config/ci.yaml", ".", {}, yaml.safe_load(fh), False, env)
plan.runs()
plan.problem({}, "dgram-colnorm", 0)
plan.train("dgram-hot")
plan.capture("dgram", 0)
plan.records(), plan.pairs_summaries(), plan.spectral_logs(), plan.solver_sequences()
foreign = ForeignRuns(plan)
foreign.note("config/ci.yaml"), foreign.train_markers("none", "0"), foreign.targets()
targets = Targets(plan)
targets.all(foreign.targets()), targets.runs(foreign.targets()), targets.report_inputs(), targets.study_outputs("alpha")
stage_resources(plan.cfg, "train", ranks_per_run(plan.cfg), None, None, {"MWM_SLURM_GPU_PARTITION": "gpu"})
stages.report_category("loss_curves")
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
    assert imported == {"mwm.config", "mwm.numerics", "mwm.paths", "mwm.plan.ranks", "mwm.plan.runs", "mwm.setaside",
                        "mwm.workflow.stages", "mwm.workflow.owner", "mwm.workflow.preflight", "mwm.workflow.site",
                        "mwm.workflow.targets"}, \
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

    assert imports(names.__file__) <= {"__future__", "typing", "mwm.optim.vocab", "mwm.experiments"}
    stdlib = {"__future__", "dataclasses", "importlib", "pkgutil", "typing"}
    for module in (ROOT / "src" / "mwm" / "experiments").glob("*.py"):  # the package and each experiment
        assert imports(module) - {"mwm.experiments", "mwm.experiments.mechanism2"} <= stdlib, module.name
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
