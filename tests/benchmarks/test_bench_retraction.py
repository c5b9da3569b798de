"""benchmarks/bench_retraction.py at a small shape: both polar solves form the same retraction as the
SVD reference, and Newton-Schulz needs more steps as the column norms spread."""

import torch

from conftest import load_benchmark
from mwm.optim.manifolds import retract_dgram_svd


def test_the_weights_spread_their_column_norms_by_kappa():
    bench = load_benchmark("bench_retraction")
    X = bench.dgram_weight(1, (40, 12), 100.0, torch.Generator().manual_seed(1))
    norms = X[0].norm(dim=0)
    assert 50 < float(norms.max() / norms.min()) < 200


def test_the_newton_schulz_form_matches_the_svd_and_slows_with_kappa():
    bench = load_benchmark("bench_retraction")
    fns = bench.candidates()
    steps = []
    for kappa in (1.0, 100.0):
        X = bench.dgram_weight(2, (40, 12), kappa, torch.Generator().manual_seed(2))
        ref = retract_dgram_svd(X)
        for name in ("eigh", "newton-schulz"):
            out, n = fns[name](X)
            assert torch.allclose(out, ref, atol=1e-9 * float(ref.abs().amax())), (name, kappa)
        steps.append(fns["newton-schulz"](X)[1])
        sigma = fns["eigvalsh"](X)[0]
        assert torch.allclose(sigma, torch.linalg.svdvals(X), rtol=1e-9)  # sorted descending, like svdvals
    assert steps[1] > steps[0]


def test_it_prints_a_ratio_row_per_kappa(capsys):
    bench = load_benchmark("bench_retraction")
    assert bench.main(["--shape", "40", "12", "--kappas", "1", "10", "--repeats", "1", "--bank", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "block total" in line]
    assert [r[0] for r in rows] == ["1", "10"] and all(float(r[4]) > 0 for r in rows)
