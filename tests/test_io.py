"""mwm.io: atomic writes keep the old file and report the OS's error."""

import errno
import io
from pathlib import Path

import pytest
import torch

import mwm.io
from mwm.io import atomic_torch_save


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
