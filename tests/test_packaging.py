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
