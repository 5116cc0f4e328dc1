"""MaxKernel: writes and optimizes JAX/Pallas kernels with a pool of cooperating sub-agents."""

__version__ = "0.1.0"
