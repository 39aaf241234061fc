"""Benchmarks: workload generator, offline throughput, serving load client, sweeps."""
