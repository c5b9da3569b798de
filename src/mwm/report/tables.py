"""Tables written three ways: CSV (data), Markdown (reading), LaTeX (the paper)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mwm.io import atomic_write_text
from mwm.report import style

__all__ = ["write_table", "fmt", "markdown"]


def fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "--"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{digits}g}"
    return str(x)


def markdown(df: pd.DataFrame) -> str:
    """``df`` as a markdown table (cells formatted by :func:`fmt`)."""
    cols = list(df.columns)
    def cell(x) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(cell(fmt(row[c])) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _tex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("^", r"\^{}")):
        s = s.replace(a, b)
    return s


def _tex(df: pd.DataFrame, caption: str) -> str:
    cols = list(df.columns)
    out = [r"\begin{table}[t]", r"\centering", r"\small", r"\begin{tabular}{" + "l" * len(cols) + "}",
           r"\toprule", " & ".join(_tex_escape(str(c)) for c in cols) + r" \\", r"\midrule"]
    for _, row in df.iterrows():
        out.append(" & ".join(_tex_escape(fmt(row[c])) for c in cols) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_tex_escape(caption)}}}", r"\end{table}"]
    return "\n".join(out) + "\n"


def write_table(df: pd.DataFrame, out_dir: str | Path, stem: str, caption: str) -> list[Path]:
    out_dir = Path(out_dir)
    paths = [out_dir / f"{stem}.{e}" for e in ("csv", "md", "tex")]
    atomic_write_text(paths[0], df.to_csv(index=False))
    if style.STAMP:
        caption = f"{caption} [{style.STAMP}]"
    atomic_write_text(paths[1], f"**{caption}**\n\n" + markdown(df))
    atomic_write_text(paths[2], _tex(df, caption))
    return paths
