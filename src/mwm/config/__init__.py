"""Configuration: one YAML file per scale, validated against a JSON schema.

Each top-level section of a config has its own schema file in
``mwm/config/schema/<section>.yaml`` (owned by the stage that reads it); they are
composed into one schema here. Validation fills in defaults, rejects unknown
keys and wrong types, and names the offending key, value and file. Snakemake
(``rules/common.smk``) and every ``python -m mwm...`` entry point call the same
:func:`load_config`, so a bad config fails before any job starts.

A config file may start from a scale file (``extends: scales/ci.yaml``, in ``config/scales/``): the
sizes configs of one scale share (data, model, the training's scale, resources). The file's own keys
are merged over the scale's, mapping by mapping; :func:`compose` does it for every reader of the file.

Overrides are ``dotted.key=value`` strings whose value is parsed as YAML
(``train.max_iters=200``, ``grid.seeds=[0,1]``).

YAML is read by PyYAML's safe loader (YAML 1.1, no tags) with one YAML 1.2 rule
added: a number in exponent form without a dot (``1e6``, ``6e-4``) is a float, not
the string YAML 1.1 makes of it. A float with an integral value given for an
integer key (``train.max_iters=1e6``) becomes that integer; any other float there
is refused by the schema.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

import yaml
from jsonschema import Draft202012Validator, validators

from mwm.config import names
from mwm.errors import ConfigError
from mwm.paths import NAME_PATTERN, checkout_relative, inside

__all__ = [
    "ConfigError",
    "resolve_device",
    "SCHEMA_DIR",
    "load_schema",
    "validate",
    "expand_arms",
    "load_config",
    "read_mapping",
    "read_config",
    "compose",
    "scale_file",
    "EXTENDS",
    "SCALES",
    "apply_overrides",
    "config_hash",
    "check_size",
    "schema_node",
    "seed_bound",
    "defaults",
    "PLANNED_ENV",
    "planned_stamp",
]

SCHEMA_DIR = Path(__file__).with_name("schema")


class _Loader(yaml.SafeLoader):
    """Safe YAML 1.1 plus YAML 1.2's exponent floats without a dot (``1e6``), refusing a key given twice in
    one mapping (plain YAML keeps the last silently, so a second ``train:`` block would drop the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # a merge key's entries may be overridden: that is what merging is for
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base class refuses it with its own message
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"found the key {key!r} twice (first on line {first.start_mark.line + 1}); "
                        "give each key once", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))


