"""benchmarks/bench_quality.py at a tiny size: the alignment table against the weight scale, and the
measurement's share of a run, both printed from what this process measured."""

import re
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_scale_table_shows_the_papers_solve_losing_the_momentum_and_the_normalized_one_keeping_it(capsys):
    bench = load_benchmark("bench_quality")
    assert bench.main(["--scales", "--shape", "48", "16", "--draws", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line and "solver" not in line}
    paper, normal, best = rows["paper (20 it.)"], rows["20 it. on W / sigma_max"], \
        rows["optimum (ADMM on W / sigma_max, 500 it.)"]
    assert max(normal) - min(normal) < 0.02 and max(best) - min(best) < 0.02  # scale-free
    assert paper[-1] < normal[-1] - 0.3  # scale 100
    assert all(b >= n - 1e-9 for b, n in zip(best, normal))


def test_the_cost_is_printed_as_a_share_of_a_run(capsys):
    bench = load_benchmark("bench_quality")
    assert bench.main(["--cost", "--config", str(ROOT / "config" / "ci.yaml"), "--assignment", "dgram",
                       "--steps", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    share = re.search(r"dgram: step \d+ ms, measurement \d+ ms = [\d.]+ steps; share of a run: ([\d.]+)%", out)
    assert share and 0 < float(share.group(1)) < 100


def test_the_solve_cost_is_printed_as_a_ratio_of_alternating_rounds(capsys):
    bench = load_benchmark("bench_quality")
    assert bench.main(["--solve-cost", "--shape", "48", "16", "--bank", "2", "--repeats", "2",
                       "--precision", "float32", "--admm", "1", "10"]) == 0
    out = capsys.readouterr().out
    assert "2 x DGram 48x16, the paper's 20 iterations of dual ascent against each, float32 msign, one thread, " \
           "2 alternating rounds:" in out
    for label in ("plain", "normalized", "normalized ADMM rho 1, 10 it."):
        m = re.search(rf"  {re.escape(label)}: [\d.]+ ms; / plain: median ([\d.]+) \(min ([\d.]+), max ([\d.]+)\)", out)
        assert m and 0 < float(m.group(2)) <= float(m.group(1)) <= float(m.group(3)), (label, out)
    assert "plain: median 1.000 (min 1.000, max 1.000)" in out  # the baseline against itself
