"""Kernels by device kind; the platform layer (inflight/platforms) chooses among them."""
