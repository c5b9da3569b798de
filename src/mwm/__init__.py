"""mwm: rebuild and audit of module-wise Manifold Muon (Stiefel / DGram on GPT-2).

Rooms (docs/package.md lists every module and its idea):

- :mod:`mwm.optim`     the optimizer's math: msign, manifolds, inner solvers, Manifold Muon
- :mod:`mwm.train`     one training run (``python -m mwm.train``)
- :mod:`mwm.config`    a config and its schema, the one home of every default
- :mod:`mwm.plan`      the run plan: which runs a config makes, their settings, identities and folders
- :mod:`mwm.workflow`  the workflow's bookkeeping: owners, stages, DVC, status
- :mod:`mwm.data`, :mod:`mwm.studies`, :mod:`mwm.report`, :mod:`mwm.setaside`: the other stages
- :mod:`mwm.paper`, :mod:`mwm.numerics`, :mod:`mwm.io`, :mod:`mwm.errors`, :mod:`mwm.paths`,
  :mod:`mwm.lock`: shared facts, writers and file primitives
"""

__version__ = "0.1.0"
