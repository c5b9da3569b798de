"""mwm.data.workers: the worker state a work unit reads, and the order-keeping process map."""

import pytest

from mwm.data import workers


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
