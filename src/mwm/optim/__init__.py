"""The optimizer's math: the matrix sign, the manifolds, the inner solvers, the Manifold Muon step,
which manifold each parameter gets, and its torch-free vocabulary (:mod:`mwm.optim.vocab`)."""
