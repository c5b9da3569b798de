"""Inner solvers: warm start, tolerance stop, mixed banks, ADMM, work sharding, the study."""

import copy

import pytest
import torch
from torch import nn

import fakedata
from mwm.optim.assignments import OptimizerSettings, build_optimizers
from mwm.optim.dual_ascent import MixedProjector, dual_ascent
from mwm.optim.manifolds import get_manifold
from mwm.optim.muon import ManifoldMuon, _split_by_work
from mwm.optim.vocab import PAPER_TRAIN
from mwm.optim.solvers import SolverSettings, admm, clip_spectral, momentum_scale, scaled_solve, solve, solve_scale
from test_muon import Tiny, loss_of, train


def pair(m, n, name="stiefel", batch=(), seed=0, g_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    W = get_manifold(name).init(torch.randn(*batch, m, n, generator=g) / m**0.5)
    G = torch.randn(*batch, m, n, generator=g) * g_scale
    return W, G


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", ["stiefel", pytest.param("dgram", marks=pytest.mark.slow)])
def test_warm_start_from_the_solution_starts_converged(name):
    W, G = pair(48, 16, name, batch=(2,))
    long = dual_ascent(W, G, name, steps=300)
    cold = dual_ascent(W, G, name, steps=3, record_violations=True)
    warm = dual_ascent(W, G, name, steps=3, record_violations=True, Lambda0=long.Lambda)
    assert float(warm.violations[0].max()) < 0.05 * float(cold.violations[0].max())
    assert rel(warm.A, long.A) < 0.1 * rel(cold.A, long.A)


def test_warm_start_is_projected_onto_the_constraint():
    W, G = pair(40, 12, "dgram")
    L = torch.randn(12, 12)
    projected = get_manifold("dgram").project((L + L.mT) / 2)
    a = dual_ascent(W, G, "dgram", steps=4, Lambda0=L)
    b = dual_ascent(W, G, "dgram", steps=4, Lambda0=projected)
    assert torch.allclose(a.A, b.A, atol=1e-6)
    assert torch.allclose(a.Lambda.diagonal(), torch.zeros(12))
    with pytest.raises(ValueError, match="Lambda0 of shape"):
        dual_ascent(W, G, "dgram", Lambda0=torch.zeros(5, 5))


def test_tolerance_stops_each_matrix_independently_of_its_batch():
    W1, G1 = pair(48, 16, seed=2, g_scale=0.1)
    W2, G2 = pair(48, 16, seed=2, g_scale=1.0)
    W, G = torch.stack([W1, W2]), torch.stack([G1, G2])
    both = dual_ascent(W, G, steps=200, tol=2e-3, record_violations=True)
    for i, (w, g) in enumerate([(W1, G1), (W2, G2)]):
        alone = dual_ascent(w, g, steps=200, tol=2e-3)
        assert torch.allclose(both.A[i], alone.A, atol=2e-5)
        assert int(both.stopped[i]) == int(alone.stopped)
        assert get_manifold("stiefel").tangent_violation(w, alone.A) < 2e-3
    assert int(both.stopped[0]) < int(both.stopped[1])
    assert both.iterations == int(both.stopped.max()) < 200


def test_mixed_bank_equals_separate_solves():
    Ws, Gs = pair(40, 12, "stiefel", batch=(2,), seed=3)
    Wd, Gd = pair(40, 12, "dgram", batch=(2,), seed=4)
    W, G = torch.cat([Ws, Wd]), torch.cat([Gs, Gd])
    mixed = dual_ascent(W, G, ["stiefel", "stiefel", "dgram", "dgram"], steps=10)
    s = dual_ascent(Ws, Gs, "stiefel", steps=10)
    d = dual_ascent(Wd, Gd, "dgram", steps=10)
    assert torch.allclose(mixed.A, torch.cat([s.A, d.A]), atol=2e-5)
    with pytest.raises(ValueError, match="stiefel and dgram"):
        MixedProjector(["stiefel", "oblique"])


def test_clip_spectral_matches_svd():
    g = torch.Generator().manual_seed(5)
    for shape in [(30, 12), (12, 30)]:
        Z = torch.randn(*shape, generator=g) * 0.3
        U, S, Vh = torch.linalg.svd(Z.double(), full_matrices=False)
        ref = (U * S.clamp(max=1.0)) @ Vh
        assert rel(clip_spectral(Z).double(), ref) < 1e-4


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_admm_converges_to_the_dual_ascent_solution(name):
    W, G = pair(64, 16, name, batch=(2,), seed=6, g_scale=1e-2)
    ref = dual_ascent(W, G, name, steps=400).A
    res = admm(W, G, name, rho=1.0, steps=40, record_violations=True)
    assert rel(res.A, ref) < 1e-3
    assert float(res.violations[-1].max()) < 1e-4
    # scale invariance in G: the same direction for 1000 G, the multiplier scaled with it
    big = admm(W, 1000 * G, name, rho=1.0, steps=40)
    assert rel(big.A, res.A) < 1e-4
    assert rel(big.Lambda, 1000 * res.Lambda) < 1e-4
    with pytest.raises(TypeError, match="solve takes a SolverSettings, got str"):
        solve(W, G, name, "newton")


def _tiny_opts(seed=0, **solver):
    torch.manual_seed(seed)
    model = Tiny()
    return model, build_optimizers(model, "hetero",
                                   OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4, **solver)))


