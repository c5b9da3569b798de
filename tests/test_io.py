"""mwm.io: atomic writes keep the old file and report the OS's error."""

import errno
import io
from pathlib import Path

import pytest
import torch

import mwm.io
from mwm.io import atomic_torch_save
import json
import os
import stat
import fakedata
from mwm.config import load_config


class FullDisk:
    """A file opened for writing on a disk with ``room`` bytes left: the write that passes
    it writes what fits, then raises ENOSPC (as a full filesystem does)."""

    def __init__(self, path, mode, room):
        self.fh = io.open(path, mode)
        self.room = room

    def write(self, data):
        data = bytes(data)
        if len(data) > self.room:
            self.fh.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def flush(self):
        self.fh.flush()

    def close(self):
        self.fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def full_disk_for(monkeypatch, match, after=0, room=1000):
    """Make mwm.io's writes of files whose name contains ``match`` hit a full disk, from
    the ``after``-th one on (the earlier ones succeed); returns the list of failed paths."""
    seen, failed = [], []

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and match in Path(path).name:
            seen.append(path)
            if len(seen) > after:
                failed.append(path)
                return FullDisk(path, mode, room)
        return io.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(mwm.io, "open", fake_open, raising=False)
    return failed


def test_a_full_disk_during_torch_save_raises_the_os_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    atomic_torch_save(path, {"w": torch.ones(3)})
    failed = full_disk_for(monkeypatch, ".ckpt.pt.")
    with pytest.raises(OSError) as info:
        atomic_torch_save(path, {"w": torch.zeros(100_000)})
    assert failed and info.value.errno == errno.ENOSPC
    assert "No space left on device" in str(info.value) and str(path) in str(info.value)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))  # the old one, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temp file left


# -- umask and strict JSON ----------

@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_honour_the_umask(tmp_path, mask, mode):
    from mwm.studies.common import write_csv, write_json

    old = os.umask(mask)
    try:
        rc, d = fakedata.run_main(tmp_path, train__capture_pairs_step=2)
        write_csv(tmp_path / "study" / "a.csv", ["x"], [[1.0]])
        write_json(tmp_path / "study" / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert rc == 0
    files = [p for p in d.rglob("*") if p.is_file()] + list((tmp_path / "study").iterdir())
    assert {"summary.json", "final.pt", "pairs.npz", "metrics.csv", "a.csv"} <= {p.name for p in files}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == mode, (p, oct(p.stat().st_mode))


def test_summary_is_strict_json_with_reasons(tmp_path):
    from mwm.train.loop import Run

    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml"))
    run = Run(cfg, "none", 0, "paper", tmp_path / "out", data=fakedata.TOKENS)
    run.last_val = float("nan")
    run.divergence.best_val = float("inf")
    run.write_summary(status="unstable")

    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    s = json.loads((run.dir / "summary.json").read_text(), parse_constant=refuse)
    assert s["final_val_loss"] is None and s["non_finite"]["final_val_loss"] == "nan"
