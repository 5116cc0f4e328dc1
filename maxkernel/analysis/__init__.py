"""Static analysis of reference computations (jaxpr-level), shared by planning and memory."""
