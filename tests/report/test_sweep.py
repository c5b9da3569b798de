"""mwm.report.sweep: per-run results -> per-(assignment, rate) summary -> stability edges and best
rates -> the sweep.* ledger values, on made-up runs whose answers are known."""

import numpy as np
import pandas as pd

from mwm import paper
from mwm.report.sweep import stability, summarize, sweep_ledger_values

RATES = (0.01, 0.02, 0.04, 0.08)


def results(spec):
    """``spec``: assignment -> {rate: [(status, final loss)] per seed}."""
    rows = []
    for a, by_rate in spec.items():
        for rate, seeds in by_rate.items():
            for seed, (status, loss) in enumerate(seeds):
                rows.append({"assignment": a, "rate": rate, "seed": seed, "variant": f"{a}-eta{rate:g}",
                             "status": status, "onset_step": 50.0 if status != "completed" else np.nan,
                             "final_val_loss": loss if status == "completed" else np.nan})
    return pd.DataFrame(rows)


def curve(best, unstable_from=None, base=4.0, seeds=3):
    """Losses over RATES with the minimum at ``best``; seeds unstable from ``unstable_from`` on."""
    out = {}
    for r in RATES:
        if unstable_from is not None and r >= unstable_from:
            out[r] = [("unstable", np.nan)] * seeds
        else:
            loss = base + 0.1 * abs(np.log2(r / best))
            out[r] = [("completed", loss + 0.001 * s) for s in range(seeds)]
    return out


def cfg(intervention=None):
    intervention = intervention or {}
    return {"train": {"muon_lr": 0.02}, "grid": {"intervention": intervention,
                                                 "train_overrides": {c: {"attn_sigma_cap": 1.0} for c in intervention}}}


def test_edge_counts_contiguous_stable_rates_and_best_skips_unstable_ones():
    res = results({"dgram": curve(0.08, unstable_from=0.04), "stiefel": curve(0.04)})
    # a seed unstable at a small rate ends the edge there even when larger rates look fine
    flaky = curve(0.02)
    flaky[0.02] = [("completed", 4.0), ("unstable", np.nan), ("completed", 4.0)]
    res = pd.concat([res, results({"hetero": flaky})])
    st = stability(summarize(res))
    assert st["dgram"].edge_rank == 2 and st["dgram"].edge == 0.02 and st["dgram"].first_unstable == 0.04
    assert st["dgram"].best == 0.02 and st["dgram"].onset == 50.0  # best among fully stable rates only
    assert st["stiefel"].edge_rank == len(RATES) and st["stiefel"].first_unstable is None
    assert st["stiefel"].best == 0.04
    assert st["hetero"].edge_rank == 1 and st["hetero"].best == 0.01 or st["hetero"].best == 0.04


def test_ledger_values_lead_to_each_verdict():
    caps = {"any", "sweep"}

    def verdicts(spec, intervention=None, seeds=3):
        vals = sweep_ledger_values(cfg(intervention), results(spec))
        return {cid: paper.judge(paper.claim(cid), x, caps=caps, seeds=seeds, reason=why)[0]
                for cid, (x, _, why) in vals.items()}

    paperlike = {"none": curve(0.02, base=4.4), "stiefel": curve(0.02, base=4.2), "hetero": curve(0.02, base=4.0),
                 "dgram": curve(0.02, unstable_from=0.04), "hetero-inv": curve(0.02, unstable_from=0.04),
                 "dgram-capped": curve(0.02)}
    v = verdicts(paperlike, {"dgram-capped": "dgram"})
    assert v == {"sweep.order_tuned": "reproduced", "loss.order": "reproduced", "sweep.shared_rate": "reproduced",
                 "sweep.stability_edge": "reproduced", "sweep.cap_restores": "reproduced"}
    # tuning can change the ordering: the shared rate keeps the paper's, each one's best reverses it
    none = curve(0.08, base=3.9)
    none[0.02] = [("completed", 4.5 + 0.001 * s) for s in range(3)]
    retuned = {**paperlike, "none": none}
    v = verdicts(retuned, {"dgram-capped": "dgram"})
    assert v["loss.order"] == "reproduced" and v["sweep.order_tuned"] == "not reproduced"

    reversed_ = {**paperlike, "none": curve(0.08, base=3.9), "stiefel": curve(0.02, unstable_from=0.01),
                 "hetero": curve(0.02, unstable_from=0.02), "dgram": curve(0.02), "hetero-inv": curve(0.02),
                 "dgram-capped": curve(0.02, unstable_from=0.04)}
    v = verdicts(reversed_, {"dgram-capped": "dgram"})
    assert v["sweep.stability_edge"] == "not reproduced"
    assert v["sweep.shared_rate"] == "not reproduced"  # none's best is 4x the shared rate
    assert v["sweep.cap_restores"] == paper.NC  # dgram never unstable: nothing to intervene on
    assert v["sweep.order_tuned"] == paper.NC  # stiefel has no stable rate

    capped_fails = {**paperlike, "dgram-capped": curve(0.02, unstable_from=0.04)}
    assert verdicts(capped_fails, {"dgram-capped": "dgram"})["sweep.cap_restores"] == "not reproduced"
    mixed = {**paperlike, "hetero-inv": curve(0.02)}  # one DGram-attention edge above the Stiefel ones
    assert verdicts(mixed)["sweep.stability_edge"] == paper.UNRESOLVED
    assert set(verdicts(paperlike, {"dgram-capped": "dgram"}, seeds=1).values()) == {paper.TOO_FEW}
