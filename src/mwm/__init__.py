"""mwm: rebuild and audit of module-wise Manifold Muon (Stiefel / DGram on GPT-2).

Modules, one idea each:

- :mod:`mwm.msign`        matrix sign (Polar Express) and the exact polar factor
- :mod:`mwm.manifolds`    Stiefel, DGram, Oblique: projector, retraction, init, diagnostics
- :mod:`mwm.dual_ascent`  Bernstein's dual ascent inner solver and ``manifold_muon_update``
- :mod:`mwm.optim`        the batched Muon / Manifold Muon optimizer
- :mod:`mwm.names`        the vocabulary (torch-free): assignment names and manifolds, variant names
- :mod:`mwm.assignments`  named and pattern assignments, AdamW/Muon split
"""

__version__ = "0.1.0"