@pytest.mark.slow
@pytest.mark.parametrize("solver", [dict(warm_start=True), dict(warm_start=True, solver="admm", rho=2.0),
                                    dict(warm_start=True, tol=1e-3)])
def test_warm_state_round_trips_exactly(solver):
    model, opts = _tiny_opts(**solver)
    train(model, opts, steps=2)
    duals = [s["dual"] for s in opts.muon.state.values() if "dual" in s]
    assert len(duals) == 8 and all(d.shape == (8, 8) for d in duals)
    clone = copy.deepcopy(model)
    opts2 = build_optimizers(clone, "hetero",
                             OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4, **solver)),
                             init_on_manifold=False)
    opts2.load_state_dict(copy.deepcopy(opts.state_dict()))
    train(model, opts, steps=2)
    train(clone, opts2, steps=2)
    for (n, a), (_, b) in zip(model.named_parameters(), clone.named_parameters()):
        assert torch.equal(a, b), n


def test_warm_start_changes_the_update_and_cold_default_stores_nothing():
    model, opts = _tiny_opts()
    wmodel, wopts = _tiny_opts(warm_start=True)
    train(model, opts, steps=3)
    train(wmodel, wopts, steps=3)
    assert not any("dual" in s for s in opts.muon.state.values())
    w = model.transformer.h[0].mlp.c_fc.weight
    ww = wmodel.transformer.h[0].mlp.c_fc.weight
    assert not torch.equal(w, ww)
    assert rel(ww.detach(), w.detach()) < 0.05  # the same problem, solved from another start


PER_LAYER = {"transformer.h.0.mlp.*": "stiefel", "transformer.h.1.mlp.*": "dgram"}


