"""mwm.train.folder: what a run folder holds, against what its checkpoint recorded."""

from __future__ import annotations

from mwm.train.folder import RunFolder


def test_a_run_folder_holds_what_its_checkpoint_recorded_and_nothing_less(tmp_path):
    f = RunFolder(tmp_path, "c", "none", 0)
    f.dir.mkdir(parents=True)
    (f.dir / "metrics.csv").write_text("step,x\n" + "".join(f"{i},1.0\n" for i in range(6)))
    (f.dir / "eval.csv").write_text("step,val\n0,5\n4,4\n")
    (f.dir / "spectra").mkdir()
    for s in (0, 4):
        (f.dir / "spectra" / f"step_{s:06d}.npz").write_bytes(b"x")
    ext = f.extent(4)
    assert ext["metrics.csv"] == 4 and ext["eval.csv"] == 1 and ext["spectra"] == ["step_000000.npz"]
    assert ext["solver.csv"] is None and ext["pairs.npz"] is False
    assert f.holds(4, ext)
    (f.dir / "metrics.csv").write_text((f.dir / "metrics.csv").read_text() + "7,1.")  # a torn last row
    assert f.holds(4, ext)
    rows = (f.dir / "metrics.csv").read_text().splitlines()
    (f.dir / "metrics.csv").write_text("\n".join([rows[0], rows[1], *rows[1:]]) + "\n")  # step 0 twice
    assert not f.holds(4, ext)
    (f.dir / "metrics.csv").write_text("step,x\n" + "".join(f"{i},1.0\n" for i in range(6)))
    (f.dir / "spectra" / "step_000000.npz").unlink()
    assert not f.holds(4, ext)
    (f.dir / "spectra" / "step_000000.npz").write_bytes(b"x")
    (f.dir / "eval.csv").write_text("step,val\nx,5\n")  # a step that is no integer: cannot be continued
    assert not f.holds(4, ext)
    # an older checkpoint records no extent: metrics.csv must reach its step
    assert f.holds(4, None) and not f.holds(9, None)
