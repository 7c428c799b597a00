"""Coordinator side: samplers (pure kernels), the oracle interface and transports, the run driver."""