def exponent_floats(obj: Any) -> Any:
    """``obj`` (read by a plain YAML 1.1 loader, e.g. Snakemake's) with ``1e6``-style
    strings as floats, as :func:`yaml_load` reads them."""
    if isinstance(obj, dict):
        return {k: exponent_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [exponent_floats(v) for v in obj]
    if isinstance(obj, str) and _EXP_FLOAT.match(obj):
        return float(obj.replace("_", ""))
    return obj


def yaml_load(stream):
    """A config file or override value (see the module docstring)."""
    return yaml.load(stream, Loader=_Loader)


def _integers(value: Any, schema: dict) -> Any:
    """``value`` with integral floats turned into ints where ``schema`` wants an integer."""
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if isinstance(value, float) and "integer" in types and "number" not in types and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        return {k: _integers(v, props.get(k, extra if isinstance(extra, dict) else {})) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_integers(v, schema["items"]) for v in value]
    return value


#: Bounds on a config before it is validated: its file size, and its size once YAML
#: aliases are expanded (mappings, lists and scalars counted; the largest shipped config
#: has a few hundred) and its nesting. Nine levels of nine aliases expand to 387M nodes.
MAX_CONFIG_BYTES = 1_000_000
#: A config name becomes folder names (and, with a variant and a seed, file names in logs): a file
#: system takes 255 bytes a name, so a longer one would fail only when its first job starts.
MAX_NAME_LENGTH = 100
MAX_CONFIG_NODES = 100_000
MAX_CONFIG_DEPTH = 64


def check_size(cfg: Any, source: str = "<config>") -> int:
    """The number of nodes of ``cfg`` with every YAML alias expanded, counted without
    expanding them; ConfigError naming ``source`` past :data:`MAX_CONFIG_NODES` or
    :data:`MAX_CONFIG_DEPTH`, or for a structure that contains itself."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(obj: Any, depth: int) -> int:
        if not isinstance(obj, (dict, list, tuple)):
            return 1
        key = id(obj)
        if key in memo:
            return memo[key]
        if key in active:
            raise ConfigError(f"config {source} contains itself (a YAML alias inside its own anchor)")
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"config {source} is nested deeper than {MAX_CONFIG_DEPTH} levels")
        active.add(key)
        items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else obj
        n = 1
        for item in items:
            n += size(item, depth + 1)
            if n > MAX_CONFIG_NODES:
                break
        active.discard(key)
        memo[key] = n
        return n

    total = size(cfg, 0)
    if total > MAX_CONFIG_NODES:
        raise ConfigError(f"config {source} holds more than {MAX_CONFIG_NODES:,} values once its YAML aliases are "
                          "expanded (an alias bomb?); refused before validation")
    return total


def _preview(value: Any, limit: int = 80) -> str:
    """``value`` as JSON, cut at about ``limit`` characters without serialising the rest
    (an error message must not expand a huge or aliased value)."""
    parts: list[str] = []
    used = 0

    def emit(text: str) -> bool:
        nonlocal used
        parts.append(text)
        used += len(text)
        return used <= limit

    def walk(v: Any) -> bool:
        if isinstance(v, dict):
            if not emit("{"):
                return False
            for i, (k, item) in enumerate(v.items()):
                if not emit((", " if i else "") + json.dumps(str(k)) + ": ") or not walk(item):
                    return False
            return emit("}")
        if isinstance(v, (list, tuple)):
            if not emit("["):
                return False
            for i, item in enumerate(v):
                if (i and not emit(", ")) or not walk(item):
                    return False
            return emit("]")
        if isinstance(v, str) and len(v) > limit:
            v = v[: limit + 1]
        return emit(json.dumps(v, default=str))

    walk(value)
    text = "".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=1)
def _schema_cached() -> str:
    return json.dumps(_compose_schema())


def load_schema() -> dict:
    """The composed schema: one property per ``schema/<section>.yaml`` (read once)."""
    return json.loads(_schema_cached())


def schema_node(dotted: str) -> dict:
    """The schema of one config key (``grid.seeds``, ``train.batch_size``): where a bound
    lives, for the code that needs it outside validation (a CLI argument)."""
    node = load_schema()
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


@functools.lru_cache(maxsize=None)
def _defaults_json() -> str:
    return json.dumps(validate({"name": "defaults"}))


def defaults(section: str) -> dict:
    """The schema's defaults of one config section (a fresh copy): the one home of every default."""
    return json.loads(_defaults_json())[section]


def seed_bound() -> int:
    """The largest seed a config or ``--seed`` may give (``grid.seeds`` items' maximum)."""
    return int(schema_node("grid.seeds")["items"]["maximum"])


def _vocab(node: Any, where: str) -> Any:
    """``node`` with every ``$vocab: NAME`` replaced by ``enum: [...]``, the names of ``mwm.config.names.NAME``
    (a tuple, or a table's keys), and every ``$default: NAME`` by ``default: mwm.config.names.NAME`` (a number
    or a string): a vocabulary or a default the code defines is spelled once, there."""
    if isinstance(node, list):
        return [_vocab(v, where) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _vocab(v, where) for k, v in node.items() if k not in ("$vocab", "$default")}
    if "$default" in node:
        out["default"] = _named_default(str(node["$default"]), where)
    if "$vocab" in node:
        names_table = getattr(names, str(node["$vocab"]), None)
        if not isinstance(names_table, (tuple, dict)) or not all(isinstance(k, str) for k in names_table):
            raise ConfigError(f"schema {where}: $vocab {node['$vocab']!r} is not a vocabulary of mwm.config.names")
        out["enum"] = list(names_table)
    return out


def _named_default(ref: str, where: str) -> Any:
    """The value ``$default: NAME`` (a constant of :mod:`mwm.config.names`) or ``NAME.key`` (an entry of one
    of its tables, such as ``PAPER_TRAIN.muon_lr``) stands for."""
    table, _, key = ref.partition(".")
    missing = object()
    value = getattr(names, table, missing)
    if key:
        value = value.get(key, missing) if isinstance(value, dict) else missing
    if value is not None and not isinstance(value, (bool, int, float, str)):
        value = missing
    if value is missing:
        raise ConfigError(f"schema {where}: $default {ref!r} is not a constant of mwm.config.names (a number, "
                          "string, boolean or null)")
    return value


def _same(node: Any, props: dict, where: str) -> Any:
    """``node`` with every ``$same: section.key`` replaced by that key's schema (type, bounds, default) in the
    composed ``props``, its own other entries (a description) kept: a setting another section shares is
    spelled once, where it belongs."""
    if isinstance(node, list):
        return [_same(v, props, where) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _same(v, props, where) for k, v in node.items() if k != "$same"}
    if "$same" in node:
        ref = str(node["$same"])
        target: Any = {"properties": props}
        for part in ref.split("."):
            target = (target.get("properties") or {}).get(part) if isinstance(target, dict) else None
        if "." not in ref or not isinstance(target, dict) or "$same" in json.dumps(target):
            raise ConfigError(f"schema {where}: $same {ref!r} is not a key of another section's schema "
                              "(section.key, itself no $same)")
        out = {**copy.deepcopy(target), **out}
    return out


def _compose_schema() -> dict:
    props = {}
    for path in sorted(SCHEMA_DIR.glob("*.yaml")):
        with open(path) as fh:
            props[path.stem] = _vocab(yaml.safe_load(fh), path.name)
    props = {section: _same(node, props, f"{section}.yaml") for section, node in props.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH,
                     "description": "config name; results land under results/.../<name>/ (a plain folder "
                                    "name: no '/', not starting with '.' or '-')"},
            **props,
        },
        "required": ["name"],
    }


