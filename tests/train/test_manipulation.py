"""The manipulation checks: made-up solver.csv / attention.csv rows in, pass/fail out."""

import math

from mwm.train import manipulation as m


def solver_rows(steps, align=0.95, conv=1.0, viol=0.01, modules=("attn", "mlp")):
    return [{"step": s, "module": mod, "alignment": align, "alignment_converged": conv, "violation": viol}
            for s in steps for mod in modules for _ in range(3)]


def attention_rows(steps, entropy=1.0, layers=2, heads=2):
    return [{"step": s, "layer": layer, "head": h, "entropy_mean": entropy}
            for s in steps for layer in range(layers) for h in range(heads)]


def test_solver_check_passes_at_the_thresholds_and_fails_just_beyond():
    at = m.ALIGNMENT_SHARE * 0.8
    assert m.solver_check(solver_rows([0, 50, 100], align=at + 1e-9, conv=0.8))["passed"] is True
    assert m.solver_check(solver_rows([0, 50, 100], align=at - 1e-3, conv=0.8))["passed"] is False
    assert m.solver_check(solver_rows([50], viol=m.VIOLATION_MAX))["passed"] is True
    assert m.solver_check(solver_rows([50], viol=m.VIOLATION_MAX * 1.01))["passed"] is False


def test_solver_check_reads_only_steps_from_50_on_and_names_the_failed_ones():
    rows = solver_rows([0, 25], align=0.1) + solver_rows([50, 75]) + solver_rows([100], align=0.2)
    out = m.solver_check(rows)
    assert out["evaluations"] == 3 and out["failed_steps"] == [100] and out["passed"] is False
    assert math.isclose(out["alignment_share_min"], 0.2)
    # the early bad solves alone do not fail a run
    assert m.solver_check(solver_rows([0, 25], align=0.1) + solver_rows([50, 75]))["passed"] is True


def test_solver_check_uses_the_runs_late_evaluations_or_unknown():
    # a run that stopped before step 50: every evaluation after step 0
    out = m.solver_check(solver_rows([0], align=0.1) + solver_rows([25]))
    assert out["passed"] is True and out["evaluations"] == 1
    # nothing to check: unknown, not a pass
    assert m.solver_check([])["passed"] is None
    assert m.solver_check(solver_rows([0]))["passed"] is None


def test_solver_check_is_a_median_over_the_checked_modules_only():
    good, bad = solver_rows([50], modules=("attn",)), solver_rows([50], align=0.0, modules=("mlp",))
    assert m.solver_check(good + bad, ("attn",))["passed"] is True
    assert m.solver_check(good + bad, ("mlp",))["passed"] is False
    # a minority of bad solves within a module does not move the median; a non-finite median fails
    rows = solver_rows([50]) + [dict(solver_rows([50])[0], alignment=-1.0)]
    assert m.solver_check(rows)["passed"] is True
    nan = [dict(r, alignment=float("nan")) for r in solver_rows([50])]
    assert m.solver_check(nan)["passed"] is False
    assert m.checked_modules({"solver_normalize": "attn"}) == ("attn",)
    assert set(m.checked_modules({"solver_normalize": None})) == {"attn", "mlp"}


def test_saturation_check_needs_every_layer_above_the_floor():
    assert m.saturation_check(attention_rows([0, 50, 100]))["passed"] is True
    low = attention_rows([50]) + [dict(r, layer=5, entropy_mean=m.ENTROPY_MIN / 2) for r in attention_rows([50])[:2]]
    out = m.saturation_check(low)
    assert out["passed"] is False and math.isclose(out["entropy_min"], m.ENTROPY_MIN / 2)
    # a layer's heads are averaged: one saturated head among unsaturated ones passes
    mixed = [dict(r, entropy_mean=0.0 if r["head"] == 0 else 1.0) for r in attention_rows([50])]
    assert m.saturation_check(mixed)["passed"] is True
    assert m.saturation_check(attention_rows([0], entropy=0.0))["passed"] is None  # step 0 alone: unknown


def test_run_checks_records_both_with_their_scope():
    out = m.run_checks({"solver_normalize": "attn"}, solver_rows([50, 100]), attention_rows([50], entropy=0.01))
    assert out["solver"]["passed"] is True and out["solver"]["modules"] == ["attn"]
    assert out["saturation"]["passed"] is False
    assert m.run_checks({}, [], [])["solver"]["passed"] is None


def test_per_kind_check_fails_the_kind_a_pooled_median_hides():
    # attention fails its violation, the MLP passes with more rows: the pooled median passes
    rows = ([{"step": 50, "module": "attn", "alignment": 0.95, "alignment_converged": 1.0, "violation": 0.035,
              "gap_converged": 1e-3}] * 3
            + [{"step": 50, "module": "mlp", "alignment": 0.95, "alignment_converged": 1.0, "violation": 0.01,
                "gap_converged": -4e-3}] * 4)
    out = m.solver_check(rows)
    assert out["passed"] is True
    assert out["per_kind"]["attn"]["passed"] is False and out["per_kind"]["mlp"]["passed"] is True
    assert out["per_kind"]["attn"]["violation_max"] == 0.035
    assert out["reference_gap_max"] == 4e-3  # the largest |gap| on the checked rows
    # scoped to the MLP, only its kind is recorded
    assert set(m.solver_check(rows, ("mlp",))["per_kind"]) == {"mlp"}


def test_reference_gap_is_unknown_without_the_column():
    assert m.solver_check(solver_rows([50]))["reference_gap_max"] is None
