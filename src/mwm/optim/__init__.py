"""The optimizer's math: the matrix sign, the manifolds, the inner solvers, the Manifold Muon step,
which manifold each parameter gets, and the golden outputs that pin the numbers."""