def _with_defaults(cls):
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
                elif sub.get("type") == "object" and key not in instance and "properties" in sub:
                    instance[key] = {}
        yield from validate_props(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_Validator = _with_defaults(Draft202012Validator)


def _path(err) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "<top level>"


#: The largest float32: a run computes in it (or narrower), so a setting beyond it is infinity there.
FLOAT32_MAX = 3.4028234663852886e38


def _nonfinite(node: Any, path: tuple = ()) -> Iterable[tuple[str, float]]:
    """``(dotted key, value)`` of every NaN or infinite number under ``node``, or one that is infinite in
    float32 (a run's dtype). JSON Schema bounds do not catch them (NaN fails no comparison, Inf passes
    every minimum), and no key of the schema takes one."""
    if isinstance(node, float) and not (math.isfinite(node) and abs(node) <= FLOAT32_MAX):
        yield ".".join(map(str, path)) or "<top level>", node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _nonfinite(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _nonfinite(v, (*path, i))


def validate(cfg: dict, source: str = "<config>") -> dict:
    """Validate ``cfg`` (a copy gets the defaults) and return it; raise ConfigError."""
    check_size(cfg, source)  # before anything walks it: copies and messages would expand aliases
    bad = list(_nonfinite(cfg))
    if bad:
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(
            f"  {key}: {value} is not a finite number" + (" in float32, the dtype runs compute in (its largest is "
                                                       f"{FLOAT32_MAX:.4g})" if math.isfinite(value) else "")
            + f" (value: {value})" for key, value in bad[:10]))
    cfg = _integers(copy.deepcopy(cfg), load_schema())
    errors = sorted(_Validator(load_schema()).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            value = _preview(e.instance)
            msg = e.message  # jsonschema's holds the value's repr: cut its middle, keep what is wrong
            if len(msg) > 200:
                msg = msg[:90] + " ... " + msg[-105:]
            lines.append(f"  {_path(e)}: {msg} (value: {value})")
        more = f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else ""
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(lines) + more)
    return expand_arms(cfg, source)


def expand_arms(cfg: dict, source: str = "<config>") -> dict:
    """``cfg`` with each ``grid.arms`` entry written out where the grid's readers look: the arm in
    ``assignments`` (after the others, unless listed), ``custom`` (its base's patterns: a named base's
    attention and MLP manifolds, or a custom base's table), ``train_overrides`` (its ``train``) and
    ``intervention`` (its base). Idempotent: an arm already written out the same way is left; one those
    keys give otherwise is a ConfigError naming it."""
    grid = cfg["grid"]
    for arm, spec in grid.get("arms", {}).items():
        base = spec["base"]
        if base in names.NAMED_ASSIGNMENTS and names.NAMED_ASSIGNMENTS[base] is not None:
            attn, mlp = names.NAMED_ASSIGNMENTS[base]
            patterns = {"*.attn.*": attn, "*.mlp.*": mlp}
        elif base in grid["custom"] and base not in grid.get("arms", {}):
            patterns = dict(grid["custom"][base])
        else:
            raise ConfigError(f"invalid config {source}: grid.arms.{arm}.base: {base!r} is neither a named assignment "
                              f"with manifolds ({', '.join(k for k, v in names.NAMED_ASSIGNMENTS.items() if v)}) "
                              "nor a name of grid.custom")
        want = {"custom": patterns, "train_overrides": dict(spec["train"]), "intervention": base}
        for key, value in want.items():
            given = grid[key].get(arm)
            if given is not None and given != value:
                raise ConfigError(f"invalid config {source}: grid.{key}.{arm} is given as well as grid.arms.{arm}, "
                                  f"and differs ({given!r}, the arm's {value!r}): declare the arm once, "
                                  "under grid.arms")
            grid[key][arm] = value
        if arm not in grid["assignments"]:
            grid["assignments"].append(arm)
    return cfg


def apply_overrides(cfg: dict, overrides: Iterable[str], source: str = "<overrides>") -> dict:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) to a copy."""
    cfg = copy.deepcopy(cfg)
    given: dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} from {source} is not of the form dotted.key=value")
        key, raw = item.split("=", 1)
        if key.strip() in given:
            raise ConfigError(f"overrides from {source} set {key.strip()} twice ({given[key.strip()]!r} and "
                              f"{item!r}); give each key once")
        given[key.strip()] = item
        parts = key.strip().split(".")
        node = cfg
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        try:
            node[parts[-1]] = yaml_load(raw)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            detail = (getattr(exc, "problem", None) or "unreadable") + (
                f" at character {mark.column + 1}" if mark is not None else "")
            raise ConfigError(f"override {item!r} from {source}: its value is not valid YAML ({detail}); "
                              "quote a string value, close a list with ]") from None
    return cfg


#: The top-level key naming a config's scale file, and the folder (beside the configs) scale files live in.
EXTENDS = "extends"
SCALES = "scales"


def read_mapping(path: str | Path, what: str = "config file") -> dict:
    """The mapping a YAML file holds, as written (no scale, no defaults): ConfigError naming the file
    for one that is no regular file, too big, not YAML, an alias bomb, or no mapping."""
    path = Path(path)
    if not path.is_file():
        state = ("is a folder, not a config file" if path.is_dir() else
                 "is not a regular file (a device or a pipe), not a config file" if path.exists() else
                 "does not exist")
        raise ConfigError(f"{what} {path} {state}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {path} is {path.stat().st_size:,} bytes, over the {MAX_CONFIG_BYTES:,} a "
                          "config may have")
    with open(path) as fh:
        try:
            raw = yaml_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{what} {path} is not valid YAML: {exc}") from exc
        except RecursionError:
            raise ConfigError(f"{what} {path} is nested too deeply to read") from None
    check_size(raw, str(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path} must hold a mapping at top level, got {type(raw).__name__}")
    return raw


def scale_file(path: str | Path, raw: dict) -> Path | None:
    """The scale file ``raw`` (config file ``path``'s mapping) extends, checked to lie in the ``scales``
    folder beside it; None without ``extends``. A path from a config must not leave its folder."""
    if EXTENDS not in raw:
        return None
    value = raw[EXTENDS]
    where = f"config file {path}: {EXTENDS}: {_preview(value)}"
    if not isinstance(value, str):
        raise ConfigError(f"{where} is not a string: give the scale file as {SCALES}/NAME.yaml")
    parts = PurePosixPath(value).parts
    if len(parts) < 2 or parts[0] != SCALES:
        raise ConfigError(f"{where} is not in the {SCALES}/ folder beside the config: a config extends a scale "
                          f"file, {SCALES}/NAME.yaml")
    return inside(Path(path).parent / SCALES, *parts[1:], what=where)


def _merged(base: dict, over: dict) -> dict:
    """``over`` on ``base``: mappings merge key by key, any other value (a list too) replaces."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merged(base[key], value) if both else value
    return out


def compose(raw: dict, path: str | Path) -> dict:
    """Config file ``path``'s mapping ``raw`` (as read, by :func:`read_mapping` or by Snakemake) on the scale
    file its ``extends`` names, ``extends`` itself removed: the settings every reader of the file sees. One
    level: a scale extends nothing, and has no ``name`` (a scale is not an experiment)."""
    scale = scale_file(path, raw)
    if scale is None:
        return raw
    where = f"config file {path}: {EXTENDS}: {raw[EXTENDS]!r}"
    try:
        base = read_mapping(scale, what="scale file")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    for key, why in ((EXTENDS, "a scale extends nothing (one level: a config file over its scale)"),
                     ("name", "a scale is not an experiment: the name belongs to the config file")):
        if key in base:
            raise ConfigError(f"{where}: scale file {scale} sets {key}: {_preview(base[key])}; {why}")
    return _merged(base, {k: v for k, v in raw.items() if k != EXTENDS})


def read_config(path: str | Path) -> dict:
    """A config file's settings as written, on its scale's (:func:`compose`); not validated."""
    return compose(read_mapping(path), path)


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> dict:
    """Read, compose with its scale, override, default and validate a config file."""
    path = Path(path)
    own = read_mapping(path)
    raw = compose(own, path)
    raw.setdefault("name", path.stem)
    if os.environ.get(PLANNED_ENV):
        as_filed = validate(copy.deepcopy(raw), source=str(path))  # the file's own settings, as planned
        _check_planned(path, as_filed, scale_file(path, own))
        if not overrides:
            return as_filed
    return validate(apply_overrides(raw, overrides), source=str(path))


#: Set by the workflow when it loads a config: the file and the hash of its settings then. Snakemake
#: records a job's settings when it plans it, but the job reads the file when it starts: a file
#: edited in between would train on settings Snakemake never recorded, and the next DAG would retrain.
PLANNED_ENV = "MWM_PLANNED_CONFIG"


def planned_stamp(path: str | Path, cfg: dict) -> str:
    """The :data:`PLANNED_ENV` value for a config file as loaded (``cfg``, no overrides)."""
    return json.dumps({"file": checkout_relative(path), "hash": config_hash(cfg)})


def _check_planned(path: Path, cfg: dict, scale: Path | None = None) -> None:
    """Refuse a config file whose settings (on its ``scale`` file's) differ from those the workflow planned
    its jobs with."""
    try:
        planned = json.loads(os.environ[PLANNED_ENV])
        file, digest = planned["file"], planned["hash"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"environment variable {PLANNED_ENV} is not what the workflow sets "
                          f"({os.environ[PLANNED_ENV][:80]!r}); unset it") from None
    if file == checkout_relative(path) and digest != config_hash(cfg):
        raise ConfigError(
            f"config file {path}{f' or its scale file {scale}' if scale else ''} was edited after the workflow "
            "planned this job from it: it would run with "
            "settings Snakemake did not record, so nothing was run. When the edit is done, run snakemake again: "
            "it plans the jobs the edit affects")


def config_hash(section: Any) -> str:
    """Stable short hash of (a section of) a config, for run identities and summaries."""
    blob = json.dumps(section, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def resolve_device(name: str, key: str = "device"):
    """The ``torch.device`` of a config's device setting ``key`` (training's and the
    studies' alike): ``auto`` is cuda when available, else cpu; ``cuda`` without a
    GPU (or ``cuda:N`` past the last GPU) is a ConfigError."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} is {name!r} but no CUDA device is available (use auto or cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{key} is {name!r} but this machine has {torch.cuda.device_count()} CUDA device(s) "
                              f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    return dev
