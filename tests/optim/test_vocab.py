"""mwm.optim.vocab: the optimizer's torch-free facts, the one home of the paper's optimizer settings,
and the optimizer room importing nothing of the package outside itself."""

import ast
from pathlib import Path

import pytest
import yaml

from mwm import config
from mwm.config import ConfigError, names
from mwm.optim import vocab
from mwm.optim.assignments import OptimizerSettings
from mwm.optim.solvers import SolverSettings

ROOT = Path(__file__).resolve().parents[2]
OPTIM = ROOT / "src" / "mwm" / "optim"


def _mwm_imports(path: Path) -> set[str]:
    """Every module of the package ``path`` imports, function-local imports included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "mwm"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mwm":
            out.add(node.module)
    return out


@pytest.mark.parametrize("path", sorted(OPTIM.glob("*.py")), ids=lambda p: p.name)
def test_the_optimizer_room_imports_only_itself(path):
    outside = {m for m in _mwm_imports(path) if m != "mwm.optim" and not m.startswith("mwm.optim.")}
    assert not outside, f"{path.name} imports {sorted(outside)}: the math takes settings as plain values"


def test_every_paper_setting_is_the_schemas_default_spelled_once():
    raw = yaml.safe_load((ROOT / "src" / "mwm" / "config" / "schema" / "train.yaml").read_text())["properties"]
    defaults = config.defaults("train")
    for key, value in vocab.PAPER_TRAIN.items():
        assert raw[key].get("$default") == f"PAPER_TRAIN.{key}" and "default" not in raw[key], key
        assert defaults[key] == value and type(defaults[key]) is type(value), key


def test_settings_defaults_are_what_a_config_without_the_keys_gets():
    train = config.validate({"name": "t"})["train"]
    assert SolverSettings.defaults() == SolverSettings.from_train(train)
    assert OptimizerSettings.defaults() == OptimizerSettings.from_train(train)
    assert SolverSettings.defaults().steps == vocab.PAPER_TRAIN["dual_ascent_steps"] == 20


def test_names_reads_the_optimizers_vocabulary_from_here():
    for name in ("ATTN_KEYS", "MLP_KEYS", "ADAMW", "NAMED_ASSIGNMENTS", "RETRACTIONS", "SOLVERS", "PRECISIONS",
                 "MSIGN_STEPS", "NORMALIZE_SCOPES", "SOLVER_KEYS", "MSIGN_KEYS", "PAPER_TRAIN"):
        assert getattr(names, name) is getattr(vocab, name), name


def test_a_named_default_resolves_a_constant_or_a_table_entry():
    assert config._vocab({"a": {"$default": "PAPER_TRAIN.warm_start"}, "b": {"$default": "PAPER_TRAIN.solver_tol"},
                          "c": {"$default": "MSIGN_STEPS"}}, "t.yaml") == {
        "a": {"default": False}, "b": {"default": None}, "c": {"default": vocab.MSIGN_STEPS}}
    for bad in ("PAPER_TRAIN.nope", "NOPE", "ATTN_KEYS", "MSIGN_STEPS.x", "NAMED_ASSIGNMENTS.hetero"):
        with pytest.raises(ConfigError, match=rf"schema t.yaml: \$default '{bad}' is not a constant"):
            config._vocab({"a": {"$default": bad}}, "t.yaml")


def test_patterns_map_first_match_and_name_unused_ones():
    hidden = ["transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_fc.weight"]
    assert vocab.match_patterns(hidden, {"*.attn.*": "stiefel"}) == {hidden[0]: "stiefel", hidden[1]: "none"}
    with pytest.raises(ValueError, match=r"\['\*.mlp.\*'\] match no hidden matrix"):
        vocab.match_patterns(hidden, {"*": "dgram", "*.mlp.*": "stiefel"})
