"""The alpha and absorption studies: fits, batching, outputs, training pairs, config errors."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mwm.config import ConfigError, load_config, validate
from mwm.optim.dual_ascent import dual_ascent
from mwm.workflow.stages import STAGES
from mwm.studies import absorption, alpha
from mwm.studies.common import random_pairs, read_csv, variant_manifold, write_csv, write_json


pytestmark = pytest.mark.usefixtures("one_thread")


def studies_cfg(**sections):
    """A validated config whose studies section has the given subsections."""
    return validate({"name": "t", "studies": {"device": "cpu", **sections}})


TINY_ALPHA = {"sizes": [8, 12], "alpha_grid": {"min": 0.01, "max": 0.3, "num": 3}, "seeds": 2, "iterations": 12,
              "fit_min_n": 8, "outlier_n": 4, "compare_sizes": [12, 768], "tall_sizes": []}
TINY_ABS = {"sizes": [12], "seeds": 2, "reference_iterations": 40, "snapshots": [5, 10, 20, 30],
            "flatness_T": [5, 30], "manifolds": ["stiefel", "dgram-colnorm"]}


# -- alpha study ------------------------------------------------------------------------------

def test_power_law_fit_recovers_known_law():
    ns = [32, 64, 128, 256, 512, 1024]
    fit = alpha.power_law_fit(ns, [0.003 * n**0.67 for n in ns])
    assert fit["exponent"] == pytest.approx(0.67, abs=1e-9)
    assert fit["prefactor"] == pytest.approx(0.003, rel=1e-9)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(0)
    noisy = alpha.power_law_fit(ns, [0.003 * n**0.67 * math.exp(rng.normal(0, 0.3)) for n in ns])
    assert 0.0 < noisy["r2"] < 1.0 and abs(noisy["exponent"] - 0.67) < 0.5


def test_power_law_fit_degenerate_inputs_give_reasons():
    one = alpha.power_law_fit([64], [0.1])
    assert one["exponent"] is None and "two distinct sizes" in one["reason"]
    flat = alpha.power_law_fit([32, 64, 128], [0.1, 0.1, 0.1])
    assert flat["exponent"] == pytest.approx(0.0, abs=1e-12) and flat["r2"] is None and "same" in flat["reason"]


def test_alpha_grid_is_the_papers_and_reference_alphas_are_added():
    grid = alpha.alpha_grid({"min": 0.002, "max": 0.5, "num": 21})
    assert len(grid) == 21 and grid[0] == pytest.approx(0.002) and grid[-1] == pytest.approx(0.5)
    assert np.allclose(np.diff(np.log(grid)), math.log(250) / 20)
    assert grid[16] == pytest.approx(0.17, abs=0.005)  # the paper's n = 16 optimum is a grid point
    sec = studies_cfg()["studies"]["alpha"]
    run, on_grid = alpha.run_alphas(sec)
    assert run[:21] == grid and run[21:] == [0.01, 0.1] and on_grid == [True] * 21 + [False] * 2
    sec = dict(sec, reference_alphas=[0.5, 0.01])  # a reference alpha on the grid is not duplicated
    run, on_grid = alpha.run_alphas(sec)
    assert len(run) == 23 and on_grid.count(False) == 2


def test_batched_alpha_sweep_equals_separate_scalar_runs():
    alphas = [0.01, 0.1, 0.4]
    r = alpha._sweep("oblique", "retraction", 10, alphas, 2, 15, 0, torch.device("cpu"), 1 << 20)
    W, G = random_pairs("alpha", "oblique", 10, 2, 0)
    for ai, a in enumerate(alphas):
        for s in range(2):
            v = dual_ascent(W[s], G[s], variant_manifold("oblique"), alpha=a, steps=15, record_violations=True)
            assert np.allclose(r["traj"][:, ai, s], v.violations.double().numpy(), rtol=1e-3, atol=1e-7)
    # chunking (one matrix per call) does not change the numbers beyond rounding
    r1 = alpha._sweep("oblique", "retraction", 10, alphas, 2, 15, 0, torch.device("cpu"), 100)
    assert np.allclose(r["traj"], r1["traj"], rtol=1e-3, atol=1e-7)


def test_random_pairs_are_seeded_on_the_manifold_and_shared_across_variants():
    W1, G1 = random_pairs("x", "stiefel", 16, 3, 5, "exact")
    W2, G2 = random_pairs("x", "stiefel", 16, 3, 5, "exact")
    assert torch.equal(W1, W2) and torch.equal(G1, G2)
    assert variant_manifold("stiefel").constraint_residual(W1).max() < 1e-5
    _, G3 = random_pairs("x", "dgram-paper", 16, 3, 5)
    assert torch.equal(G1, G3)  # same draws for every variant
    W4, _ = random_pairs("x", "dgram-colnorm", 16, 3, 5)
    assert variant_manifold("dgram-colnorm").constraint_residual(W4).max() < 1e-4
    assert (W4.square().sum((-2, -1)).sqrt() / 4).sub(1).abs().max() < 0.5  # ||W||_F ~ sqrt(n)
    assert not torch.equal(random_pairs("x", "stiefel", 16, 1, 6)[1], G1[:1])


def test_dual_ascent_violation_decreases_on_oblique():
    W, G = random_pairs("t", "oblique", 16, 2, 0)
    v = dual_ascent(W, G, "oblique", alpha=0.1, steps=100, record_violations=True).violations
    assert (v[-1] < 0.1 * v[0]).all()


def test_exact_stiefel_init_makes_the_square_problem_start_solved():
    # square W exactly orthogonal: Lambda_0 already gives a tangent A (violation at rounding level)
    W, G = random_pairs("t", "stiefel", 32, 2, 0, "exact")
    v = dual_ascent(W, G, "stiefel", alpha=0.1, steps=1, record_violations=True).violations
    assert v.max() < 1e-5
    # a W off the manifold by 1e-2 does not
    v2 = dual_ascent(W * 1.01, G, "stiefel", alpha=0.1, steps=1, record_violations=True).violations
    assert v2.min() > 1e-3


def test_alpha_study_writes_tidy_outputs_and_derived_numbers(tmp_path):
    cfg = studies_cfg(alpha=TINY_ALPHA, precisions=["float32"])
    derived = alpha.run_alpha(cfg, tmp_path, log=lambda *_: None)
    assert sorted(os.listdir(tmp_path)) == sorted(STAGES["alpha"].outputs)  # what the manifest declares
    n_alpha = 3 + 1  # grid (0.01 is its first point) + 0.1 (off the grid)
    traj = read_csv(tmp_path / "alpha_trajectories.csv")
    main_rows = [r for r in traj if r["init"] == "msign"]
    assert len(main_rows) == 2 * n_alpha * 2 * 12
    ctrl = [r for r in traj if r["init"] == "exact"]
    assert len(ctrl) == 2 * 1 * 2 * 12 and {r["alpha"] for r in ctrl} == {"0.1"}
    final = read_csv(tmp_path / "alpha_final.csv")
    assert set(final[0]) == {"manifold", "init", "precision", "m", "n", "alpha", "on_grid", "seed", "init_residual",
                             "initial_violation", "final_violation"}
    last = {(r["n"], r["alpha"], r["seed"]): r["violation"] for r in main_rows if r["iteration"] == "12"}
    for r in final:
        if r["init"] == "msign":
            assert float(r["final_violation"]) == float(last[(r["n"], r["alpha"], r["seed"])])
    summary = read_csv(tmp_path / "alpha_summary.csv")
    assert len(summary) == 2 * n_alpha + 2

    on_disk = json.loads((tmp_path / "alpha_derived.json").read_text())
    st = on_disk["manifolds"]["stiefel"]
    grid = alpha.alpha_grid(TINY_ALPHA["alpha_grid"])
    for ps in st["per_size"]:
        assert ps["alpha_opt"] in grid
        grid_means = [float(r["mean"]) for r in summary
                      if r["init"] == "msign" and int(r["n"]) == ps["n"] and r["on_grid"] == "true"]
        assert len(grid_means) == 3 and ps["best_violation"] == min(grid_means)
    assert st["fit"]["sizes"] == [8, 12] and st["fit"]["exponent"] is not None
    assert st["outlier"]["observed_alpha_opt"] is None and "outlier size n=4" in st["outlier"]["reason"]
    assert st["default_vs_best"]["12"]["ratio"] is not None
    assert st["default_vs_best"]["768"]["ratio"] is None and "768" in st["default_vs_best"]["768"]["reason"]
    assert set(st["convergence"]) == {"8", "12"}
    assert set(st["exact_init_control"]["per_size"]) == {"8", "12"}
    assert on_disk["meta"]["device"] == "cpu" and on_disk["meta"]["wall_seconds"] >= 0
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert derived["manifolds"]["stiefel"]["fit"] == st["fit"]


def test_alpha_study_both_protocols_and_tall_shapes(tmp_path):
    sec = {**TINY_ALPHA, "tall_sizes": [4], "tall_aspects": [3, 4], "exact_init_control": False}
    d = alpha.run_alpha(studies_cfg(alpha=sec), tmp_path, log=lambda *_: None)
    assert d["faithful"] == "bfloat16" and d["precisions"] == ["bfloat16", "float32"]
    final = read_csv(tmp_path / "alpha_final.csv")
    shapes = {(r["precision"], int(r["m"]), int(r["n"])) for r in final}
    assert shapes == {(p, m, n) for p in ("bfloat16", "float32") for m, n in ((8, 8), (12, 12), (12, 4), (16, 4))}
    # the faithful protocol is what "manifolds" holds; the control sits beside it
    assert d["manifolds"] == d["protocols"]["bfloat16"]["manifolds"]
    tall = d["protocols"]["float32"]["tall"]["stiefel"]
    assert [(r["m"], r["n"]) for r in tall] == [(12, 4), (16, 4)]
    # a tall W on Stiefel: Lambda_0 does not solve the problem (square exact-init does, see below)
    assert all(r["initial_violation_mean"] > 1e-3 for r in tall)
    # bf16 msign leaves a violation floor far above float32's (the paper's alpha numbers are bf16 numbers)
    floor = {r["n"]: r["ratio"] for r in d["floor"]["float32"]}
    assert floor[12] > 100


@pytest.mark.slow
def test_alpha_cli_help_and_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        alpha.main(["--help"])
    assert exc.value.code == 0
    assert "--config" in capsys.readouterr().out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("studies:\n  device: cpu\n  alpha:\n    manifolds: [oblique]\n")
    rc = alpha.main(["--config", str(cfg), "--out", str(tmp_path / "o"), "studies.alpha.sizes=[8]",
                     "studies.alpha.seeds=1", "studies.alpha.iterations=5", "studies.alpha.alpha_grid.num=2",
                     "studies.alpha.compare_sizes=[8]", "studies.alpha.tall_sizes=[8]"])
    assert rc == 0
    d = json.loads((tmp_path / "o" / "alpha_derived.json").read_text())
    assert d["manifolds"]["oblique"]["fit"]["exponent"] is None  # one size: no fit, with a reason
    assert d["manifolds"]["oblique"]["fit"]["reason"]


def test_bad_studies_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("studies:\n  alpha:\n    sizez: [16]\n")
    with pytest.raises(ConfigError, match=r"studies\.alpha.*sizez"):
        load_config(cfg)
    assert alpha.main(["--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "sizez" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"studies\.absorption\.manifolds\.0"):
        validate({"name": "x", "studies": {"absorption": {"manifolds": ["dgram"]}}})
    with pytest.raises(ConfigError, match=r"studies\.alpha\.alpha_grid\.num"):
        validate({"name": "x", "studies": {"alpha": {"alpha_grid": {"num": 0}}}})


def test_shipped_configs_validate_with_the_papers_grid():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "config")
    paper = load_config(os.path.join(root, "paper.yaml"))["studies"]
    assert len(paper["alpha"]["sizes"]) == 14 and {64, 768} <= set(paper["alpha"]["sizes"])
    assert min(paper["alpha"]["sizes"]) == 16 and max(paper["alpha"]["sizes"]) == 1024
    assert paper["alpha"]["alpha_grid"] == {"min": 0.002, "max": 0.5, "num": 21}
    assert paper["alpha"]["seeds"] == 10 and paper["alpha"]["iterations"] == 100
    assert paper["absorption"]["reference_iterations"] == 200 and paper["absorption"]["eta"] == 0.1
    assert paper["absorption"]["snapshots"] == [5, 10, 20, 30, 50, 75, 100, 150]
    assert paper["absorption"]["manifolds"] == ["stiefel", "dgram-paper", "dgram-colnorm", "oblique"]
    # the faithful protocol first, float32 as the control; tall GPT-2 shapes in the alpha grid
    assert paper["precisions"] == ["bfloat16", "float32"] and paper["alpha"]["tall_aspects"] == [3, 4]
    assert load_config(os.path.join(root, "paper.yaml"))["train"]["msign_precision"] == "bfloat16"
    long = load_config(os.path.join(root, "long.yaml"))
    assert long["train"]["msign_precision"] == "bfloat16" and long["train"]["max_iters"] >= 2000
    assert long["grid"]["assignments"] == ["none", "stiefel", "dgram", "hetero", "hetero-inv"]
    for name in ("ci.yaml", "config.yaml"):
        load_config(os.path.join(root, name))


# -- absorption --------------------------------------------------------------------------------

def test_retraction_absorbs_part_of_the_direction_error():
    W, G = random_pairs("t", "stiefel", 24, 2, 0, "msign")
    W = W + 0.01 * torch.randn(W.shape, generator=torch.Generator().manual_seed(1))  # off-manifold: a real ascent
    r = absorption.measure_absorption(W, G, variant_manifold("stiefel"), 0.1, 60, [5, 20], 0.1)
    for T in (5, 20):
        assert (r[T]["e_W"] < r[T]["e_A"]).all()
        assert (r[T]["e_W"] <= r[T]["e_pre"] * 1.05).all()  # the retraction does not add error
        # the direction-to-weight factor is about ||W|| / (eta ||A||) = 1 / eta for square Stiefel
        assert torch.allclose(r[T]["e_A"] / r[T]["e_pre"], torch.full((2,), 10.0, dtype=torch.float64), rtol=0.1)


def test_absorption_study_outputs(tmp_path):
    cfg = studies_cfg(absorption=TINY_ABS, precisions=["float32"])
    d = absorption.run_absorption(cfg, tmp_path, log=lambda *_: None)
    assert sorted(os.listdir(tmp_path)) == sorted(STAGES["absorption"].outputs)
    rows = read_csv(tmp_path / "absorption.csv")
    assert len(rows) == 2 * 1 * 2 * 4
    assert set(rows[0]) == {"manifold", "precision", "n", "seed", "T", "e_A", "e_pre", "e_W", "e_W_step",
                            "violation"}
    assert all(float(r["e_W"]) >= 0 for r in rows)
    summ = read_csv(tmp_path / "absorption_summary.csv")
    assert len(summ) == 2 * 4
    st = d["manifolds"]["stiefel"]["per_size"]["12"]
    assert st["T"] == 20 and st["compression"] == pytest.approx(st["e_A"] / st["e_W"])
    assert st["compression"] == pytest.approx(st["direction_to_weight_factor"] * st["retraction_factor"])
    assert st["flatness"]["T"] == [5, 30] and st["flatness"]["e_W_ratio"] > 0
    assert read_csv(tmp_path / "absorption_pairs.csv") == [] and "pairs" not in d  # declared: header only
    on_disk = json.loads((tmp_path / "absorption_derived.json").read_text())
    assert on_disk["manifolds"]["dgram-colnorm"]["ranges_over_sizes"]["compression"] is not None


def test_absorption_missing_report_T_gives_null_with_reason(tmp_path):
    cfg = studies_cfg(absorption=dict(TINY_ABS, report_T=25, manifolds=["oblique"]))
    d = absorption.run_absorption(cfg, tmp_path, log=lambda *_: None)
    ps = d["manifolds"]["oblique"]["per_size"]["12"]
    assert ps["e_A"] is None and ps["compression"] is None and "report_T=25" in ps["reason"]


def test_absorption_snapshot_beyond_reference_is_named(tmp_path):
    cfg = studies_cfg(absorption=dict(TINY_ABS, snapshots=[5, 40]))
    with pytest.raises(ValueError, match=r"snapshots \[40\].*reference_iterations=40"):
        absorption.run_absorption(cfg, tmp_path)


def _write_pairs(path, with_g1=True):
    g = torch.Generator().manual_seed(3)
    shapes = [(24, 8), (8, 24), (24, 8), (16, 16)]
    mans = ["stiefel", "dgram", "none", "oblique"]
    arrays = {"names": np.array([f"transformer.h.{i}.mlp.c_fc.weight" for i in range(4)]),
              "manifolds": np.array(mans)}
    for i, ((m, n), man) in enumerate(zip(shapes, mans)):
        X = torch.randn(m, n, generator=g)
        W = variant_manifold({"dgram": "dgram-paper"}.get(man, "stiefel" if man == "none" else man)).init(X)
        arrays[f"W_{i}"] = W.numpy()
        if with_g1 or i != 1:
            arrays[f"G_{i}"] = (1e-3 * torch.randn(m, n, generator=g)).numpy()  # training-like small momentum
    np.savez(path, **arrays)


def test_absorption_on_training_pairs(tmp_path):
    _write_pairs(tmp_path / "pairs.npz")
    cfg = studies_cfg(absorption=dict(TINY_ABS, sizes=[8], seeds=1, pairs_rescale_g=True,
                                      manifolds=["stiefel", "dgram-paper", "dgram-colnorm", "oblique"]))
    d = absorption.run_absorption(cfg, tmp_path / "o", pairs=str(tmp_path / "pairs.npz"), log=lambda *_: None)
    rows = read_csv(tmp_path / "o" / "absorption_pairs.csv")
    # stiefel 1 + dgram 2 (both configured retractions) + oblique 1, each as-is and unit-RMS, 4 snapshots
    assert len(rows) == (1 + 2 + 1) * 2 * 4
    assert {(r["index"], r["manifold"]) for r in rows} == {("0", "stiefel"), ("1", "dgram-paper"),
                                                           ("1", "dgram-colnorm"), ("3", "oblique")}
    assert {r["m"] + "x" + r["n"] for r in rows if r["index"] == "1"} == {"8x24"}
    assert all(float(r["g_rms"]) == pytest.approx(1e-3, rel=0.3) for r in rows)
    pairs = d["pairs"]
    assert [s["manifold"] for s in pairs["skipped"]] == ["none"]
    assert len(pairs["per_pair"]) == 8 and set(pairs["by_manifold"]) == {
        f"{v}/{s}" for v in ("stiefel", "dgram-paper", "dgram-colnorm", "oblique") for s in ("as_is", "unit_rms")}
    assert all(p["e_W"] is not None and p["e_W"] >= 0 for p in pairs["per_pair"])
    assert d["pairs_file"].endswith("pairs.npz")


def test_absorption_cli_with_pairs_and_bad_pairs_file(tmp_path, capsys):
    _write_pairs(tmp_path / "bad.npz", with_g1=False)
    with pytest.raises(ValueError, match=r"bad\.npz has no key 'G_1'"):
        absorption.load_pairs(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        absorption.load_pairs(tmp_path / "nope.npz")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("studies:\n  device: cpu\n")
    rc = absorption.main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--pairs", str(tmp_path / "bad.npz"),
                          "studies.absorption.sizes=[8]", "studies.absorption.seeds=1"])
    assert rc == 2 and "G_1" in capsys.readouterr().err
    assert not (tmp_path / "o" / "absorption.csv").exists()  # the bad file fails before any work


def test_absorption_passes_over_a_truncated_pairs_file_to_the_next(tmp_path, capsys):
    """A truncated pairs.npz (a killed copy, a full disk): named with its reason, and the
    next listed file is used, as the preference list promises."""
    _write_pairs(tmp_path / "good.npz")
    whole = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("studies:\n  device: cpu\n")
    rc = absorption.main(["--config", str(cfg), "--out", str(tmp_path / "o"), "studies.absorption.sizes=[8]",
                          "studies.absorption.seeds=1", "studies.absorption.reference_iterations=12",
                          "studies.absorption.snapshots=[2,4]", "studies.absorption.flatness_T=[2,4]",
                          "studies.precisions=[float32]",
                          "--pairs", str(tmp_path / "cut.npz"), str(tmp_path / "junk.npz"), str(tmp_path / "good.npz")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "Traceback" not in err and f"pairs file {tmp_path / 'cut.npz'} is not a readable NPZ" in err
    d = json.loads((tmp_path / "o" / "absorption_derived.json").read_text())
    assert d["pairs_file"] == str(tmp_path / "good.npz") and d["pairs"]["per_pair"]
    assert [Path(p["file"]).name for p in d["pairs_not_captured"]] == ["cut.npz", "junk.npz"]
    assert all(p["reason"].startswith(f"pairs file {p['file']} is not a readable NPZ") for p in d["pairs_not_captured"])
    assert "BadZipFile" in d["pairs_not_captured"][0]["reason"]


def test_an_override_after_pairs_is_named_as_such(tmp_path):
    with pytest.raises(FileNotFoundError, match="overrides go before --pairs"):
        absorption.choose_pairs(["studies.threads=1"])


# -- output helpers ------------------------------------------------------------------------------

def test_atomic_outputs_are_parseable(tmp_path):
    write_csv(tmp_path / "a.csv", ["x", "y", "ok"], [(1, float("nan"), True), {"x": 2, "y": 0.5, "ok": None}])
    rows = read_csv(tmp_path / "a.csv")
    assert rows == [{"x": "1", "y": "nan", "ok": "true"}, {"x": "2", "y": "0.5", "ok": ""}]
    write_json(tmp_path / "d.json", {"a": float("inf"), "b": np.float32(0.25), "c": [torch.tensor(1.5)]})
    assert json.loads((tmp_path / "d.json").read_text()) == {"a": None, "b": 0.25, "c": [1.5]}
    assert sorted(os.listdir(tmp_path)) == ["a.csv", "d.json"]
    with pytest.raises(ValueError, match="row of 1 fields for 3 columns"):
        write_csv(tmp_path / "b.csv", ["x", "y", "z"], [(1,)])
    assert not (tmp_path / "b.csv").exists() and sorted(os.listdir(tmp_path)) == ["a.csv", "d.json"]


def test_the_shared_study_module_run_as_a_script_points_to_the_studies():
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    res = subprocess.run([sys.executable, "-m", "mwm.studies.common"], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "PYTHONPATH": str(src)})
    assert res.returncode == 2 and "python -m mwm.studies.{alpha,absorption,audits,solvers}" in res.stderr