@pytest.mark.slow
def test_equal_shapes_of_both_manifolds_share_one_bank_and_match_separate_optimizers():
    torch.manual_seed(0)
    model = Tiny()
    opts = build_optimizers(model, PER_LAYER, OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)))
    loss_of(model).backward()
    banks = [b for b in opts.muon._plan() if b[0][0]["manifold"] != "none"]
    assert len(banks) == 1 and sorted(g["manifold"] for g, _ in banks[0]) == ["dgram"] * 2 + ["stiefel"] * 2
    torch.manual_seed(0)
    ref = Tiny()
    ref_opts = build_optimizers(ref, PER_LAYER, OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)))
    for o in (opts, ref_opts):
        o.set_lr(PAPER_TRAIN["learning_rate"], PAPER_TRAIN["muon_lr"])
    separate = [ManifoldMuon([dict(g)], init_on_manifold=False) for g in ref_opts.muon.param_groups]
    for s in range(2):
        for m in (model, ref):
            for p in m.parameters():
                p.grad = None
            loss_of(m, s).backward()
        opts.step()
        for o in separate:
            o.step()
        ref_opts.adamw.step()
    for (n, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.allclose(a, b, atol=2e-5), n


def test_hetero_keeps_banks_of_different_heights_apart():
    model, opts = _tiny_opts()
    loss_of(model).backward()
    banks = opts.muon._plan()
    assert sorted(len(b) for b in banks) == [4, 4]
    assert all(len({g["manifold"] for g, _ in b}) == 1 for b in banks)


def test_work_split_is_balanced_and_contiguous():
    owners = _split_by_work([1.0] * 8, 2)
    assert owners == [0] * 4 + [1] * 4
    owners = _split_by_work([4.0, 1.0, 1.0, 1.0, 1.0], 2)
    assert owners == [0, 1, 1, 1, 1]
    assert _split_by_work([1.0, 2.0], 1) == [0, 0]
    torch.manual_seed(0)
    model = Tiny()
    opts = build_optimizers(model, "stiefel", OptimizerSettings.defaults(solver=SolverSettings.defaults(steps=4)))
    loss_of(model).backward()
    assert len(opts.muon._plan()) == 1  # one padded bank of 8 matrices: split in two
    opts.muon.shard(1, 2)
    pieces = opts.muon._pieces(opts.muon._plan())
    assert [o for o, _ in pieces] == [0, 1] and [len(e) for _, e in pieces] == [4, 4]


def test_bad_solver_settings_are_named():
    with pytest.raises(ValueError, match="unknown inner solver 'newton'; choose one of dual_ascent, admm"):
        SolverSettings.defaults(solver="newton")
    with pytest.raises(ValueError, match="solver_tol must be > 0"):
        SolverSettings.defaults(tol=0.0)
    with pytest.raises(ValueError, match="rho must be > 0"):
        SolverSettings.defaults(rho=-1.0)
    with pytest.raises(ValueError, match="steps >= 1"):
        SolverSettings.defaults(steps=0)
    # a param group that sets its own bad value is refused naming the group
    p = nn.Parameter(torch.randn(8, 4))
    with pytest.raises(ValueError, match="param group 0: rho must be > 0"):
        ManifoldMuon([{"params": [p], "manifold": "stiefel", "rho": 0.0}])
    with pytest.raises(TypeError, match="solver is a SolverSettings"):
        ManifoldMuon([{"params": [p], "manifold": "stiefel"}], solver="admm")


def test_settings_come_from_the_train_section_and_the_schema_holds_the_defaults():
    from mwm.config import defaults
    from mwm.config.names import SOLVERS
    from mwm.optim.solvers import _SOLVE

    s = SolverSettings.defaults()
    assert (s.solver, s.alpha, s.steps, s.tol, s.warm_start) == ("dual_ascent", 0.1, 20, None, False)  # the paper's
    train = dict(defaults("train"), solver="admm", solver_max_steps=2, admm_rho=2.0, warm_start=True,
                 msign_precision="bfloat16")
    t = SolverSettings.from_train(train)
    assert (t.solver, t.steps, t.rho, t.warm_start, t.precision) == ("admm", 2, 2.0, True, "bfloat16")
    assert SolverSettings.from_train(dict(train, solver_max_steps=None)).steps == train["dual_ascent_steps"]
    assert SolverSettings.of_group(t.group()) == t  # the optimizer's plain group entries hold them all
    assert tuple(_SOLVE) == SOLVERS


@pytest.mark.slow
def test_capture_sequence_and_solver_study(tmp_path):
    from mwm.config import load_config
    from mwm.studies.solvers import run_solvers

    cfg_path = fakedata.write_config(tmp_path / "tiny.yaml", train__warmup_iters=1)
    cfg = load_config(cfg_path, ["studies.solvers.capture_start=2", "studies.solvers.capture_length=3",
                                 "studies.solvers.reference_iterations=30", "studies.solvers.baseline_steps=30",
                                 "studies.solvers.converged_iterations=10",
                                 "studies.solvers.dual_ascent_steps=[5]", "studies.solvers.warm_steps=[3]",
                                 "studies.solvers.tols=[0.001]", "studies.solvers.admm_steps=[3]",
                                 "studies.solvers.admm_rho=[1.0]", "studies.device=cpu",
                                 "studies.solvers.normalized=true"])
    derived = run_solvers(cfg, tmp_path / "study", log=lambda *a: None, data=fakedata.TOKENS)
    from mwm.workflow.stages import STAGES

    # the manifest's files, besides the folder of its own capture trainings
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == sorted([*STAGES["solvers"].outputs, "_train"])
    run = tmp_path / "study" / "_train" / "runs" / "tiny" / "stiefel" / "seed0"
    assert sorted(f.name for f in (run / "sequence").iterdir()) == [f"step_{s:06d}.npz" for s in (2, 3, 4)]
    from mwm.studies.common import read_csv

    rows = read_csv(tmp_path / "study" / "solvers_summary.csv")
    by = {(r["candidate"], r["manifold"]): r for r in rows}
    # the baseline here is the reference itself: zero error, and cheaper candidates are worse
    for man in ("stiefel", "dgram"):
        assert float(by["da-cold-T30", man]["e_W"]) == 0.0
        assert float(by["da-cold-T5", man]["e_W"]) > 0.0
        assert float(by["da-cold-T5", man]["msign_ratio"]) == pytest.approx(5 / 30)
        assert float(by["admm-cold-T3-rho1", man]["msign_eq"]) == 6.0
        assert derived["by_manifold"][man]["baseline_msign_eq"] == 30.0
        for cand in ("da-cold-T30", "admm-cold-T3-rho1"):  # every candidate has its normalized twin
            plain, norm = by[cand, man], by[cand + "-norm", man]
            assert norm["normalize"] == "true" and plain["normalize"] == "false"
            assert 0 < float(plain["align_conv"]) <= 1 + 1e-6 and -1 <= float(plain["align"]) <= 1 + 1e-6
            assert 0 < float(norm["align_conv"]) <= 1 + 1e-6 and -1 <= float(norm["align"]) <= 1 + 1e-6
            # the two solves differ (Stiefel too: its weight scale is 1 but the momentum's is not), yet the
            # converged reference they are held against is the same problem
            assert norm["align_conv"] == plain["align_conv"]
    # the report draws the Pareto figure and the table from these files
    import json

    import pandas as pd
    from mwm.report.studies import fig_solvers

    st = {"solvers_summary.csv": pd.read_csv(tmp_path / "study" / "solvers_summary.csv"),
          "solvers_derived.json": json.loads((tmp_path / "study" / "solvers_derived.json").read_text())}
    fig_solvers(st, tmp_path / "pf")
    assert (tmp_path / "pf" / "fig_solvers_pareto.png").stat().st_size > 1000
    assert len(pd.read_csv(tmp_path / "pf" / "table_solvers.csv")) == 2

    # a config that reports the solver study alone (workflow.report: solvers) builds exactly
    # its figure and table from results/studies/<name>/; the full report wants the runs too
    from mwm.report.__main__ import build
    from mwm.report.load import ReportError

    results = tmp_path / "results"
    (results / "studies").mkdir(parents=True)
    (tmp_path / "study").rename(results / "studies" / cfg["name"])
    with pytest.raises(ReportError, match="missing"):
        build(cfg, results, tmp_path / "full")
    cfg["workflow"]["report"] = "solvers"
    out = build(cfg, results, tmp_path / "solvers_only")
    assert sorted(p.name for p in out.iterdir()) == [
        "fig_solvers_pareto.pdf", "fig_solvers_pareto.png",
        "table_solvers.csv", "table_solvers.md", "table_solvers.tex",
        "table_solvers_alignment.csv", "table_solvers_alignment.md", "table_solvers_alignment.tex"]
    assert (out / "table_solvers.csv").read_text() == (tmp_path / "pf" / "table_solvers.csv").read_text()
    (results / "studies" / cfg["name"] / "solvers_derived.json").unlink()
    with pytest.raises(ReportError, match="solvers_derived.json"):
        build(cfg, results, tmp_path / "solvers_only")


def test_a_sequence_argument_that_is_no_run_folder_fails_before_any_work(tmp_path, capsys):
    """`--sequence RUN key=value` hands the override to --sequence: named at once, nothing written."""
    from mwm.studies.solvers import main

    run = tmp_path / "run"
    (run / "sequence").mkdir(parents=True)
    cfg = fakedata.write_config(tmp_path / "tiny.yaml")
    rc = main(["--config", str(cfg), "--out", str(tmp_path / "out"), "--sequence", str(run),
               "studies.solvers.capture_length=2"])
    assert rc == 2 and "--sequence studies.solvers.capture_length=2: no run folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_capture_training_that_diverges_is_not_captured_with_its_reason(tmp_path):
    """The DGram capture training overflows at once (learning rates 1e6 through train_overrides):
    the study measures Stiefel, lists DGram as "not captured" with its onset, and the
    report's table says so; with every capture diverged the files hold headers only."""
    import json

    import pandas as pd
    from mwm.config import load_config
    from mwm.report.studies import fig_solvers
    from mwm.studies.common import read_csv
    from mwm.studies.solvers import run_solvers

    small = ["studies.solvers.capture_start=2", "studies.solvers.capture_length=2",
             "studies.solvers.reference_iterations=10", "studies.solvers.baseline_steps=5",
             "studies.solvers.converged_iterations=5", "studies.solvers.dual_ascent_steps=[2]",
             "studies.solvers.warm_steps=[]", "studies.solvers.tols=[]", "studies.solvers.admm_steps=[2]",
             "studies.solvers.admm_rho=[1.0]", "studies.device=cpu"]
    cfg_path = fakedata.write_config(tmp_path / "tiny.yaml", train__warmup_iters=0)
    cfg = load_config(cfg_path, small + ["grid.assignments=[stiefel,dgram]",
                                         "grid.train_overrides={dgram: {learning_rate: 1.0e+6, muon_lr: 1.0e+6}}"])
    derived = run_solvers(cfg, tmp_path / "one", log=lambda *a: None, data=fakedata.TOKENS)
    assert set(derived["by_manifold"]) == {"stiefel"}
    (missing,) = derived["not_captured"]
    assert missing["assignment"] == "dgram" and missing["reason"].startswith("unstable at step ")
    st = {"solvers_summary.csv": pd.read_csv(tmp_path / "one" / "solvers_summary.csv"),
          "solvers_derived.json": json.loads((tmp_path / "one" / "solvers_derived.json").read_text())}
    fig_solvers(st, tmp_path / "pf")
    table = pd.read_csv(tmp_path / "pf" / "table_solvers.csv")
    assert list(table.manifold) == ["stiefel", "dgram (assignment)"]
    assert table["cheapest matching"].iloc[1].startswith("not captured: unstable at step ")

    cfg = load_config(cfg_path, small + ["train.learning_rate=1e6", "train.muon_lr=1e6"])
    derived = run_solvers(cfg, tmp_path / "none", log=lambda *a: None, data=fakedata.TOKENS)
    assert derived["by_manifold"] == {} and [m["assignment"] for m in derived["not_captured"]] == ["stiefel", "dgram"]
    assert read_csv(tmp_path / "none" / "solvers.csv") == []
    st = {"solvers_summary.csv": pd.read_csv(tmp_path / "none" / "solvers_summary.csv"),
          "solvers_derived.json": json.loads((tmp_path / "none" / "solvers_derived.json").read_text())}
    fig_solvers(st, tmp_path / "pf2")
    assert (tmp_path / "pf2" / "fig_solvers_pareto.png").is_file()
    assert pd.read_csv(tmp_path / "pf2" / "table_solvers.csv")["cheapest matching"].str.startswith(
        "not captured: unstable at step ").all()


def test_grid_runs_capture_the_window_and_the_study_reads_them_without_training(tmp_path, monkeypatch):
    """studies.solvers.source: grid: the grid's stiefel and dgram runs at the study's seed save
    the window while they train (other runs: an empty sequence/, the same identity); the study
    then trains nothing and measures exactly those steps. A grid run that went unstable before
    the window is "not captured" with its reason, as a capture training of its own would be."""
    monkeypatch.chdir(tmp_path)  # the study reads the grid's runs under results/
    import json

    from mwm.config import config_hash, load_config
    from mwm.plan.runs import config_run_identity, run_dir
    from mwm.studies.solvers import run_solvers
    from mwm.train.cli import train

    small = ["studies.solvers.source=grid", "studies.solvers.capture_start=2", "studies.solvers.capture_length=3",
             "studies.solvers.reference_iterations=10", "studies.solvers.baseline_steps=5",
             "studies.solvers.converged_iterations=5", "studies.solvers.dual_ascent_steps=[2]",
             "studies.solvers.warm_steps=[]", "studies.solvers.tols=[]", "studies.solvers.admm_steps=[1]",
             "studies.solvers.admm_rho=[1.0]", "studies.device=cpu", "grid.assignments=[none,stiefel,dgram]",
             "grid.seeds=[0,1]"]
    cfg = load_config(fakedata.write_config(tmp_path / "tiny.yaml", train__warmup_iters=1), small)
    for a, seed in (("stiefel", 0), ("dgram", 0), ("stiefel", 1)):
        assert train(cfg, a, seed, out_root="results", data=fakedata.TOKENS) == 0
    seq = lambda a, s: sorted(f.name for f in (run_dir("results", "tiny", a, s) / "sequence").iterdir())  # noqa: E731
    assert seq("stiefel", 0) == seq("dgram", 0) == [f"step_{s:06d}.npz" for s in (2, 3, 4)]
    assert seq("stiefel", 1) == []  # not the study's seed: the declared folder, empty
    for a, s in (("stiefel", 0), ("stiefel", 1)):  # capturing is not part of what a run is
        summary = json.loads((run_dir("results", "tiny", a, s) / "summary.json").read_text())
        assert summary["config_hash"] == config_hash(config_run_identity(cfg, a, s))

    derived = run_solvers(cfg, tmp_path / "study", log=lambda *a: None, data=fakedata.TOKENS)
    assert not (tmp_path / "study" / "_train").exists()  # nothing trained twice
    assert derived["runs"] == [str(run_dir("results", "tiny", a, 0)) for a in ("stiefel", "dgram")]
    assert set(derived["by_manifold"]) == {"stiefel", "dgram"} and derived["not_captured"] == []
    assert set(derived["captured_steps"].values()) == {3}

    # the dgram grid run went unstable before the window: listed with its reason, stiefel measured
    dgram = run_dir("results", "tiny", "dgram", 0)
    for f in (dgram / "sequence").iterdir():
        f.unlink()
    summary = json.loads((dgram / "summary.json").read_text())
    (dgram / "summary.json").write_text(json.dumps({**summary, "status": "unstable", "onset_step": 1, "steps_done": 1}))
    derived = run_solvers(cfg, tmp_path / "study2", log=lambda *a: None, data=fakedata.TOKENS)
    assert set(derived["by_manifold"]) == {"stiefel"}
    (missing,) = derived["not_captured"]
    assert missing["assignment"] == "dgram" and missing["reason"].startswith("unstable at step 1")
    # a grid run not trained yet is an error naming it, not a silent empty study
    import shutil

    shutil.rmtree(run_dir("results", "tiny", "stiefel", 0))
    with pytest.raises(FileNotFoundError, match=r"stiefel/seed0: no sequence/ folder"):
        run_solvers(cfg, tmp_path / "study3", log=lambda *a: None, data=fakedata.TOKENS)


def test_capture_missing_reads_the_runs_summary(tmp_path):
    import json

    from mwm.studies.solvers import capture_missing

    sec = {"capture_start": 3, "capture_length": 2}
    (tmp_path / "sequence").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"status": "unstable", "onset_step": 1, "steps_done": 1}))
    assert capture_missing(tmp_path, sec) == ("unstable at step 1 (the capture training stopped at step 1; "
                                              "captured 0 of steps 3-4)")
    for s in (3, 4):
        (tmp_path / "sequence" / f"step_{s:06d}.npz").write_bytes(b"")
    assert capture_missing(tmp_path, sec) is None  # unstable later, but the window is there
    (tmp_path / "sequence" / "step_000004.npz").unlink()
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "onset_step": None, "steps_done": 5}))
    with pytest.raises(ValueError, match="ended with status completed but captured 1 of steps 3-4"):
        capture_missing(tmp_path, sec)


