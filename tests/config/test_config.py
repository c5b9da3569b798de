"""mwm.config: bounds before validation (alias bombs, sizes, seeds) and bounded messages."""

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import fakedata
import mwm.config as config
from mwm.config import ConfigError, load_config, load_schema, resolve_device, validate

ROOT = Path(__file__).resolve().parents[2]


def _limit_memory():  # expanding the bomb would take 1.7-2.3 GB: the child is capped at 1 GB
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_an_alias_bomb_is_refused_at_once_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(fakedata.alias_bomb())
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = ("import sys\nfrom mwm.config import ConfigError, load_config\n"
            "try:\n    load_config(sys.argv[1])\nexcept ConfigError as e:\n    print(e)\n")
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                             env=env, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("load_config of an alias bomb did not return within 60 s")
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"config {path} holds more than {config.MAX_CONFIG_NODES:,} values" in res.stdout and "alias" in res.stdout
    assert time.monotonic() - t0 < 30


def test_a_config_that_contains_itself_and_an_oversized_file_are_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("name: loop\ntrain: &t {batch_size: 8, again: *t}\n")
    with pytest.raises(ConfigError, match="contains itself"):
        load_config(path)
    big = tmp_path / "big.yaml"
    big.write_text("name: big\n" + "#" * 2_000_000 + "\n")
    with pytest.raises(ConfigError, match=f"config file {big} is 2,000,011 bytes"):
        load_config(big)


def test_error_messages_stay_short_whatever_the_value(tmp_path):
    huge = list(range(50_000))
    with pytest.raises(ConfigError) as info:
        validate({"name": "x", "train": {"batch_size": huge}}, source="x.yaml")
    msg = str(info.value)
    assert "train.batch_size" in msg and len(msg) < 400 and "[0, 1, 2" in msg
    shared = ["a" * 10] * 9
    for _ in range(8):  # 9^9 leaves if serialised: the preview stops at its limit
        shared = [shared] * 9
    t0 = time.monotonic()
    assert len(config._preview(shared)) == 80 and time.monotonic() - t0 < 1
    assert config._preview({"a": 1}) == '{"a": 1}' and config._preview("x" * 500).endswith("...")


@pytest.mark.parametrize("key,value", [("train.batch_size", 1_000_000_000), ("train.eval_iters", 10**7),
                                       ("train.grad_accum", 10**6), ("train.probe_batch", 10**6),
                                       ("model.block_size", 10**7), ("model.n_embd", 10**6),
                                       ("model.n_layer", 10**5), ("model.n_head", 10**5)])
def test_sizes_that_set_memory_have_upper_bounds_in_the_schema(tmp_path, key, value):
    section, name = key.split(".")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", section: {name: value}}))
    with pytest.raises(ConfigError, match=rf"{key}: {value} is greater than the maximum of \d+"):
        load_config(path)


def test_seeds_are_bounded_by_one_schema_value(tmp_path):
    bound = config.seed_bound()
    assert bound == 2**31 - 1 == load_schema()["properties"]["grid"]["properties"]["seeds"]["items"]["maximum"]
    for key in ("grid.seeds=[99999999999999999999]", "train.eval_seed=99999999999999999999",
                "studies.seed=4294967296", "data.seed=4294967296", "studies.solvers.seed=4294967296"):
        path = tmp_path / "c.yaml"
        path.write_text("name: c\n")
        with pytest.raises(ConfigError, match="is greater than the maximum of 2147483647"):
            load_config(path, [key])
    path.write_text("name: c\n")
    assert load_config(path, [f"grid.seeds=[0, {bound}]"])["grid"]["seeds"] == [0, bound]


def test_shipped_configs_are_within_the_bounds():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        load_config(path)


# -- devices (cuda:N accepted, as bench_gpu and the docs offer it) --
@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_schema_accepts_every_device_the_docs_offer(tmp_path, device):
    cfg = load_config(fakedata.write_config(tmp_path / "c.yaml", train__device=device))
    assert cfg["train"]["device"] == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda0", "cpu:0"])
