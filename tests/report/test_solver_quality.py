"""mwm.report.solver_quality: solver.csv rows pooled per assignment and binned by sigma_max."""

from types import SimpleNamespace

import numpy as np
import pytest
import pandas as pd

from mwm.report.solver_quality import fig_solver_quality, quality_bins, solver_quality


def rows(scales, align, conv, module="attn"):
    return pd.DataFrame({"module": module, "scale": scales, "alignment": align, "alignment_converged": conv})


def test_bins_take_medians_per_group_module_and_decade_quarter():
    runs = {("dgram", 0): SimpleNamespace(solver=rows([1.0, 1.1, 20.0, 22.0, 25.0], [0.9, 0.8, 0.1, 0.0, -0.1],
                                                      [0.95, 0.95, 0.9, 0.9, 0.9])),
            ("dgram", 1): SimpleNamespace(solver=rows([1.05], [0.85], [0.95], module="mlp")),
            ("none", 0): SimpleNamespace(solver=pd.DataFrame(columns=["module", "scale", "alignment",
                                                                      "alignment_converged"]))}
    df = solver_quality(runs)
    assert set(df.group) == {"dgram"} and len(df) == 6  # a run without constrained matrices adds nothing
    b = quality_bins(df)
    attn = b[b.module == "attn"].reset_index(drop=True)
    assert list(attn.n) == [2, 3]
    assert attn.alignment.tolist() == pytest.approx([0.85, 0.0]) and attn.alignment_converged.tolist() == [0.95, 0.9]
    # each bin's centre lies in its quarter decade, which holds its points
    assert 1.0 <= attn.scale[0] < 10 ** 0.25 and 10 ** 1.25 <= attn.scale[1] < 10 ** 1.5
    assert len(b[b.module == "mlp"]) == 1


def test_the_figure_is_drawn_even_without_rows(tmp_path):
    fig_solver_quality(pd.DataFrame(), tmp_path)
    assert (tmp_path / "fig_solver_quality.png").stat().st_size > 1000
    df = solver_quality({("stiefel", 0): SimpleNamespace(solver=rows(np.ones(4), [0.9] * 4, [0.95] * 4))})
    fig_solver_quality(df, tmp_path)
    assert (tmp_path / "fig_solver_quality.pdf").is_file()
