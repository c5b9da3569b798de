"""mwm.data.workers: the worker state a work unit reads, and the order-keeping process map (spawned, never
forked, so it is safe to start after torch's threads have run in the parent)."""

import numpy as np
import pytest
import torch

from mwm.data import workers
from mwm.data.corpora.units import TextUnit
from mwm.data.encode import encode_units


def _square(x):
    return x * x


@pytest.mark.parametrize("num_proc", [1, 2])
def test_map_ordered_keeps_the_jobs_order(num_proc):
    jobs = list(range(23))[::-1]
    assert list(workers.map_ordered(_square, jobs, num_proc)) == [x * x for x in jobs]


def test_state_is_replaced_looked_up_and_restored():
    before = workers.state_copy()
    try:
        workers.set_state({"ds": [1, 2]})
        assert workers.lookup("ds") == [1, 2]
        snap = workers.state_copy()
        workers.set_state(None)
        with pytest.raises(KeyError):
            workers.lookup("ds")
        assert snap == {"ds": [1, 2]}  # a copy: emptying the state left it whole
    finally:
        workers.set_state(before)


def test_in_process_encoding_restores_the_callers_state():
    from mwm.data.corpora import RowsUnit
    from mwm.data.encode import encode_units

    class Rows:  # a dataset's row-slice interface, as RowsUnit reads it
        def __getitem__(self, rows):
            return {"text": [f"row {r}" for r in rows]}

    workers.set_state({"mine": "kept"})
    try:
        out = list(encode_units([RowsUnit("train", "ds", [0, 1], "text")], 1, state={"ds": Rows()}))
        assert out[0][0] == "train" and out[0][2] == 2  # two documents, each ended by EOT
        assert workers.state_copy() == {"mine": "kept"}
    finally:
        workers.set_state(None)


def _run_torch_threads():
    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    (a @ a).sum().item()  # the intra-op pool now holds threads a fork would not carry


def test_workers_are_spawned_not_forked():
    assert workers.context().get_start_method() == "spawn"


def test_the_pool_keeps_job_order_after_torch_threads_ran():
    _run_torch_threads()
    jobs = [-5, 3, -1, 8, -13, 21]
    assert list(workers.map_ordered(abs, jobs, num_proc=2)) == [5, 3, 1, 8, 13, 21]


def test_two_workers_encode_as_one_process_does_after_torch_threads_ran():
    _run_torch_threads()
    units = []
    for i, split in enumerate(["train", "val", "train"]):
        u = TextUnit(split)
        u.add(f"Unit {i}: to be, or not to be.", True)
        u.add("That is the question", False)
        units.append(u)
    one = list(encode_units(units, num_proc=1))
    two = list(encode_units(units, num_proc=2))
    assert [(s, d) for s, _, d in two] == [(s, d) for s, _, d in one] == [("train", 1), ("val", 1), ("train", 1)]
    for (_, a, _), (_, b, _) in zip(one, two):
        assert a.dtype == b.dtype and np.array_equal(a, b) and len(a) > 0