# ---------------------------------------------------------------------------------- the normalized solve
def dgram_pair(m, n, scale, spread=10.0, seed=0, dtype=torch.float64):
    """A DGram weight of largest column norm ``scale`` (norms spread ``spread``x) and a rank-2 momentum."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=dtype))
    d = torch.logspace(-torch.log10(torch.tensor(spread)).item(), 0, n, dtype=dtype)
    G = torch.randn(m, 2, generator=g, dtype=dtype) @ torch.randn(2, n, generator=g, dtype=dtype)
    return Q * d * scale, (G + 0.1 * torch.randn(m, n, generator=g, dtype=dtype)) * 1e-3


def alignment(G, A):
    return float((G * A).sum() / torch.linalg.matrix_norm(G, "nuc"))


@pytest.mark.parametrize("solver", ["dual_ascent", "admm"])
def test_scaled_solve_at_scale_one_is_the_plain_solve_bit_for_bit(solver):
    W, G = pair(48, 16, "dgram", batch=(3,))
    s = SolverSettings.defaults(solver=solver, steps=6)
    L0 = solve(W, G, "dgram", s).Lambda
    for kw in ({}, {"Lambda0": L0}):
        plain = solve(W, G, "dgram", s, **kw)
        for g in (None, torch.ones(3)):
            scaled = scaled_solve(W, G, "dgram", s, torch.ones(3), g, **kw)
            assert torch.equal(plain.A, scaled.A) and torch.equal(plain.Lambda, scaled.Lambda)


def test_solve_scale_is_the_dgram_sigma_max_and_one_elsewhere():
    W, _ = dgram_pair(60, 12, 7.0)
    assert float(solve_scale(W, "dgram")) == pytest.approx(float(torch.linalg.matrix_norm(W, 2)), rel=1e-12)
    assert float(solve_scale(W.mT, "dgram")) == pytest.approx(7.0, rel=1e-12)  # wide: its tall orientation
    assert float(solve_scale(W, "stiefel")) == 1.0
    both = torch.stack([W, W])
    assert solve_scale(both, ["dgram", "stiefel"]).tolist() == pytest.approx([7.0, 1.0], rel=1e-12)
    with pytest.raises(ValueError, match="one positive scale per matrix"):
        scaled_solve(W, W, "dgram", SolverSettings.defaults(), torch.zeros(()))


@pytest.mark.parametrize("solver", ["dual_ascent", "admm"])
@pytest.mark.parametrize("scale", [0.3, 10.0, 100.0])
def test_normalized_solve_does_not_depend_on_the_weights_scale(solver, scale):
    # scaling a DGram weight keeps its tangent space: the normalized solve of c W is the solve of W (at
    # largest column norm 1), A the same and the multiplier in c W's units
    W, G = dgram_pair(96, 32, 1.0)
    s = SolverSettings.defaults(solver=solver, steps=20, normalize=True)
    unit, scaled = solve(W, G, "dgram", s), solve(scale * W, G, "dgram", s)
    assert rel(scaled.A, unit.A) < 1e-10
    assert rel(scale * scaled.Lambda, unit.Lambda) < 1e-10


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
def test_normalized_solve_converges_to_the_optimum_at_any_scale(scale):
    # certified without a second solver: a feasible A (tangent, ||A||_2 <= 1) whose value tr(G^T A)
    # equals the dual value ||G + 2 W Lambda||_* (weak duality bounds every feasible value by it) is optimal
    W, G = dgram_pair(96, 32, scale)
    res = solve(W, G, "dgram", SolverSettings.defaults(solver="admm", steps=400, normalize=True))
    A, L = res.A, res.Lambda
    H = W.mT @ A + A.mT @ W
    assert float((H - torch.diag(H.diagonal())).norm() / (W.norm() * A.norm())) < 1e-9
    assert float(torch.linalg.matrix_norm(A, 2)) <= 1 + 1e-9
    primal = float((G * A).sum())
    dual = float(torch.linalg.matrix_norm(G + 2 * W @ L, "nuc"))
    assert dual - primal <= 1e-8 * dual


def test_the_papers_solve_loses_the_momentum_as_dgram_weights_grow_and_the_normalized_one_keeps_it():
    # the paper's 20 iterations at alpha 0.1 (its absolute multiplier step acts like c^2 alpha) against the
    # same 20 iterations on W / sigma_max; the optimum is the same at every scale
    plain, normal = SolverSettings.defaults(), SolverSettings.defaults(normalize=True)
    at_one = alignment(dgram_pair(96, 32, 1.0)[1], solve(*dgram_pair(96, 32, 1.0), "dgram", normal).A)
    for scale in (10.0, 30.0, 100.0):
        W, G = dgram_pair(96, 32, scale)
        a_norm = alignment(G, solve(W, G, "dgram", normal).A)
        a_plain = alignment(G, solve(W, G, "dgram", plain).A)
        assert a_norm == pytest.approx(at_one, abs=1e-9)
        assert a_norm > 0.8
        assert a_plain < a_norm - 0.3


@pytest.mark.parametrize("solver", ["dual_ascent", "admm"])
@pytest.mark.parametrize("g", [1e-5, 1e-2, 30.0])
def test_normalized_solve_does_not_depend_on_the_momentums_scale(solver, g):
    # msign ignores G's scale, so the problem's A is the same for c G; the normalized solve finds the same A
    # and a multiplier in c G's units (the paper's solve does not: its absolute step meets Lambda_0 ~ G)
    W, G = dgram_pair(96, 32, 5.0)
    s = SolverSettings.defaults(solver=solver, steps=20, normalize=True)
    unit, scaled = solve(W, G, "dgram", s), solve(W, (g / 1e-3) * G, "dgram", s)
    assert rel(scaled.A, unit.A) < 1e-10
    assert rel(scaled.Lambda / (g / 1e-3), unit.Lambda) < 1e-10
    warm = solve(W, (g / 1e-3) * G, "dgram", s, Lambda0=scaled.Lambda)
    assert rel(warm.A, solve(W, G, "dgram", s, Lambda0=unit.Lambda).A) < 1e-10


def test_momentum_scale_is_the_rms_singular_value_in_the_tall_orientation():
    _, G = dgram_pair(60, 12, 1.0)
    rms_sv = float(torch.linalg.svdvals(G).square().mean().sqrt())
    assert float(momentum_scale(G)) == pytest.approx(rms_sv, rel=1e-12)
    assert float(momentum_scale(G.mT)) == pytest.approx(rms_sv, rel=1e-12)
    zero = torch.zeros(2, 8, 4)
    assert bool((momentum_scale(zero) > 0).all())
    with pytest.raises(ValueError, match="one positive momentum scale per matrix"):
        scaled_solve(G, G, "dgram", SolverSettings.defaults(), torch.ones(()), torch.zeros(()))


@pytest.mark.parametrize("momentum", [1e-5, 1e-3, 1e-2])
@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
def test_normalized_solve_keeps_the_momentum_at_any_weight_and_momentum_scale(scale, momentum):
    # what the mechanism experiment's solver arm needs: within 0.05 of the optimum's alignment in the
    # paper's 20 iterations and in 10, where the paper's solve loses the momentum at small momentum scales
    W, G = dgram_pair(192, 64, scale)
    G = G * (momentum / 1e-3)
    best = alignment(G, solve(W, G, "dgram", SolverSettings.defaults(solver="admm", steps=500, normalize=True)).A)
    for steps in (20, 10):
        assert alignment(G, solve(W, G, "dgram", SolverSettings.defaults(normalize=True, steps=steps)).A) > best - 0.05
    if scale / momentum >= 1e4:  # where the absolute step overshoots the multiplier most
        assert alignment(G, solve(W, G, "dgram", SolverSettings.defaults()).A) < best - 0.3


def test_a_param_group_from_before_the_normalize_field_keeps_the_papers_solve():
    group = SolverSettings.defaults().group()
    del group["solver_normalize"]  # a checkpoint written before the key existed
    assert SolverSettings.of_group(group) == SolverSettings.defaults()
    with pytest.raises(ValueError, match="normalize must be True or False"):
        SolverSettings.defaults(normalize="yes")


def test_the_cheapest_matching_candidate_does_not_depend_on_the_clock():
    """Two candidates of equal msign cost that both match the baseline: the more accurate is the cheapest,
    whichever ran faster (the choice was the faster one, so a rebuild flipped it)."""
    from mwm.studies.solvers import COLUMNS, summarise

    def row(cand, e_w, msign, wall):
        r = dict.fromkeys(COLUMNS, 0.0)
        r.update(candidate=cand, solver=cand.split("-")[0], warm=False, steps=1, tol="", rho=1.0, manifold="dgram",
                 step=0, matrices=4, e_W=e_w, e_A=0.5, e_W_max=e_w, iterations=1.0, msign_eq=msign, wall_s=wall,
                 e_W_conv=e_w, e_A_conv=0.5, normalize=False, align=0.9, align_conv=0.9)
        return tuple(r[c] for c in COLUMNS)

    for walls in ((0.01, 0.02), (0.02, 0.01)):
        rows = [row("da-cold-T20", 0.009, 20.0, 0.1), row("admm-warm-T1-rho2", 0.0082, 2.0, walls[0]),
                row("admm-cold-T1-rho2", 0.0079, 2.0, walls[1])]
        _, derived = summarise(rows, "da-cold-T20")
        assert derived["by_manifold"]["dgram"]["cheapest_matching"]["candidate"] == "admm-cold-T1-rho2"


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_admm_continued_from_its_state_is_one_uninterrupted_solve(name):
    g = torch.Generator().manual_seed(3)
    W, _ = torch.linalg.qr(torch.randn(2, 48, 16, generator=g, dtype=torch.float64))
    if name == "dgram":
        W = W * torch.logspace(-1, 0, 16, dtype=torch.float64)
    G = torch.randn(2, 48, 16, generator=g, dtype=torch.float64)
    whole = admm(W, G, name, rho=2.0, steps=12)
    first = admm(W, G, name, rho=2.0, steps=5)
    rest = admm(W, G, name, rho=2.0, steps=7, Lambda0=first.Lambda, A0=first.A)
    assert torch.allclose(rest.A, whole.A, atol=1e-10) and torch.allclose(rest.Lambda, whole.Lambda, atol=1e-10)
    # a wide pair continues in its own orientation
    wide = admm(W.mT, G.mT, name, rho=2.0, steps=5)
    assert torch.allclose(admm(W.mT, G.mT, name, rho=2.0, steps=7, Lambda0=wide.Lambda, A0=wide.A).A,
                          whole.A.mT, atol=1e-10)
