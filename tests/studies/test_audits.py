"""Theory audits: softmax Jacobian, logit bound, growth bound and the spectral-log checker, tangent dimensions."""

import json
import math

import pytest
import torch

from mwm.config import validate
from mwm.train.schedule import muon_lr_series
from mwm.workflow.stages import STAGES
from mwm.studies import audits
from mwm.studies.common import read_csv, write_csv


pytestmark = pytest.mark.usefixtures("one_thread")


def audit_sec(**over):
    sec = validate({"name": "t", "studies": {"audits": over}})["studies"]["audits"]
    return sec


SMALL_SOFTMAX = {"sizes": [2, 3, 16], "random_per_size": 100, "adversarial_restarts": 3, "adversarial_steps": 60}
PAPER_TRAIN = {"learning_rate": 6e-4, "min_lr": 6e-5, "warmup_iters": 1000, "lr_decay_iters": 50000,
               "max_iters": 50000, "decay_lr": True, "muon_lr": 0.02}


def test_jacobian_identity_and_bound_hold_to_float_tolerance():
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(200, 12, generator=g, dtype=torch.float64)
         * torch.logspace(-2, 1.5, 200, dtype=torch.float64)[:, None])
    q = audits.softmax_quantities(z)
    explicit = audits.explicit_jacobian_fro2(z)
    assert torch.allclose(q["fro2"], explicit, rtol=1e-12, atol=1e-16)
    assert ((q["fro2"] - q["identity"]).abs() <= 1e-13 * q["s2"]).all()
    assert (q["fro2"] <= q["bound"] * (1 + 1e-12)).all() and (q["bound"] <= 0.25).all()
    # tightness: uniform softmax meets the left inequality, a two-way tie at n = 2 the 1/4
    u = audits.softmax_quantities(torch.zeros(1, 9, dtype=torch.float64))
    assert u["fro2"].item() == pytest.approx(u["bound"].item(), rel=1e-12)
    t = audits.softmax_quantities(torch.zeros(1, 2, dtype=torch.float64))
    assert t["bound"].item() == pytest.approx(0.25, abs=1e-15) and t["fro2"].item() == pytest.approx(0.25)


def test_saturated_softmax_norm_is_accurate():
    # one spike of 60 among 8: ||J||_F^2 is about 2 * 7 e^-60, far below float64's resolution of 1
    q = audits.softmax_quantities(torch.tensor([[60.0] + [0.0] * 7], dtype=torch.float64))
    eps = 7 * math.exp(-60)
    assert q["fro2"].item() == pytest.approx(2 * eps, rel=1e-6)
    assert q["bound"].item() == pytest.approx(2 * eps, rel=1e-6)


def test_corollary_fails_with_tied_top_logits_and_margin_version_holds():
    q = audits.softmax_quantities(torch.tensor([[10.0, 10.0, 0.0]], dtype=torch.float64))
    fro = q["fro2"].sqrt().item()
    assert fro == pytest.approx(0.5, abs=1e-4)
    assert q["corollary"].item() < 0.02 < fro  # the stated bound, 2 e^-5
    assert q["corollary_margin"].item() >= fro


def test_softmax_audit_reports_worst_slack_of_each_check():
    rows, summ = audits.audit_softmax(SMALL_SOFTMAX)
    assert summ["identity"]["holds"] and summ["identity"]["max_error_relative_to_s2"] < 1e-12
    assert summ["identity"]["entrywise_vs_formed_matrix_max_error"] < 1e-12
    assert summ["jacobian_formula_vs_autograd_max_error"] < 1e-12
    for check in ("bound", "quarter", "corollary_margin"):
        assert summ[check]["holds"] and summ[check]["violations"] == 0
        assert summ[check]["worst_slack"] > -1e-12
    assert summ["bound"]["max_ratio"] == pytest.approx(1.0, abs=1e-9)  # tight (uniform)
    assert not summ["corollary"]["holds"] and summ["corollary"]["worst_slack"] < -0.4
    assert summ["corollary"]["worst_at"]["margin"] == 0.0
    assert {r["family"] for r in rows} >= {"gaussian", "top_ties", "ramps_spikes", "ascent_corollary"}
    assert summ["bound"]["vectors"] == sum(r["vectors"] for r in rows if r["check"] == "bound")


