"""Did my rebuild give the published numbers? A rebuild in ``results/`` against ``published/<name>/``.

Every published record with a rebuilt counterpart is compared number by number, wall-clock fields left
out (CSV columns and JSON keys naming a time, a wall or a throughput; the ledger's ``cost.*`` rows; the
versions of the software and the code). A number matches when ``|rebuilt - published| <= ATOL + RTOL *
|published|``: float rounding differs between CPU kinds and compounds over a training run, so bitwise
equality is only expected on the machine kind that published. Text (a status, a verdict) must be equal.

The verdict is one line a reproducer can quote: reproduced bit for bit, reproduced within the tolerance
(with the largest difference and where), or not reproduced (the numbers that moved, by how much, and
the ledger verdicts that changed). A run whose files are byte for byte the published ones, wall-clock
columns included, was restored, not rebuilt: it is no evidence, and is said so.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from mwm.paths import inside
from mwm.plan.runs import Plan
from mwm.workflow.records import MANIFEST, RecordError, machine, parse_run_key, verify

__all__ = ["RTOL", "ATOL", "FileResult", "compare_text", "compare_config"]

#: The tolerance of a number (relative to the published value, plus an absolute floor).
RTOL = 1e-3
ATOL = 1e-6
#: Parts of a column or key name that mark a wall-clock measurement (or a ratio of them).
_TIMING = ("time", "wall", "tokens_per_s", "optimizer_share", "cost_vs", "seconds", "fastest")
#: Keys that name the software or the code, not a result.
_VOLATILE = {"code_version", "torch", "python", "numpy", "threads", "library_version"}


def _timing(name: str) -> bool:
    n = name.lower()
    return any(k in n for k in _TIMING) or n in _VOLATILE


@dataclass
class FileResult:
    """One file's comparison: ``numbers`` compared, the largest relative difference and where, and
    every difference beyond the tolerance (``moved``: (where, published, rebuilt))."""

    rel: str
    numbers: int = 0
    worst: tuple[float, str, str, str] | None = None  # (relative difference, where, published, rebuilt)
    moved: list[tuple[str, str, str]] = field(default_factory=list)
    identical: bool = True

    def value(self, where: str, pub: str, reb: str) -> None:
        if pub == reb:
            self.numbers += _is_number(pub)
            return
        self.identical = False
        a, b = _number(pub), _number(reb)
        if a is None or b is None:
            self.moved.append((where, pub, reb))
            return
        self.numbers += 1
        if math.isnan(a) and math.isnan(b):
            return
        diff = abs(b - a)
        rel = diff / abs(a) if a else (math.inf if diff else 0.0)
        if self.worst is None or rel > self.worst[0]:
            self.worst = (rel, where, pub, reb)
        if not (diff <= ATOL + RTOL * abs(a)):  # also catches a NaN on one side
            self.moved.append((where, pub, reb))

    def structure(self, what: str) -> None:
        self.identical = False
        self.moved.append((what, "", ""))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _is_number(text: str) -> bool:
    return _number(text) is not None


def _csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _compare_csv(res: FileResult, pub: str, reb: str) -> None:
    p, r = _csv_rows(pub), _csv_rows(reb)
    if not p or not r:
        if p != r:
            res.structure("one of the files is empty")
        return
    if p[0] != r[0]:
        res.structure(f"header {','.join(r[0])} is not the published {','.join(p[0])}")
        return
    keep = [i for i, c in enumerate(p[0]) if not _timing(c)]
    ledger = p[0][:1] == ["id"]
    if ledger:  # the ledger's rows by id; its per-step cost rows are wall clock
        pr = {row[0]: row for row in p[1:] if row and not row[0].startswith("cost.")}
        rr = {row[0]: row for row in r[1:] if row and not row[0].startswith("cost.")}
        for rid in sorted(set(pr) ^ set(rr)):
            res.structure(f"row {rid} only {'published' if rid in pr else 'rebuilt'}")
        pairs = [(f"row {rid}", pr[rid], rr[rid]) for rid in pr if rid in rr]
    else:
        if len(p) != len(r):
            res.structure(f"{len(r) - 1} rows, published {len(p) - 1}")
        pairs = [(f"line {i + 2}", a, b) for i, (a, b) in enumerate(zip(p[1:], r[1:]))]
    for where, a, b in pairs:
        for i in keep:
            res.value(f"{where}, {p[0][i]}", a[i] if i < len(a) else "", b[i] if i < len(b) else "")


def _flatten(obj, where: str = "") -> dict[str, str]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not _timing(str(k)):
                out.update(_flatten(v, f"{where}.{k}" if where else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{where}[{i}]"))
        return out
    return {where: json.dumps(obj) if not isinstance(obj, str) else obj}


def _compare_json(res: FileResult, pub: str, reb: str) -> None:
    try:
        p, r = _flatten(json.loads(pub)), _flatten(json.loads(reb))
    except ValueError as exc:
        res.structure(f"not valid JSON ({exc})")
        return
    for key in sorted(set(p) ^ set(r)):
        res.structure(f"key {key} only {'published' if key in p else 'rebuilt'}")
    for key in sorted(set(p) & set(r)):
        res.value(key, p[key], r[key])


def compare_text(rel: str, published: str, rebuilt: str) -> FileResult:
    """Compare one record's text with its rebuild's (CSV or JSON by the name)."""
    res = FileResult(rel)
    if rel.endswith(".csv"):
        _compare_csv(res, published, rebuilt)
    elif rel.endswith(".json"):
        _compare_json(res, published, rebuilt)
    elif published != rebuilt:
        res.structure("bytes differ")
    return res


def _rebuilt_path(rel: str, plan: Plan, figures: Path) -> Path:
    kind, _, rest = rel.partition("/")
    base = {"runs": Path(plan.folders["runs"]), "studies": Path(plan.folders["studies"]), "figures": figures}[kind]
    return inside(base, *Path(rest).parts, what="published record")


def compare_config(cfg: dict, folder: Path, root: str | Path, figures_root: str | Path, out: TextIO) -> int:
    """Print the comparison of ``root``'s rebuild with the records in ``folder``; 0 reproduced, 1 not,
    2 nothing to compare (or the records are damaged, of other numerics, or another config's)."""
    from mwm.numerics import VERSION

    def say(line=""):
        print(line, file=out)

    try:
        man = verify(folder)
    except RecordError as exc:
        say(f"error: {exc}")
        return 2
    if man["name"] != cfg["name"]:
        say(f"error: {folder / MANIFEST} is config {man['name']!r}'s, not {cfg['name']!r}'s")
        return 2
    if man["numerics"] != VERSION:
        say(f"cannot compare: the published records were made with numerics version {man['numerics']}, this code "
            f"is {VERSION}; a different number is expected, not a failure to reproduce")
        return 2
    plan = Plan(cfg, root)
    figures = Path(figures_root) / cfg["name"]
    results, missing, copies, foreign = [], [], [], []
    for key in sorted(man["runs"]):
        variant, seed = parse_run_key(key)
        here = plan.run(variant, seed).dir if variant in plan.variants and seed in plan.seeds else None
        summary = (here / "summary.json") if here else None
        if summary is None or not summary.is_file():
            continue
        try:
            problem = plan.problem(json.loads(summary.read_text()), variant, seed)
        except ValueError as exc:
            problem = f"summary.json is not valid JSON ({exc})"
        if problem:
            foreign.append(f"{summary}: {problem}")
        elif (here / "metrics.csv").is_file() and \
                (here / "metrics.csv").read_bytes() == (folder / "runs" / key / "metrics.csv").read_bytes():
            copies.append(key)  # its step times too: the published file itself
    studies = sorted(r for r in man["files"] if r.startswith("studies/"))
    study_copy = bool(studies) and all(
        (p := _rebuilt_path(r, plan, figures)).is_file() and p.read_bytes() == (folder / r).read_bytes()
        for r in studies)  # their wall_seconds too
    for rel in sorted(man["files"]):
        if rel.endswith(".npz"):
            continue  # spectra: their numbers are the spectral log's, compared there
        kind, _, rest = rel.partition("/")
        key = "/".join(rest.split("/")[:2]) if kind == "runs" else None
        if key in copies or (key and any(f.startswith(f"{plan.folders['runs']}/{key}/") for f in foreign)):
            continue
        if (kind == "studies" and study_copy) or (kind == "figures" and (copies or study_copy)):
            continue  # the published files, or drawn from them
        path = _rebuilt_path(rel, plan, figures)
        if not path.is_file():
            missing.append(rel)
            continue
        try:
            rebuilt = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            say(f"error: {path} cannot be read ({type(exc).__name__}: {exc})")
            return 2
        results.append(compare_text(rel, (folder / rel).read_text(), rebuilt))
    slices = man["slices"]
    say(f"published: {folder} ({len(man['runs'])} runs; made at {', '.join(sl['code_version'] for sl in slices)} "
        f"on {', '.join(dict.fromkeys(sl['machine']['cpu'] for sl in slices))})")
    this = machine()
    say(f"rebuilt:   {Path(root).as_posix()} on {this['cpu']} (torch {this['torch']})")
    for line in foreign:
        say(f"  not comparable, not the config's own run: {line}")
    if copies:
        say(f"  {len(copies)} run(s) in results/ are the published records themselves (restored, not rebuilt: their "
            f"step times match too), left out: {', '.join(copies)}")
    if study_copy:
        say("  the studies in results/ are the published records themselves (restored: their wall times match too), "
            "left out")
    if (copies or study_copy) and any(r.startswith("figures/") for r in man["files"]):
        say("  the ledger is left out: it was drawn from restored records")
    if missing:
        say(f"  {len(missing)} published file(s) not rebuilt here, left out (e.g. {missing[0]})")
    if not results:
        say("verdict: nothing rebuilt here to compare (run the workflow in a checkout where results/ was not "
            "restored, then compare)")
        return 2
    numbers = sum(r.numbers for r in results)
    moved = [(r.rel, *m) for r in results for m in r.moved]
    worst = max((r.worst + (r.rel,) for r in results if r.worst), default=None)
    tol = f"|rebuilt - published| <= {ATOL:g} + {RTOL:g} x |published|"
    what = f"{len(results)} files, {numbers} numbers"
    if foreign or missing:
        what += " (part of the published records: see above)"
    if not moved and all(r.identical for r in results):
        say(f"verdict: REPRODUCED on this machine, bit for bit: {what}")
        return 0
    if not moved:
        rel, where, pub, reb = worst[4], worst[1], worst[2], worst[3]
        say(f"verdict: REPRODUCED on this machine within float rounding ({tol}): {what}; the largest "
            f"relative difference {worst[0]:.2e} in {rel} ({where}: published {pub}, rebuilt {reb})")
        return 0
    files = sorted({m[0] for m in moved})
    say(f"verdict: NOT REPRODUCED on this machine: {len(moved)} value(s) in {len(files)} of {len(results)} files "
        f"moved beyond {tol}")
    verdicts = [m for m in moved if m[0].startswith("figures/ledger") and m[1].endswith(", verdict")]
    for rel, where, pub, reb in verdicts:
        say(f"  ledger verdict changed: {where.split(',')[0]}: published {pub!r}, rebuilt {reb!r}")
    finals = [m for m in moved if m[0].endswith("summary.json") and m[1] in ("final_val_loss", "status", "onset_step")]
    for rel, where, pub, reb in finals:
        say(f"  {rel}: {where} published {pub}, rebuilt {reb}")
    shown = [m for m in moved if m not in verdicts and m not in finals]

    def size(m):
        a, b = _number(m[2]), _number(m[3])
        return abs(b - a) / abs(a) if a and b is not None and not math.isnan(a - b) else math.inf

    for rel, where, pub, reb in sorted(shown, key=size, reverse=True)[:12]:
        say(f"  {rel}: {where}: published {pub or '-'}, rebuilt {reb or '-'}")
    if len(shown) > 12:
        say(f"  ... and {len(shown) - 12} more")
    return 1
