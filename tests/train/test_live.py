"""mwm.train.live: TensorBoard and DVCLive curves of a run (workflow.loggers) hold the values of its CSVs,
and a run resumed after a crash shows each step once."""

import csv
import math

import pytest

import fakedata
from mwm.train.cli import main
from mwm.train.loop import Run

pytest.importorskip("tensorboard")
pytest.importorskip("dvclive")


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh, delimiter="\t" if str(path).endswith(".tsv") else ","))


def _tensorboard(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _dvclive(folder, tag) -> list[tuple[int, float]]:
    name = tag.split("/")[-1]
    return [(int(r["step"]), float(r[name])) for r in _rows(folder / "plots" / "metrics" / f"{tag}.tsv")]


def _check(run_dir):
    metrics, evals, spectral = (_rows(run_dir / f) for f in ("metrics.csv", "eval.csv", "spectral.csv"))
    tb = _tensorboard(run_dir / "tensorboard")
    want = {"train/loss": [(int(r["step"]), float(r["train_loss"])) for r in metrics],
            "eval/val_loss": [(int(r["step"]), float(r["val_loss"])) for r in evals]}
    name = spectral[0]["name"]
    want[f"sigma_max/{name}"] = [(int(r["step"]), float(r["sigma_max"])) for r in spectral if r["name"] == name]
    for tag, rows in want.items():
        for got, where in ((tb[tag], "tensorboard"), (_dvclive(run_dir / "dvclive", tag), "dvclive")):
            assert [s for s, _ in got] == [s for s, _ in rows], (where, tag)  # each step once, in order
            for (_, a), (_, b) in zip(got, rows):  # TensorBoard keeps float32
                assert math.isclose(a, b, rel_tol=1e-6), (where, tag, a, b)


@pytest.mark.slow
def test_live_curves_equal_the_csvs_and_a_resumed_run_has_each_step_once(tiny_config, tmp_path, monkeypatch):
    cfg = tiny_config(workflow__loggers=["tensorboard", "dvclive"],
                      train__max_iters=12, train__lr_decay_iters=12, train__checkpoint_interval=4,
                      train__eval_interval=4)
    args = ["--config", str(cfg), "--assignment", "hetero", "--seed", "0", "--out", str(tmp_path / "out")]
    real = Run.train_step

    def crash_at_6(self, *a, **k):  # a hard failure after step 5 was logged; the checkpoint is at step 4
        if self.step == 6:
            raise RuntimeError("node lost")
        return real(self, *a, **k)

    monkeypatch.setattr(Run, "train_step", crash_at_6)
    with pytest.raises(RuntimeError, match="node lost"):
        main(args, data=fakedata.TOKENS)
    run_dir = tmp_path / "out" / "runs" / "tiny" / "hetero" / "seed0"
    assert [t for t, _ in _tensorboard(run_dir / "tensorboard")["train/loss"]] == list(range(6))
    monkeypatch.setattr(Run, "train_step", real)
    assert main(args, data=fakedata.TOKENS) == 0
    assert [int(r["step"]) for r in _rows(run_dir / "metrics.csv")] == list(range(12))
    _check(run_dir)


def test_without_a_logger_no_live_folder_is_written(tiny_config, tmp_path):
    cfg = tiny_config(train__max_iters=2, train__lr_decay_iters=2,
                      train__eval_interval=2)
    assert main(["--config", str(cfg), "--assignment", "none", "--seed", "0", "--out", str(tmp_path / "out")],
                data=fakedata.TOKENS) == 0
    run_dir = tmp_path / "out" / "runs" / "tiny" / "none" / "seed0"
    assert (run_dir / "metrics.csv").exists()
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "dvclive").exists()


def test_both_loggers_get_the_runs_parameters(tiny_config, tmp_path):
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(workflow__loggers=["tensorboard", "dvclive"], train__max_iters=2, train__lr_decay_iters=2,
                      train__eval_interval=2)
    assert main(["--config", str(cfg), "--assignment", "hetero", "--seed", "3", "--out", str(tmp_path / "out")],
                data=fakedata.TOKENS) == 0
    run_dir = tmp_path / "out" / "runs" / "tiny" / "hetero" / "seed3"
    params = yaml.safe_load((run_dir / "dvclive" / "params.yaml").read_text())
    assert params["assignment"] == "hetero" and params["seed"] == 3 and params["train.max_iters"] == 2
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in content
    assert b"train.max_iters" in content["_hparams_/session_start_info"]


def test_flat_params_keeps_numbers_and_spells_the_rest():
    from mwm.train.live import flat_params

    got = flat_params({"seed": 0, "train": {"lr": 1e-3, "cap": None, "divergence": {"stop": True}},
                       "paths": ["a", "b"]})
    assert got == {"seed": 0, "train.lr": 1e-3, "train.cap": "null", "train.divergence.stop": True,
                   "paths": "['a', 'b']"}


def test_dvc_hashes_no_live_folder_of_a_run():
    """The live folders are rebuilt from the CSVs: .dvcignore keeps them out of the runs stage's hash,
    so choosing a logger changes no tracked output."""
    from pathlib import Path

    pathspec = pytest.importorskip("pathspec")
    from mwm.train.live import LOGGERS

    root = Path(__file__).resolve().parents[2]
    spec = pathspec.GitIgnoreSpec.from_lines((root / ".dvcignore").read_text().splitlines())
    for name in LOGGERS:
        assert spec.match_file(f"results/runs/ci/hetero/seed0/{name}/events.out"), name
    assert not spec.match_file("results/runs/ci/hetero/seed0/metrics.csv")
    assert not spec.match_file("results/runs/ci/hetero/seed0/summary.json")
