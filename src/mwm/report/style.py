"""One figure style for the whole report; figures saved as PNG and PDF atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mwm.io import atomic_write  # noqa: E402
from mwm.config.names import is_colnorm, parse_variant  # noqa: E402

#: Column width of a two-column paper, inches.
COLUMN = 3.4
FULL = 7.0

#: One colour per manifold and per assignment, used by every figure.
MANIFOLD_COLORS = {"stiefel": "#d95f02", "dgram": "#1b9e77", "oblique": "#7570b3", "none": "#808080",
                   "adamw": "#e7e7e7"}
ASSIGNMENT_COLORS = {"none": "#808080", "stiefel": "#d95f02", "dgram": "#1f78b4", "hetero": "#33a02c",
                     "hetero-inv": "#e31a1c", "oblique": "#7570b3", "adamw": "#000000"}
ASSIGNMENT_LABELS = {"none": "Unconstrained", "stiefel": "All Stiefel", "dgram": "All DGram",
                     "hetero": "Hetero", "hetero-inv": "Hetero-inv", "oblique": "All Oblique", "adamw": "AdamW"}


def apply() -> None:
    plt.rcParams.update({
        "figure.dpi": 150, "savefig.dpi": 200, "font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7,
        "legend.fontsize": 6, "xtick.labelsize": 6, "ytick.labelsize": 6, "lines.linewidth": 1.0,
        "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
        "figure.constrained_layout.use": True,
    })


def color(variant: str) -> str:
    return ASSIGNMENT_COLORS.get(parse_variant(variant)[0], "#444444")


def label(variant: str) -> str:
    if is_colnorm(variant):
        base = parse_variant(variant)[0]
        return f"{ASSIGNMENT_LABELS.get(base, base)} (colnorm)"
    return ASSIGNMENT_LABELS.get(variant, variant)


def linestyle(variant: str) -> str:
    return "--" if is_colnorm(variant) else "-"


def widths(n: int) -> list[float]:
    """Line widths for ``n`` curves drawn in order, widest first: a curve drawn over an identical
    one leaves it visible as a border (Stiefel and Hetero attention both sit at sigma_max = 1)."""
    return [2.8 - 1.8 * i / (n - 1) for i in range(n)] if n > 1 else [1.0]


def legend_below(fig, ax, ncol: int | None = None) -> None:
    """One legend for the whole figure, under the panels, so that it never hides a curve."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol or min(len(labels), 6))


#: A line every figure and page of the report being built carries (a partial report's "N of M runs"), or None.
STAMP: str | None = None


def save(fig, out_dir: str | Path, stem: str) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.pdf`` (atomically) and close it; with :data:`STAMP`, that line
    across its top."""
    if STAMP:
        fig.text(0.5, 1.0, STAMP, ha="center", va="top", fontsize=7, color="#b00000")
    out = []
    for ext in ("png", "pdf"):
        path = Path(out_dir) / f"{stem}.{ext}"
        atomic_write(path, lambda p, ext=ext: fig.savefig(p, format=ext))
        out.append(path)
    plt.close(fig)
    return out
