"""benchmarks/bench_step.py on a tiny config: the split of a step, the optimizer's ops and its
banks' padding, computed from the optimizer's own banks."""

import re

import pytest

import fakedata
from conftest import load_benchmark


def _bench():
    return load_benchmark("bench_step")


def test_flops_of_both_orders_grow_with_the_rows_only_through_the_m_terms():
    bench = _bench()
    for order in ("direct", "gram"):
        base = bench.bank_flops(64, 64, order, 20, 10)
        assert bench.bank_flops(128, 64, order, 20, 10) > base > 0
        assert bench.bank_flops(64, 64, order, 40, 10) == 2 * base  # linear in the iterations
    # the gram order's work in the rows is 3 products of m n^2 per iteration (and plain Muon's 3 once)
    assert bench.bank_flops(128, 64, "gram", 1, 10) - bench.bank_flops(64, 64, "gram", 1, 10) == 3 * 2 * 64 * 64 * 64
    assert bench.bank_flops(256, 64, "gram", None, 10) - bench.bank_flops(64, 64, "gram", None, 10) == \
        3 * 2 * 192 * 64 * 64


@pytest.mark.parametrize("assignment", ["none", "hetero"])
def test_measure_reports_the_split_the_ops_and_the_padding(tmp_path, monkeypatch, assignment):
    from mwm.config import load_config

    monkeypatch.setattr("mwm.train.resolve_data", lambda cfg: fakedata.FakeData())
    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    lines = _bench().measure(cfg, assignment, steps=2, warmup=1, out=tmp_path)
    head = lines[0]
    assert head.startswith(f"{assignment}: fwd+bwd ") and re.search(r"of the step\); evaluation \d+ ms", head)
    banks = [ln for ln in lines if ln.strip().startswith("bank ")]
    # tiny model (n_embd 16): c_attn 48x16, attn c_proj 16x16, c_fc 64x16, mlp c_proj 64x16 (tall), 2 layers
    if assignment == "none":
        assert len(banks) == 1 and "8 x 64x16" in banks[0] and "rows real 384, padded 512" in banks[0]
    else:  # hetero: attention (Stiefel) and MLP (DGram) banks of different heights stay apart
        assert sorted(b.split()[1] for b in banks) == ["dgram", "stiefel"]
        assert any("4 x 48x16" in b and "rows real 128, padded 192" in b for b in banks)
        assert any("calls/step" in ln for ln in lines)
    assert re.search(r"optimizer matmuls: [\d.]+ GFLOP a step, [\d.]+% on padding", lines[-1])
