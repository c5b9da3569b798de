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


def test_the_pairs_check_prints_each_candidate_per_module_kind(tmp_path, capsys):
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(0)
    names, mfs, arrays = [], [], {}
    for i, (name, mf, shape) in enumerate([("h.0.attn.c_proj.weight", "dgram", (32, 32)),
                                           ("h.0.mlp.c_fc.weight", "stiefel", (64, 32)),
                                           ("h.1.mlp.c_fc.weight", "dgram", (64, 32))]):
        Q, _ = torch.linalg.qr(torch.randn(*shape, generator=g))
        arrays[f"W_{i}"] = (Q * (20.0 if mf == "dgram" else 1.0)).numpy()
        arrays[f"G_{i}"] = (1e-3 * torch.randn(*shape, generator=g)).numpy()
        names.append(name)
        mfs.append(mf)
    f = tmp_path / "step_000010.npz"
    np.savez(f, names=np.array(names), manifolds=np.array(mfs), **arrays)
    bench = load_benchmark("bench_quality")
    assert bench.main(["--pairs", str(f), "--precision", "float32", "--admm", "1", "10"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0][2:] for r in rows] == ["paper (20 it. dual ascent)", "normalized dual ascent (20 it.)",
                                                    "normalized ADMM rho 1, 10 it."]
    for r in rows:
        cells = [float(x) for x in r.strip("| ").split(" | ")[1:]]
        assert len(cells) == 4 and all(np.isfinite(cells))
    admm = [float(x) for x in rows[2].strip("| ").split(" | ")[1:]]
    assert admm[0] > 0.8 and admm[1] < 0.05  # a solve that follows the momentum, near the tangent space
