"""Distributed execution: tensor parallelism and KV transfer between instances."""
