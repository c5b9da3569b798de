"""The report stage: every table and figure of the paper from ``results/``, plus a
ledger of the paper's numbers with rebuilt values and verdicts.

- :mod:`mwm.report.style`     one matplotlib style, atomic PNG + PDF output
- :mod:`mwm.report.load`      reading training runs and study results (a missing one is an error)
- :mod:`mwm.report.tables`    tables as CSV, Markdown and LaTeX
- :mod:`mwm.report.training`  Figures 4-7 and the attention-saturation figures, Tables 3-4
- :mod:`mwm.report.studies`   alpha study, convergence curves, Figure 3, Tables 1-2, audits
- :mod:`mwm.report.ledger`    paper numbers vs rebuilt values, with a verdict each

Command line: ``python -m mwm.report --config FILE``.
"""

from mwm.report.load import ReportError

__all__ = ["ReportError"]
