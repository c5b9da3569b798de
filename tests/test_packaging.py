"""What a built wheel carries: setuptools ships only the data files pyproject.toml declares."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "mwm"


def test_every_schema_and_the_typing_marker_are_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mwm"]
    declared = {p for g in globs for p in PKG.glob(g)}
    shipped = set(PKG.glob("config/schema/*")) | {PKG / "py.typed"}
    assert shipped and shipped <= declared, sorted(str(p.relative_to(PKG)) for p in shipped - declared)


def _floors() -> dict[str, int]:
    """``{room: floor}`` from the Floors table of docs/package.md (a room: ``mwm.<name>``)."""
    import re

    text = (ROOT / "docs" / "package.md").read_text()
    section = text.split("## Floors", 1)[1].split("\n## ", 1)[0]
    out = {}
    for floor, rooms in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M):
        for room in re.findall(r"`mwm\.(\w+)`", rooms):
            out[room] = int(floor)
    return out


def _modules() -> dict[str, Path]:
    """``{dotted module name: file}`` of the package (a package by its ``__init__.py``)."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports() -> list[tuple[str, str]]:
    """``(module, what it imports)`` for every import of the package, function-local ones too: ``from a import
    b`` gives ``a.b`` (a module or a name of ``a``)."""
    import ast

    out = []
    for name, f in _modules().items():
        base = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                out += [(name, a.name) for a in node.names if a.name.split(".")[0] == "mwm"]
            elif isinstance(node, ast.ImportFrom):
                lead = base[: len(base) - node.level + 1] if node.level else []
                mod = ".".join(lead + ([node.module] if node.module else []))
                if mod.split(".")[0] == "mwm":
                    out += [(name, f"{mod}.{a.name}") for a in node.names]
    return out


def _room_imports() -> list[tuple[str, str, str]]:
    """``(module, what it imports, the room of that)`` for every import by a module of another room."""
    out = []
    for m, t in _imports():
        room = t.split(".")[1]
        if not ((PKG / room).is_dir() or (PKG / f"{room}.py").is_file()):
            continue  # a name of the package root (``from mwm import __version__``)
        if "." in m and room != m.split(".")[1]:
            out.append((m, t, room))
    return out


def test_no_module_imports_a_private_name_of_another():
    """A helper two modules share is public where it lives: ``from mwm.x import _helper`` ties one module to
    another's internals."""
    private = [(m, t) for m, t in _imports()
               if (last := t.rsplit(".", 1)[-1]).startswith("_") and not last.startswith("__")]
    assert private == [], private


def test_every_room_imports_only_rooms_on_lower_floors():
    """The package's rooms form floors (docs/package.md): an import that goes up or sideways is a cycle
    waiting to happen, and a low room (the optimizer's math, the plan) would drag in what sits above it."""
    floors = _floors()
    rooms = {f.stem if f.is_file() else f.name for f in PKG.iterdir()
             if (f.suffix == ".py" and f.stem != "__init__") or (f / "__init__.py").is_file()}
    assert rooms == set(floors), f"docs/package.md Floors lists {sorted(set(floors) - rooms)} that do not exist " \
                                 f"and omits {sorted(rooms - set(floors))}"
    bad = [f"{m} imports {t} (floor {floors[r]}, not below {floors[m.split('.')[1]]})"
           for m, t, r in _room_imports() if floors[r] >= floors[m.split(".")[1]]]
    assert not bad, "\n".join(bad)


def test_no_modules_import_each_other_in_a_circle():
    """Inside a room too, function-local imports included (where a circle hides from Python's own error):
    every module of the package can be read after the ones it imports."""
    modules = set(_modules())
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, t in _imports():
        for target in (t, t.rpartition(".")[0]):  # `from pkg import module` names the module
            if target in modules and target != m and not m.startswith(target + "."):
                graph[m].add(target)
                break
    done: set[str] = set()

    def visit(m, path):
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        for t in sorted(graph[m]):
            if (cycle := visit(t, path + [m])) is not None:
                return cycle
        done.add(m)
        return None

    for m in sorted(modules):
        cycle = visit(m, [])
        assert cycle is None, " -> ".join(cycle)


def test_the_floor_check_sees_function_local_imports():
    """The check reads the imports a module makes inside its functions, where upward ones hide."""
    found = _room_imports()
    assert ("mwm.setaside", "mwm.lock.RunLock", "lock") in found  # a function-local import of set_aside
    assert all(t.startswith("mwm.") for _, t, _ in found)
