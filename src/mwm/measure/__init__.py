"""Measuring the package's own code: golden outputs that pin the numerics, and the host-device syncs
of a training step. It reads the rooms below it and nothing reads it but tests and benchmarks."""