def test_schema_refuses_other_devices_naming_the_key(tmp_path, device):
    with pytest.raises(ConfigError, match="train.device"):
        load_config(fakedata.write_config(tmp_path / "c.yaml", train__device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_a_config_error_naming_the_key(device):
    with pytest.raises(ConfigError, match=rf"train.device is '{device}' but no CUDA device"):
        resolve_device(device, "train.device")


def test_auto_and_cpu_resolve_on_any_machine():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_schema_vocabularies_come_from_mwm_names():
    """``$vocab: NAME`` in a schema file becomes the enum of ``mwm.config.names.NAME``: the retraction and
    study-manifold names are spelled once, and a bad value is refused naming the key."""
    from mwm.config.names import RETRACTIONS, STUDY_MANIFOLDS

    assert config.schema_node("train.dgram_retraction")["enum"] == list(RETRACTIONS)
    assert config.schema_node("studies.alpha.manifolds")["items"]["enum"] == list(STUDY_MANIFOLDS)
    assert "$vocab" not in config._schema_cached()
    cfg = yaml.safe_load(yaml.safe_dump(fakedata.TINY))
    cfg["train"]["dgram_retraction"] = "svd"
    with pytest.raises(ConfigError, match="dgram_retraction"):
        validate(cfg)


def test_a_schema_vocab_that_mwm_names_lacks_is_refused():
    with pytest.raises(ConfigError, match=r"schema train.yaml: \$vocab 'NOPE' is not a vocabulary of mwm.config.names"):
        config._vocab({"x": {"$vocab": "NOPE"}}, "train.yaml")
    assert config._vocab({"a": [{"$vocab": "RETRACTIONS", "default": "paper"}]}, "t") == {
        "a": [{"default": "paper", "enum": ["paper", "colnorm"]}]}


def test_a_schema_default_comes_from_mwm_names_once():
    from mwm.optim import msign
    from mwm.config import names

    assert config.defaults("train")["msign_steps"] == names.MSIGN_STEPS == msign.DEFAULT_STEPS
    assert config._vocab({"s": {"type": "integer", "$default": "MSIGN_STEPS"}}, "t") == {
        "s": {"type": "integer", "default": names.MSIGN_STEPS}}
    for bad in ("NOPE", "SOLVERS"):  # absent, or not a constant
        with pytest.raises(ConfigError, match=rf"schema train.yaml: \$default '{bad}' is not a constant"):
            config._vocab({"x": {"$default": bad}}, "train.yaml")


def test_a_setting_two_sections_share_is_spelled_once():
    """``$same: section.key`` copies that key's schema: the growth audit's schedule is train's, so its
    defaults and bounds cannot drift from the released train.py's."""
    schema = load_schema()["properties"]
    schedule = schema["studies"]["properties"]["audits"]["properties"]["growth"]["properties"]["schedule"]
    train = schema["train"]["properties"]
    for key, node in schedule["properties"].items():
        assert node == train[key], key
    assert config.defaults("studies")["audits"]["growth"]["schedule"] == {
        k: config.defaults("train")[k] for k in schedule["properties"]}
    props = {"train": {"properties": {"a": {"type": "integer", "default": 3}}}}
    assert config._same({"x": {"$same": "train.a", "description": "d"}}, props, "s.yaml") == {
        "x": {"type": "integer", "default": 3, "description": "d"}}
    for bad in ("train.b", "nope.a", "train"):
        with pytest.raises(ConfigError, match=rf"schema s.yaml: \$same '{bad}' is not a key"):
            config._same({"x": {"$same": bad}}, props, "s.yaml")


def test_every_schema_node_holds_only_schema_keywords():
    """A flow mapping's unquoted description with a comma (``{description: a, b}``) splits into a key ``b``
    that jsonschema ignores: the description is cut and a stray keyword sits in the schema."""
    from jsonschema import Draft202012Validator

    known = set(Draft202012Validator.VALIDATORS) | {"$schema", "description", "default", "title", "examples"}

    def stray(node, where):
        if isinstance(node, list):
            return [s for i, v in enumerate(node) for s in stray(v, f"{where}[{i}]")]
        if not isinstance(node, dict):
            return []
        out = [f"{where}: {k!r}" for k in node if k not in known]
        for k, v in node.items():
            if k in ("properties", "patternProperties", "$defs"):
                out += [s for name, sub in v.items() for s in stray(sub, f"{where}.{name}")]
            elif k not in ("default", "examples", "enum", "const"):
                out += stray(v, where)
        return out

    assert not stray(load_schema(), "schema"), stray(load_schema(), "schema")


# -- config names and numbers ----------

@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-rf", "a/b", "a b", ""])
def test_schema_refuses_unsafe_config_names(tmp_path, name):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"name": name}))
    with pytest.raises(ConfigError, match="name"):
        load_config(cfg)


