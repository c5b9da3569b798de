"""mwm.report.mechanism: runs -> the per-run failure rule -> the contrasts -> the mech.* ledger values and
verdicts, on made-up runs whose answers are known (config/mechanism.yaml's arms, rates and seeds)."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from mwm import paper
from mwm.config import load_config
from mwm.report.ledger import build_mechanism_ledger
from mwm.report.mechanism import contrasts, intervention_kind, mechanism_ledger_values, mechanism_results
from mwm.plan.variants import sweep_points

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(ROOT / "config" / "mechanism.yaml")
TOP = max(CFG["grid"]["sweep"]["muon_lr"])


def runs(loss):
    """Made-up runs of every sweep point of the config: ``loss(arm, rate, seed)`` -> final val loss, or None
    for a run that did not complete."""
    out = {}
    for variant, (arm, rate) in sweep_points(CFG["grid"]).items():
        for seed in CFG["grid"]["seeds"]:
            x = loss(arm, rate, seed)
            out[variant, seed] = SimpleNamespace(summary={"status": "completed" if x is not None else "unstable"},
                                                 eval=pd.DataFrame({"val_loss": [7.6, 7.6 if x is None else x]}))
    return out


def world(restorers=(), fails_at_top=True, mlp_restores=False):
    """Stiefel 5.0 and Hetero 5.1 everywhere; plain DGram-attention arms at 6.5 at the top rate (failed: the
    threshold is 5.1 + 0.5), 5.05 elsewhere; an intervention of a kind in ``restorers`` trains (5.05)."""
    def loss(arm, rate, seed):
        if arm in ("stiefel", "hetero"):
            return 5.0 if arm == "stiefel" else 5.1
        kind = intervention_kind(CFG["grid"], arm) if arm in CFG["grid"]["intervention"] else None
        if rate < TOP or not fails_at_top:
            return 5.05
        if kind in restorers or (kind == "mlp_control" and mlp_restores):
            return 5.05
        return None if seed % 2 else 6.5  # half the failures by divergence, half by stalling
    return mechanism_results(CFG, runs(loss))


def verdicts(res):
    ledger = build_mechanism_ledger(CFG, res).set_index("id")
    return {cid: ledger.loc[cid, "verdict"] for cid in ledger.index if cid.startswith("mech.")}


def test_the_failure_rule_reads_the_worse_reference_at_the_same_rate_and_seed():
    res = world()
    assert set(res[res.arm.isin(["stiefel", "hetero"])].failed) == {False}
    assert set(res.reference_loss) == {5.1}
    top = res[(res.arm == "dgram") & (res.rate == TOP)]
    assert set(top.failed) == {True}  # stalled (6.5 > 5.6) or not completed
    assert set(res[(res.arm == "dgram") & (res.rate < TOP)].failed) == {False}
    # 5.55 is inside the margin, 5.65 outside
    edge = mechanism_results(CFG, runs(lambda a, r, s: {"stiefel": 5.0, "hetero": 5.1}.get(a, 5.55 + 0.1 * (s % 2))))
    d = edge[edge.arm == "dgram"]
    assert list(d.failed) == [s % 2 == 1 for s in d.seed]


def test_each_verdict_of_the_experiment_follows_from_its_contrasts():
    assert verdicts(world(restorers=("cap",))) == {
        "mech.fails": "reproduced", "mech.cap_restores": "reproduced", "mech.normalized_restores": "not reproduced",
        "mech.mlp_cap_control": "reproduced", "mech.cause": "saturation supported"}
    assert verdicts(world(restorers=("normalized",)))["mech.cause"] == "solver supported"
    assert verdicts(world(restorers=("cap", "normalized")))["mech.cause"] == "both supported"
    assert verdicts(world(restorers=()))["mech.cause"] == "neither supported"
    # the MLP cap restoring too: attention is not where it breaks
    v = verdicts(world(restorers=("cap",), mlp_restores=True))
    assert v["mech.mlp_cap_control"] == "not reproduced" and v["mech.cause"] == "neither supported"
    # nothing fails: nothing to restore, every contrast and the cause not resolved
    v = verdicts(world(fails_at_top=False))
    assert v["mech.fails"] == "not reproduced"
    assert {v[k] for k in ("mech.cap_restores", "mech.normalized_restores", "mech.mlp_cap_control",
                           "mech.cause")} == {paper.UNRESOLVED}


def test_contrasts_pool_the_cells_of_both_baselines_and_pair_seeds():
    con = contrasts(CFG, world(restorers=("cap",)))
    seeds = len(CFG["grid"]["seeds"])
    assert con["cap"]["failed"] == 2 * seeds and con["cap"]["restored"] == 2 * seeds  # dgram and hetero-inv
    assert con["mlp_control"]["failed"] == seeds and con["mlp_control"]["restored"] == 0  # dgram only
    assert {c[2] for c in con["normalized"]["cells"]} == set(CFG["grid"]["seeds"])
    values = mechanism_ledger_values(CFG, world(restorers=("cap",)))
    assert values["mech.cap_restores"][0] == (2 * seeds, 2 * seeds)
    assert values["mech.fails"][0] == pytest.approx(1.0)


def test_other_configs_say_they_do_not_rebuild_the_mechanism_rows():
    from mwm.report.scale import capabilities

    default = load_config(ROOT / "config" / "config.yaml")
    assert "mechanism" not in capabilities(default) and "mechanism" in capabilities(CFG)
    sweep = load_config(ROOT / "config" / "sweep.yaml")
    assert "sweep" in capabilities(sweep) and "mechanism" not in capabilities(sweep)


def test_the_mechanism_configs_pair_fresh_seeds_across_every_kind_of_arm():
    from mwm.plan.checks import check_config

    others = set()
    for path in (ROOT / "config").glob("*.yaml"):
        if "mechanism" not in path.stem:
            others |= set(load_config(path)["grid"]["seeds"])
    for name in ("mechanism", "mechanism-gpt2", "ci-mechanism"):
        cfg = load_config(ROOT / "config" / f"{name}.yaml")
        check_config(cfg, f"config/{name}.yaml")
        assert cfg["workflow"]["report"] == "mechanism"
        kinds = {intervention_kind(cfg["grid"], c) for c in cfg["grid"]["intervention"]}
        assert kinds == {"cap", "normalized", "mlp_control"}
        if name != "ci-mechanism":
            assert len(cfg["grid"]["seeds"]) >= 6 and not set(cfg["grid"]["seeds"]) & others
            assert set(paper.DGRAM_ATTENTION) | set(paper.STIEFEL_ATTENTION) <= set(cfg["grid"]["assignments"])
            caps = [cfg["grid"]["train_overrides"][c]["attn_sigma_cap"] for c in cfg["grid"]["intervention"]
                    if intervention_kind(cfg["grid"], c) == "cap"]
            assert caps and all(c > 1.0 for c in caps)  # above the Stiefel level: the weights stay DGram