def test_logit_bound_is_96_and_attained_by_a_stiefel_c_attn():
    rows, summ = audits.audit_logit_bound({"d": 768, "d_k": 64, "heads": 12, "tokens": 16})
    assert summ["bound"] == 96.0 and summ["matches_paper"] is True
    assert summ["attained"] and summ["constructed_stiefel_residual"] < 1e-12
    assert summ["constructed_layernorm_fixed"]
    assert 0 < summ["random_max_abs_logit"] < 96.0
    assert rows[1]["max_row_range"] == pytest.approx(192.0)
    with pytest.raises(ValueError, match="heads \\* d_k"):
        audits.audit_logit_bound({"d": 64, "d_k": 32, "heads": 4, "tokens": 4})


def test_growth_bound_for_the_paper_schedule():
    sec = audit_sec()["growth"]
    eta = audits.growth_bound_series(sec["schedule"])
    assert len(eta) == 50000
    assert eta.sum() == pytest.approx(sum(muon_lr_series(PAPER_TRAIN)), rel=1e-12)
    # warmup sums to 0.02 * 1000/2 = 10; the cosine part averages (0.02 + 0.002)/2 over 49000 steps
    assert eta[:1000].sum() == pytest.approx(10.0, rel=1e-9)
    assert eta[1000:].sum() == pytest.approx(0.011 * 49000, rel=1e-3)
    rows, summ = audits.audit_growth(sec, {"d": 64, "d_k": 16})
    assert summ["bound_at_end"] == pytest.approx(1 + eta.sum())
    assert summ["sigma_max_can_reach_threshold"] is False
    sq = next(v for k, v in summ["quantities"].items() if k.startswith("sigma_max_squared"))
    assert sq["reaches_threshold"] is True and 0.5 < sq["needed_fraction_of_max_growth_rate"] < 0.6
    assert summ["bound_after_steps"]["1000"] == pytest.approx(11.0)
    assert summ["polar_express_max_singular_value"]["direct"] < 1.01
    assert rows[-1][0] == 49999 and len(rows) <= 10001


def _spectral(path, rows):
    write_csv(path, ["step", "name", "layer", "module", "manifold", "sigma_max"], rows)


def test_spectral_checker_flags_only_growth_beyond_the_bound(tmp_path):
    train = dict(PAPER_TRAIN, max_iters=200, warmup_iters=0, lr_decay_iters=200, decay_lr=False)  # eta = 0.02
    rows = []
    for t in (0, 50, 100):
        rows.append((t, "h.0.attn.c_attn.weight", 0, "attn", "dgram", 1.0 + 0.02 * t))  # at the bound
        rows.append((t, "h.0.attn.c_attn.weight:W_Q", 0, "attn", "dgram", 0.5 + 0.02 * t))  # parent's base
        rows.append((t, "h.0.mlp.c_fc.weight", 0, "mlp", "stiefel", 1.0))
        rows.append((t, "h.1.attn.c_attn.weight", 1, "attn", "dgram", 1.0 + 0.05 * t))  # too fast
        rows.append((t, "h.1.mlp.c_fc.weight", 1, "mlp", "oblique", 1.0 + 0.5 * t))  # not checked
    _spectral(tmp_path / "spectral.csv", rows)
    out, summ = audits.check_spectral_log(tmp_path / "spectral.csv", train, threshold=4.0)
    bad = {(r["name"], r["step"]) for r in out if r["ok"] is False}
    assert bad == {("h.1.attn.c_attn.weight", 50), ("h.1.attn.c_attn.weight", 100)}
    assert summ["violations"] == 2 and not summ["holds"] and summ["skipped_manifolds"] == ["oblique"]
    sub = [r for r in out if r["name"].endswith(":W_Q")]
    assert all(r["base_sigma"] == 1.0 for r in sub)  # the parent's sigma at its first log
    first = next(r for r in out if r["name"] == "h.0.attn.c_attn.weight" and r["step"] == 100)
    assert first["bound"] == pytest.approx(1.0 + 0.02 * 101)  # steps 0..100 inclusive
    assert summ["first_over_threshold"]["name"] == "h.1.attn.c_attn.weight"
    assert summ["by_group"]["oblique/mlp"]["applicable"] is False


