"""Coordinator side: the algorithm registry and its pure kernels, the oracle interface and the
transport registry, the run driver."""
