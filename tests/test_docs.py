"""The README and docs/ pages a researcher reads first: every relative link resolves (files and
in-page anchors), every ``python -m mwm...`` entry point they quote answers ``--help``, and every
``snakemake ...`` command they quote parses with Snakemake's own argument parser and names config
files, profiles and targets that exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"python -m (mwm(?:\.[A-Za-z_]\w*)*)(?![\w.]*<)")  # not a pattern: mwm.studies.<name>


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", body, flags=re.M)}


def test_slug_follows_githubs_rule():
    assert slug("Sharing results with DVC") == "sharing-results-with-dvc"
    assert slug("Set-up (two commands)") == "set-up-two-commands"
    assert slug("The `train` stage: runs") == "the-train-stage-runs"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or not dest.is_relative_to(ROOT):
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def quoted_modules() -> list[str]:
    found = {m for page in PAGES for m in MODULE.findall(page.read_text())}
    return sorted(m for m in found if m != "mwm")


def test_the_pages_quote_entry_points():
    assert "mwm.train" in quoted_modules()  # the scan itself works: the README names the trainer


@pytest.mark.parametrize("module", quoted_modules())
def test_every_quoted_entry_point_answers_help(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, f"python -m {module} --help: {proc.stderr.strip()[-500:]}"
    assert "usage" in proc.stdout.lower()


SNAKEMAKE = re.compile(r"^\s*(?:[A-Z_]+=\S*\s+)*(snakemake\s.*)$")  # env assignments may come first


def quoted_snakemake() -> list[str]:
    """Every ``snakemake ...`` command of the pages: in inline code, code blocks and indented blocks
    (backslash-continued lines joined, trailing comments dropped, placeholders like ``<name>`` skipped)."""
    found = set()
    for page in PAGES:
        for line in page.read_text().replace("\\\n", " ").splitlines():
            for chunk in re.findall(r"`([^`]*)`", line) if "`" in line else [line]:
                m = SNAKEMAKE.match(chunk)
                if m:
                    cmd = re.sub(r"\s+#.*$", "", m.group(1)).strip()
                    if "<" not in cmd and "..." not in cmd:
                        found.add(" ".join(cmd.split()))
    return sorted(found)


def rule_names() -> set[str]:
    files = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    return {m for f in files for m in re.findall(r"^rule (\w+)", f.read_text(), flags=re.M)}


def test_the_pages_quote_snakemake_commands():
    cmds = quoted_snakemake()
    assert "snakemake --cores 2 all" in cmds  # the README's own first command is found
    assert any("--profile slurm" in c for c in cmds)
    assert "all" in rule_names()


@pytest.mark.parametrize("command", quoted_snakemake())
def test_every_quoted_snakemake_command_parses(command):
    from snakemake.cli import get_argument_parser

    try:
        args = get_argument_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{command!r}: snakemake's argument parser refuses it")
    missing = [f"config file {c}" for c in (args.configfile or []) if not (ROOT / c).is_file()]
    profiles = args.profile if isinstance(args.profile, list) else [args.profile] if args.profile else []
    missing += [f"profile {p}" for p in profiles if not (ROOT / p).is_dir()]
    missing += [f"target {t}" for t in (args.targets or []) if t not in rule_names()]
    assert not missing, f"{command!r} names what does not exist: " + ", ".join(missing)


def test_package_page_lists_every_module():
    """docs/package.md names every module of the optimizer, training, config and workflow rooms and
    every top-level one (data, studies and report are listed as packages)."""
    pkg = ROOT / "src" / "mwm"
    text = (ROOT / "docs" / "package.md").read_text()
    modules = set()
    for f in pkg.rglob("*.py"):
        parts = f.relative_to(pkg.parent).with_suffix("").parts
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        if len(parts) > 2 and parts[1] in ("data", "studies", "report"):
            parts = parts[:2]
        modules.add(".".join(parts))
    missing = sorted(m for m in modules - {"mwm"} if f"`{m}`" not in text)
    assert not missing, f"docs/package.md does not list {missing}"


def test_the_test_tree_mirrors_the_rooms():
    """Every folder of tests/ is a room of the package (or benchmarks/, scripts/); every test at the top
    tests a top-level module or the checkout as a whole; basenames are unique (pytest imports by name)."""
    tests, pkg = ROOT / "tests", ROOT / "src" / "mwm"
    rooms = {p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()} | {"benchmarks", "scripts"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))} - {"golden"}
    assert folders <= rooms, f"tests/ folders that are no room: {sorted(folders - rooms)}"
    top = {p.stem[len("test_"):] for p in tests.glob("test_*.py")}
    checkout = {"docs", "lint", "packaging", "envs"}
    modules = {p.stem for p in pkg.glob("*.py")}
    assert top <= modules | checkout, f"tests/ top-level files of a room: {sorted(top - modules - checkout)}"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
