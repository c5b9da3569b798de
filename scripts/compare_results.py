"""Compare the results of one config between two checkouts (a refactor's before and after).

    python scripts/compare_results.py BEFORE_ROOT AFTER_ROOT [--config ci]

Each root is a repository checkout that ran ``snakemake --configfile config/<config>.yaml
all``. Compared byte for byte: every ``eval.csv``, ``attention.csv``, ``spectral.csv``
and every table and ledger under ``paper_figures/<config>/``, the study results under
``results/studies/<config>/`` (CSV and JSON), and every ``summary.json`` less its
timing and provenance fields (the checkout's absolute path is written as
``<checkout>/``). ``metrics.csv`` is compared without its timing columns.
Wall-clock fields are dropped everywhere: CSV columns and JSON keys naming a time, a
wall or a cost ratio, and the ledger's ``cost.*`` rows (per-step cost). Markdown and
LaTeX tables are compared through their CSV twin (the same rows, rendered). Exit status
0 when everything matches, 1 otherwise (the differing files are listed).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

#: summary.json fields that measure the machine or name the code, not the result
SUMMARY_VOLATILE = {"mean_step_time", "optimizer_share", "code_version"}


def _timing(name: str) -> bool:
    """Whether a column or key names a wall-clock measurement (or a ratio of them)."""
    n = name.lower()
    return any(k in n for k in ("time", "wall", "tokens_per_s", "optimizer_share", "cost_vs"))


def _csv_without_timing(text: str) -> str:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return text
    keep = [i for i, c in enumerate(rows[0]) if not _timing(c)]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for r in rows:
        if rows[0][:1] == ["id"] and r[0].startswith("cost."):
            continue  # the ledger's per-step cost rows
        w.writerow([r[i] for i in keep if i < len(r)])
    return out.getvalue()


def _json_without_timing(obj):
    if isinstance(obj, dict):
        return {k: _json_without_timing(v) for k, v in obj.items() if not _timing(k) and k not in SUMMARY_VOLATILE}
    if isinstance(obj, list):
        return [_json_without_timing(v) for v in obj]
    return obj


def _canonical(root: Path, rel: str) -> str:
    """The file's text less timing, with the checkout's own absolute path (a study
    records the config file it read) written as ``<checkout>``."""
    text = (root / rel).read_text().replace(str(root.resolve()) + "/", "<checkout>/")
    if rel.endswith(".json"):
        return json.dumps(_json_without_timing(json.loads(text)), sort_keys=True)
    if rel.endswith(".csv"):
        return _csv_without_timing(text)
    return text


def _files(root: Path, config: str) -> set[str]:
    out = set()
    for sub, patterns in (
        (f"results/runs/{config}", ("summary.json", "eval.csv", "metrics.csv", "attention.csv", "spectral.csv")),
        (f"results/studies/{config}", ("*.csv", "*.json")),
        (f"paper_figures/{config}", ("*.csv", "*.md", "*.tex")),
    ):
        base = root / sub
        for pat in patterns:
            out.update(str(f.relative_to(root)) for f in base.rglob(pat)
                       if f.suffix not in (".md", ".tex") or not f.with_suffix(".csv").exists())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--config", default="ci")
    args = ap.parse_args(argv)
    a, b = _files(args.before, args.config), _files(args.after, args.config)
    if not a:
        print(f"error: {args.before} holds no results of config {args.config!r}", file=sys.stderr)
        return 2
    bad = [f"only in {args.before}: {f}" for f in sorted(a - b)] + [f"only in {args.after}: {f}" for f in sorted(b - a)]
    same = 0
    for f in sorted(a & b):
        if _canonical(args.before, f) == _canonical(args.after, f):
            same += 1
        else:
            bad.append(f"differs: {f}")
    print(f"{same} of {len(a | b)} files identical (config {args.config})")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
