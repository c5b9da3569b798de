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


def _room_imports() -> list[tuple[str, str, str]]:
    """``(module, imported module, room of it)`` for every import of the package by a module of another
    room, function-local ones too."""
    import ast

    pkg = ROOT / "src" / "mwm"
    out = []
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        base = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                lead = base[: len(base) - node.level + 1] if node.level else []
                targets = [".".join(lead + ([node.module] if node.module else []))]
            else:
                continue
            for t in targets:
                bits = t.split(".")
                if bits[0] == "mwm" and len(bits) > 1 and len(parts) > 1 and bits[1] != parts[1]:
                    out.append((name, t, bits[1]))
    return out


def test_every_room_imports_only_rooms_on_lower_floors():
    """The package's rooms form floors (docs/package.md): an import that goes up or sideways is a cycle
    waiting to happen, and a low room (the optimizer's math, the plan) would drag in what sits above it."""
    floors = _floors()
    pkg = ROOT / "src" / "mwm"
    rooms = {f.stem if f.is_file() else f.name for f in pkg.iterdir()
             if (f.suffix == ".py" and f.stem != "__init__") or (f / "__init__.py").is_file()}
    assert rooms == set(floors), f"docs/package.md Floors lists {sorted(set(floors) - rooms)} that do not exist " \
                                 f"and omits {sorted(rooms - set(floors))}"
    bad = [f"{m} imports {t} (floor {floors[r]}, not below {floors[m.split('.')[1]]})"
           for m, t, r in _room_imports() if floors[r] >= floors[m.split(".")[1]]]
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_function_local_imports():
    """The check reads the imports a module makes inside its functions, where upward ones hide."""
    found = _room_imports()
    assert ("mwm.setaside", "mwm.lock", "lock") in found  # a function-local import of set_aside
    assert all(t.startswith("mwm.") for _, t, _ in found)