def test_schema_refuses_unsafe_assignment_names(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"grid": {"custom": {"..": {"*.mlp.*": "stiefel"}}, "assignments": [".."]}}))
    with pytest.raises(ConfigError, match=r"grid\.(custom|assignments)"):
        load_config(cfg)


def test_exponent_numbers_are_accepted(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  learning_rate: 6e-4\n  max_iters: 2e2\n")
    c = load_config(cfg, ["train.muon_lr=1e-2", "train.lr_decay_iters=1e3", "grid.seeds=[0, 1e0]"])
    assert c["train"]["learning_rate"] == 6e-4 and c["train"]["muon_lr"] == 1e-2
    assert c["train"]["max_iters"] == 200 and type(c["train"]["max_iters"]) is int
    assert c["train"]["lr_decay_iters"] == 1000 and c["grid"]["seeds"] == [0, 1]
    assert all(type(s) is int for s in c["grid"]["seeds"])
    with pytest.raises(ConfigError, match="max_iters"):
        load_config(cfg, ["train.max_iters=1.5e0"])
    # a quoted value stays a string (and the schema says where it is wrong)
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(cfg, ["train.learning_rate='1e-3'"])


@pytest.mark.parametrize("key, value", [("train.learning_rate", ".inf"), ("train.muon_lr", ".nan"),
                                        ("train.weight_decay", ".nan"), ("train.divergence.threshold", ".nan"),
                                        ("studies.alpha.sizes", "[16, -.inf]")])
def test_a_non_finite_number_is_refused_naming_file_key_and_value(tmp_path, key, value):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: c\n")
    with pytest.raises(ConfigError, match=rf"c\.yaml:\n  {re.escape(key)}(\.1)?: .*(inf|nan) is not a finite number"):
        load_config(cfg, [f"{key}={value}"])


def test_a_config_name_too_long_for_a_folder_is_refused_naming_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: " + "a" * 300 + "\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\n  name: .*too long"):
        load_config(cfg)
    cfg.write_text("name: " + "a" * config.MAX_NAME_LENGTH + "\n")
    assert load_config(cfg)["name"] == "a" * config.MAX_NAME_LENGTH


def test_a_config_edited_after_the_workflow_planned_it_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "planned.yaml"
    path.write_text("train:\n  max_iters: 40\n")
    other = tmp_path / "other.yaml"
    other.write_text("train:\n  max_iters: 30\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(config.PLANNED_ENV, config.planned_stamp(path, load_config(path)))
    assert load_config(path)["train"]["max_iters"] == 40
    assert load_config(path, ["train.max_iters=7"])["train"]["max_iters"] == 7  # a job's own overrides
    assert load_config(other)["train"]["max_iters"] == 30  # only the planned file is held to its plan
    path.write_text("# a comment\ntrain: {max_iters: 40}\n")
    assert load_config("planned.yaml")["train"]["max_iters"] == 40  # same settings, another spelling
    path.write_text("train:\n  max_iters: 41\n")
    with pytest.raises(ConfigError, match="planned.yaml was edited after the workflow planned this job"):
        load_config("planned.yaml")
    monkeypatch.setenv(config.PLANNED_ENV, "not json")
    with pytest.raises(ConfigError, match=f"environment variable {config.PLANNED_ENV} is not what"):
        load_config(path)


@pytest.mark.parametrize("text, key, first", [
    ("name: dup\ntrain:\n  dual_ascent_steps: 5\n  dual_ascent_steps: 50\n", "dual_ascent_steps", 3),
    ("name: dup\ntrain: {batch_size: 8, warmup_iters: 5}\nmodel: {n_layer: 1}\ntrain: {max_iters: 4}\n", "train", 2),
])
def test_a_key_given_twice_is_refused_naming_file_key_and_lines(tmp_path, text, key, first):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and f"found the key {key!r} twice (first on line {first})" in msg


def test_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("name: merge\nbase: &b {batch_size: 8, max_iters: 4}\ntrain:\n  <<: *b\n  max_iters: 6\n")
    raw = config.yaml_load(path.read_text())
    assert raw["train"] == {"batch_size": 8, "max_iters": 6}


def test_every_shipped_config_has_each_key_once():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        load_config(path)  # raises on a duplicate


@pytest.mark.parametrize("overrides, match", [
    (["train.max_iters=[1"], r"override 'train.max_iters=\[1' from <overrides>: its value is not valid YAML"),
    (["train.max_iters=4", "train.max_iters=5"], "set train.max_iters twice"),
])
def test_a_malformed_or_repeated_override_is_one_config_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(ROOT / "config" / "ci.yaml", overrides)


def test_a_malformed_override_is_one_line_from_the_entry_points(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for cmd in (["mwm.train", "--config", "config/ci.yaml", "--assignment", "stiefel", "--seed", "0"],
                ["mwm.studies.alpha", "--config", "config/ci.yaml", "--out", str(tmp_path / "s")]):
        res = subprocess.run([sys.executable, "-m", *cmd, "train.max_iters=[1"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "not valid YAML" in res.stderr + res.stdout


@pytest.mark.parametrize("given, says", [("folder", "is a folder, not a config file"),
                                         ("/dev/null", "is not a regular file"),
                                         ("absent.yaml", "does not exist")])
def test_a_config_path_that_is_no_file_says_what_it_is(tmp_path, given, says):
    path = tmp_path if given == "folder" else Path(given) if given.startswith("/") else tmp_path / given
    with pytest.raises(ConfigError, match=says):
        load_config(path)


@pytest.mark.parametrize("override, says", [
    ("train.attn_qk_scale=1e39", "train.attn_qk_scale: 1e+39 is not a finite number in float32"),
    ("train.learning_rate=3.5e38", "train.learning_rate: 3.5e+38 is not a finite number in float32"),
    ("train.attn_qk_scale=100", "train.attn_qk_scale"),
])
def test_a_float_setting_past_what_a_run_can_compute_is_refused_at_load(override, says):
    """A typo such as 1e39 would overflow float32 at step 0 and be recorded as a divergence finding."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(ROOT / "config" / "ci.yaml", [override])
    load_config(ROOT / "config" / "ci.yaml", ["train.attn_qk_scale=44"])


def test_an_arm_declared_once_reads_as_the_three_declarations_it_replaces():
    """grid.arms: an intervention arm written once is the config its custom, train_overrides and
    intervention entries made; validation is idempotent; an arm those keys give otherwise, or a base
    that names no manifolds, is refused naming the key."""
    raw = config.read_config(ROOT / "config" / "ci-mechanism3.yaml")
    cfg = validate(raw, "ci-mechanism3.yaml")
    g = cfg["grid"]
    assert g["assignments"] == ["stiefel", "dgram", "dgram-admm", "dgram-qk"]
    assert g["custom"]["dgram-qk"] == {"*.attn.*": "dgram", "*.mlp.*": "dgram"}
    assert g["train_overrides"]["dgram-qk"] == {"attn_qk_scale": 4.0} and g["intervention"]["dgram-admm"] == "dgram"
    assert validate(cfg) == cfg  # a validated config validates to itself (the run configs are validated again)
    spelled = config.read_config(ROOT / "config" / "ci-mechanism3.yaml")
    arms = spelled["grid"].pop("arms")
    spelled["grid"]["assignments"] += list(arms)
    spelled["grid"]["custom"] = {a: {"*.attn.*": "dgram", "*.mlp.*": "dgram"} for a in arms}
    spelled["grid"]["train_overrides"] = {a: arm["train"] for a, arm in arms.items()}
    spelled["grid"]["intervention"] = {a: arm["base"] for a in arms for arm in [arms[a]]}
    old = validate(spelled)
    assert {k: v for k, v in old["grid"].items() if k != "arms"} == {k: v for k, v in g.items() if k != "arms"}
    clash = config.read_config(ROOT / "config" / "ci-mechanism3.yaml")
    clash["grid"]["train_overrides"] = {"dgram-qk": {"attn_qk_scale": 2.0}}
    with pytest.raises(ConfigError, match=r"grid.train_overrides.dgram-qk is given as well as grid.arms.dgram-qk"):
        validate(clash, "x.yaml")
    bad = config.read_config(ROOT / "config" / "ci-mechanism3.yaml")
    bad["grid"]["arms"]["dgram-qk"]["base"] = "adamw"
    with pytest.raises(ConfigError, match=r"grid.arms.dgram-qk.base: 'adamw' is neither a named assignment"):
        validate(bad, "x.yaml")


def _scaled(tmp_path, config: str, scale: str | None = "", file: str = "s.yaml"):
    """``config`` as tmp_path/config/c.yaml, ``scale`` (unless None) as config/scales/<file>."""
    folder = tmp_path / "config"
    (folder / "scales").mkdir(parents=True, exist_ok=True)
    if scale is not None:
        (folder / "scales" / file).write_text(scale)
    path = folder / "c.yaml"
    path.write_text(config)
    return path


def test_extends_puts_the_file_over_its_scale_key_by_key(tmp_path):
    scale = ("train: {batch_size: 4, max_iters: 9, divergence: {stop: true, patience: 3}}\n"
             "model: {n_layer: 2, n_head: 2, n_embd: 32}\ngrid: {seeds: [0, 1, 2]}\n")
    path = _scaled(tmp_path, "extends: scales/s.yaml\ntrain: {max_iters: 5, divergence: {patience: 4}}\n"
                             "grid: {seeds: [7]}\n", scale)
    cfg = load_config(path)
    assert "extends" not in cfg and cfg["name"] == "c"
    assert (cfg["train"]["batch_size"], cfg["train"]["max_iters"]) == (4, 5)  # the scale's, then the file's
    assert cfg["train"]["divergence"] == {**config.defaults("train")["divergence"], "stop": True, "patience": 4}
    assert cfg["model"]["n_embd"] == 32 and cfg["grid"]["seeds"] == [7]  # a list replaces, not appends
    raw = config.read_config(path)
    assert raw["train"] == {"batch_size": 4, "max_iters": 5, "divergence": {"stop": True, "patience": 4}}
    assert config.scale_file(path, config.read_mapping(path)) == path.parent / "scales" / "s.yaml"
    assert config.scale_file(path, {"train": {}}) is None


@pytest.mark.parametrize("extends, scale, says", [
    ("3", "", "is not a string"),
    ("[scales/s.yaml]", "", "is not a string"),
    ("../s.yaml", "", "is not in the scales/ folder beside the config"),
    ("/etc/hostname", "", "is not in the scales/ folder beside the config"),
    ("s.yaml", "", "is not in the scales/ folder beside the config"),
    ("scales/../c.yaml", "", "'..' is not a plain folder name"),
    ("scales/missing.yaml", "", "scale file {scales}/missing.yaml does not exist"),
    ("scales/s.yaml", "- a\n- b\n", "scale file {scales}/s.yaml must hold a mapping at top level, got list"),
    ("scales/s.yaml", "extends: scales/t.yaml\n", "scale file {scales}/s.yaml sets extends: \"scales/t.yaml\"; "
                                                  "a scale extends nothing"),
    ("scales/s.yaml", "name: small\n", "scale file {scales}/s.yaml sets name: \"small\"; a scale is not an"),
    ("scales/s.yaml", "train: [1\n", "scale file {scales}/s.yaml is not valid YAML"),
])
def test_a_bad_extends_is_refused_naming_file_key_and_value(tmp_path, extends, scale, says):
    path = _scaled(tmp_path, f"extends: {extends}\n", scale)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"config file {path}: extends: ") and extends.strip("[]") in msg, msg
    assert says.format(scales=path.parent / "scales") in msg, msg


def test_a_scale_file_is_held_to_a_config_files_bounds(tmp_path):
    path = _scaled(tmp_path, "extends: scales/s.yaml\n", "train: {batch_size: 8}\n" + "#" * 2_000_000 + "\n")
    with pytest.raises(ConfigError, match=r"scale file .*s\.yaml is 2,000,024 bytes, over the 1,000,000"):
        load_config(path)
    (path.parent / "scales" / "s.yaml").write_text(fakedata.alias_bomb(levels=6, width=9))
    with pytest.raises(ConfigError, match=f"holds more than {config.MAX_CONFIG_NODES:,} values"):
        load_config(path)


def test_a_scale_edited_after_the_workflow_planned_is_refused(tmp_path, monkeypatch):
    path = _scaled(tmp_path, "extends: scales/s.yaml\ntrain: {max_iters: 40}\n", "train: {batch_size: 8}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(config.PLANNED_ENV, config.planned_stamp(path, load_config(path)))
    assert load_config(path)["train"]["batch_size"] == 8
    (path.parent / "scales" / "s.yaml").write_text("# a comment\ntrain:\n  batch_size: 8\n")
    assert load_config(path)["train"]["batch_size"] == 8  # the same settings, spelled otherwise
    (path.parent / "scales" / "s.yaml").write_text("train: {batch_size: 9}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml or its scale file .*s\.yaml was edited after the workflow"):
        load_config(path)


def test_configs_of_one_scale_share_its_sections():
    """Each shipped scale is extended by a config, holds no experiment (no name, no grid), and the
    configs that extend it train at its sizes: the same data and model where they do not set their own."""
    scales = sorted((ROOT / "config" / "scales").glob("*.yaml"))
    assert {p.stem for p in scales} >= {"ci", "laptop", "gpt2"}
    users: dict[str, list[str]] = {}
    for path in sorted((ROOT / "config").glob("*.yaml")):
        raw = config.read_mapping(path)
        if "extends" in raw:
            users.setdefault(raw["extends"], []).append(path.name)
    for scale in scales:
        raw = config.read_mapping(scale)
        assert "name" not in raw and "grid" not in raw and "extends" not in raw, scale
        names = users.get(f"scales/{scale.name}")
        assert names, f"{scale} is extended by no config"
        for section in ("data", "model"):
            loaded = [load_config(ROOT / "config" / n)[section] for n in names
                      if section not in config.read_mapping(ROOT / "config" / n)]
            assert all(x == loaded[0] for x in loaded), (scale, section)
    ci = {n: load_config(ROOT / "config" / n) for n in users["scales/ci.yaml"]}
    assert {"ci.yaml", "ci-mechanism2.yaml"} <= set(ci)
    assert ci["ci.yaml"]["model"] == ci["ci-mechanism2.yaml"]["model"] and ci["ci.yaml"]["model"]["n_embd"] == 32
    assert ci["ci.yaml"]["data"] == ci["ci-mechanism2.yaml"]["data"]
    # a file's own key on a scale's mapping: ci asks the scale's train resources for a GPU as well
    train = {k: v for k, v in ci["ci.yaml"]["workflow"]["resources"]["train"].items() if k != "gpu"}
    assert train == {k: v for k, v in ci["ci-mechanism2.yaml"]["workflow"]["resources"]["train"].items() if k != "gpu"}
    assert (ci["ci.yaml"]["workflow"]["resources"]["train"]["gpu"],
            ci["ci-mechanism2.yaml"]["workflow"]["resources"]["train"]["gpu"]) == (1, 0)
