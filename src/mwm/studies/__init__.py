"""Numerical studies of the paper's dual-ascent and theory claims (compute only; plots are the report's).

- :mod:`mwm.studies.alpha`       dual-ascent step-size sweep and convergence curves
- :mod:`mwm.studies.absorption`  how much early-stopped dual ascent error the retraction removes,
  on random pairs and on (W, G) pairs captured in training
- :mod:`mwm.studies.audits`      softmax-Jacobian inequalities, the logit bound, the singular-value
  growth bound (and a checker for logged spectra), tangent dimensions
- :mod:`mwm.studies.common`      shared helpers (seeding, batching, atomic CSV/JSON output, CLI)

Each has ``python -m mwm.studies.<name> --config FILE --out DIR [dotted.key=value ...]``.
"""
