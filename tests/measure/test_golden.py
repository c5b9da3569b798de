"""Golden outputs: this code reproduces the file of its numerics version, and a change of the math is caught."""

import numpy as np
import pytest

from mwm.measure import golden
from mwm.numerics import VERSION


@pytest.fixture(scope="module")
def outputs():
    return golden.compute()


def test_this_code_reproduces_the_golden_file_of_its_numerics_version(outputs):
    path = golden.golden_path()
    assert path.is_file(), f"no golden file for numerics version {VERSION}: python -m mwm.measure.golden --write"
    assert golden.compare(outputs, golden.load(path)) == []


def test_every_case_is_stored_small_and_finite(outputs):
    assert set(outputs) == set(golden.CASES)
    assert all(v.size <= golden.SKETCH and np.isfinite(v).all() for v in outputs.values())
    assert golden.golden_path().stat().st_size < 64_000


def test_a_changed_coefficient_moves_the_cases_that_use_it_and_names_them(outputs, monkeypatch):
    from mwm.optim import msign

    real = msign.coefficients

    def nudged(steps=msign.DEFAULT_STEPS):
        return [(a * (1 + 1e-3), b, c) for a, b, c in real(steps)]

    monkeypatch.setattr(msign, "coefficients", nudged)
    names = [n for n in golden.CASES if n.startswith("msign/") and not n.endswith("bfloat16")]
    moved = golden.compare(golden.compute(names), {n: outputs[n] for n in names})
    assert {line.split(":")[0] for line in moved} == set(names)
    assert all("moved" in line and "tolerance" in line for line in moved)


def test_a_changed_dual_ascent_step_size_is_caught(outputs, monkeypatch):
    from mwm.optim import dual_ascent, solvers

    real = dual_ascent.dual_ascent
    for module in (dual_ascent, solvers):  # the normalized cases reach it through solvers.solve
        monkeypatch.setattr(module, "dual_ascent", lambda W, G, manifold="stiefel", **kw:
                            real(W, G, manifold, **dict(kw, alpha=0.05)))
    names = [n for n in golden.CASES if n.startswith("dual_ascent/")]
    moved = golden.compare(golden.compute(names), {n: outputs[n] for n in names})
    assert {line.split(":")[0] for line in moved} == set(names)


def test_missing_and_new_cases_are_named(outputs):
    some = dict(list(outputs.items())[:3])
    lines = golden.compare({**some, "new/case": np.zeros(2)}, {k: v for k, v in outputs.items() if k != "schedule"})
    assert "new/case: not in the golden file" in lines
    assert any(line.startswith(f"{name}: in the golden file") for line in lines for name in list(outputs)[3:5])


@pytest.mark.slow
def test_the_tolerances_are_far_above_what_other_cpu_kernels_and_threads_give():
    worst = golden.spread()
    table = golden._cases()
    for name, d in worst.items():
        assert d <= golden.TOLERANCE[table[name][0]] / 5, (name, d)


def test_write_refuses_to_replace_a_version_s_file(tmp_path, capsys):
    path = tmp_path / "g.npz"
    path.write_bytes(b"")
    assert golden.main(["--write", "--out", str(path)]) == 2
    assert "a golden file is written once per numerics version" in capsys.readouterr().err
    assert golden.main(["--check", "--out", str(tmp_path / "none.npz")]) == 2
