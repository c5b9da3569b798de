"""benchmarks/bench_step.py on a tiny config: the split of a step, the optimizer's ops and its
banks' padding, computed from the optimizer's own banks."""

import re

import pytest

import fakedata
from conftest import load_benchmark


def _bench():
    return load_benchmark("bench_step")


def test_flops_of_both_orders_grow_with_the_rows_only_through_the_m_terms():
    gpu = load_benchmark("bench_gpu")  # the one FLOP model bench_step reads
    for order in ("direct", "gram"):
        base = gpu.update_flops(64, 64, "stiefel", "dual_ascent", 20, 10, order)
        assert gpu.update_flops(128, 64, "stiefel", "dual_ascent", 20, 10, order) > base > 0
        it = gpu.dual_iteration_flops(64, 64, 10, order)
        assert gpu.update_flops(64, 64, "dgram", "dual_ascent", 40, 10, order) - \
            gpu.update_flops(64, 64, "dgram", "dual_ascent", 20, 10, order) == 20 * it  # linear in the iterations
    # the gram order's work in the rows is 3 products of m n^2 per iteration (and plain Muon's 4 once)
    assert gpu.dual_iteration_flops(128, 64, 10, "gram") - gpu.dual_iteration_flops(64, 64, 10, "gram") == \
        3 * 2 * 64 * 64 * 64
    assert gpu.update_flops(256, 64, "none", "dual_ascent", 20, 10, "gram") - \
        gpu.update_flops(64, 64, "none", "dual_ascent", 20, 10, "gram") == 4 * 2 * 192 * 64 * 64
    # the direct order is the released one bench_gpu always counted
    assert gpu.dual_iteration_flops(256, 64, 10) == gpu.msign_flops(256, 64, 10) + 2 * 2 * 256 * 64 * 64


@pytest.mark.parametrize("assignment", ["none", "hetero"])
def test_measure_reports_the_split_the_ops_and_the_padding(tiny_config, tmp_path, assignment):
    from mwm.config import load_config

    cfg = load_config(tiny_config())
    lines = _bench().measure(cfg, assignment, steps=2, warmup=1, out=tmp_path, data=fakedata.TOKENS)
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
    assert re.search(r"optimizer matmuls: [\d.e+-]+ GFLOP a step, [\d.]+% on padding", lines[-1])


def test_a_variant_is_measured_with_its_grid_overrides(tiny_config, tmp_path):
    """hetero-admm is hetero's manifolds with ADMM (grid.train_overrides): its optimizer must
    be counted and timed with ADMM's one step, not hetero's dual ascent, as mwm.train runs it."""
    from mwm.config import load_config

    path = tiny_config(
        grid__assignments=["hetero", "hetero-admm"],
        grid__custom={"hetero-admm": {"*.attn.*": "stiefel", "*.mlp.*": "dgram"}},
        grid__train_overrides={"hetero-admm": {"solver": "admm", "warm_start": True, "solver_max_steps": 1}})
    cfg = load_config(path)

    def gflop(assignment):
        last = _bench().measure(cfg, assignment, steps=1, warmup=1, out=tmp_path / assignment,
                                data=fakedata.TOKENS)[-1]
        return float(re.search(r"optimizer matmuls: ([\d.e+-]+) GFLOP", last).group(1))

    gpu = load_benchmark("bench_gpu")
    # one ADMM step costs less than hetero's 3 dual-ascent iterations in the FLOP model itself
    assert gpu.update_flops(64, 16, "dgram", "admm", 1, 10) < gpu.update_flops(64, 16, "dgram", "dual_ascent", 3, 10)
    assert gflop("hetero-admm") < gflop("hetero")
