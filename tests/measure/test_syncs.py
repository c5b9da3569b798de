"""mwm.measure.syncs: the counter counts what it says, and a training step's host reads do not
grow with the number of matrices or micro-batches (on a GPU each one is a sync)."""

import types

import pytest
import torch

import fakedata
from mwm.config import load_config
from mwm.measure.syncs import SyncCounter
from mwm.train.loop import Run


def _reads(x):
    x.sum().item()
    bool(torch.isfinite(x).all())
    float(x[0])
    x.tolist()
    torch.arange(4).tolist()  # integer: a CPU index tensor, left out


def test_counts_the_packages_float_and_bool_reads_not_integer_ones():
    x = torch.ones(3)
    # the same reads, as if made by a module of the package
    ours = types.FunctionType(_reads.__code__, {"__name__": "mwm.fake", "torch": torch})
    with SyncCounter("cpu") as c:
        _reads(x)  # this test module's own reads: not the package's
        assert c.count == 0
        ours(x)
    assert c.count == 4 and c.kind.startswith("host reads")
    ours(x)  # outside: not counted, and the methods are restored
    assert c.count == 4 and torch.Tensor.item.__name__ == "item"


def _reads_per_step(tiny_config, tmp_path, monkeypatch, assignment, n_layer, grad_accum, steps=2):
    path = tiny_config(f"c{n_layer}{grad_accum}.yaml", model__n_layer=n_layer, train__grad_accum=grad_accum)
    cfg = load_config(path)
    run = Run(cfg, assignment, 0, "paper", tmp_path / f"out{n_layer}{grad_accum}", data=fakedata.TOKENS)
    run.open_logs(0)
    run.train_step()  # the first step creates the optimizer state
    run.step += 1
    counts = []
    for _ in range(steps):
        with SyncCounter(run.device) as c:
            run.train_step()
        run.step += 1
        counts.append(c.count)
    assert len(set(counts)) == 1, counts
    return counts[0]


@pytest.mark.parametrize("assignment", ["none", pytest.param("hetero", marks=pytest.mark.slow),
                                        pytest.param("dgram", marks=pytest.mark.slow)])
def test_host_reads_per_step_do_not_grow_with_depth_or_micro_batches(tiny_config, tmp_path, monkeypatch,
                                                                     assignment):
    base = _reads_per_step(tiny_config, tmp_path, monkeypatch, assignment, n_layer=1, grad_accum=1)
    deeper = _reads_per_step(tiny_config, tmp_path, monkeypatch, assignment, n_layer=3, grad_accum=1)
    accumulated = _reads_per_step(tiny_config, tmp_path, monkeypatch, assignment, n_layer=1, grad_accum=3)
    # one gradient check for all matrices, per-bank checks (banks are per shape, not per
    # layer), one loss read per step: the same count at 1 and 3 layers, 1 and 3 micro-batches
    assert base == deeper == accumulated
    assert 0 < base < 20