def test_spectral_checker_errors_name_file_and_column(tmp_path):
    write_csv(tmp_path / "s.csv", ["step", "name", "sigma_max"], [(0, "a", 1.0)])
    with pytest.raises(ValueError, match=r"s\.csv lacks column\(s\) module, manifold"):
        audits.check_spectral_log(tmp_path / "s.csv", PAPER_TRAIN)
    _spectral(tmp_path / "t.csv", [(0, "a", 0, "attn", "dgram", "big")])
    with pytest.raises(ValueError, match=r"t\.csv, data row 1: bad step or sigma_max"):
        audits.check_spectral_log(tmp_path / "t.csv", PAPER_TRAIN)
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        audits.check_spectral_log(tmp_path / "missing.csv", PAPER_TRAIN)


def test_tangent_dimensions_at_gpt2_small_shapes():
    rows, summ = audits.audit_tangent_dims(audit_sec()["tangent"])
    td = {(r["shape"], r["manifold"]): r["tangent_dim"] for r in rows}
    assert td[("768x2304", "stiefel")] == 2304 * 768 - 768 * 769 // 2
    assert td[("768x2304", "dgram")] == 2304 * 768 - 768 * 767 // 2
    assert td[("3072x768", "oblique")] == 3072 * 768 - 768
    assert all(r["minus_stiefel"] == 768 for r in rows if r["manifold"] == "dgram")
    tot = summ["totals_per_assignment"]
    assert tot["dgram"] - tot["stiefel"] == 12 * 4 * 768
    assert tot["hetero"] == tot["hetero-inv"] and tot["stiefel"] < tot["hetero"] < tot["dgram"] < tot["oblique"]


def test_audits_entry_point_writes_everything(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "studies:\n  device: cpu\n  audits:\n"
        "    softmax: {sizes: [2, 5], random_per_size: 20, adversarial_restarts: 1, adversarial_steps: 10}\n"
        "    logit_bound: {d: 64, d_k: 16, heads: 4, tokens: 8}\n"
        "train: {max_iters: 100, warmup_iters: 10, lr_decay_iters: 100}\n")
    _spectral(tmp_path / "spectral.csv", [(0, "w", 0, "attn", "dgram", 1.0), (99, "w", 0, "attn", "dgram", 1.5)])
    rc = audits.main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--spectral", str(tmp_path / "spectral.csv")])
    assert rc == 0
    o = tmp_path / "o"
    assert sorted(p.name for p in o.iterdir()) == sorted(STAGES["audits"].outputs)
    d = json.loads((o / "audits.json").read_text())
    assert set(d) >= {"softmax", "logit_bound", "growth", "tangent", "spectral_check", "meta"}
    assert d["spectral_check"]["schedule_from"] == "train section" and d["spectral_check"]["holds"] is True
    assert d["growth"]["config_train"]["max_iters"] == 100
    assert d["logit_bound"]["matches_paper"] is None  # not GPT-2 small's d, d_k
    for name in ("softmax_jacobian.csv", "logit_bound.csv", "growth_bound.csv", "tangent_dims.csv",
                 "spectral_check.csv"):
        assert read_csv(o / name)
    assert read_csv(o / "spectral_check.csv")[1]["ok"] == "true"


def test_without_a_spectral_log_the_check_file_is_its_header_and_the_reason_is_in_the_json(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("studies:\n  device: cpu\n  audits:\n"
                   "    softmax: {sizes: [2], random_per_size: 5, adversarial_restarts: 1, adversarial_steps: 5}\n"
                   "    logit_bound: {d: 16, d_k: 8, heads: 2, tokens: 4}\n")
    assert audits.main(["--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    o = tmp_path / "o"
    assert sorted(p.name for p in o.iterdir()) == sorted(STAGES["audits"].outputs)  # every declared output
    assert (o / "spectral_check.csv").read_text().count("\n") == 1 and read_csv(o / "spectral_check.csv") == []
    assert "no spectral log given" in json.loads((o / "audits.json").read_text())["spectral_check"]["reason"]


def test_msign_calls_are_counted_while_a_step_runs():
    from mwm.studies.audits import audit_msign_calls

    out = audit_msign_calls(n=16, iterations=(5, 20))
    assert out["muon"] == 1
    # dual ascent: one msign per iteration; the Stiefel retraction one more; DGram retracts by eigh or SVD
    assert out["by_iterations"]["5"] == {"stiefel": 6, "dgram": 5, "stiefel_over_muon": 6.0, "dgram_over_muon": 5.0}
    assert out["by_iterations"]["20"]["stiefel"] == 21
    import mwm.optim.dual_ascent
    import mwm.optim.msign

    assert mwm.optim.dual_ascent.msign is mwm.optim.msign.msign  # the counter is gone afterwards
