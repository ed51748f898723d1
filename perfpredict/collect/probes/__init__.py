"""Kernel and collective probes -> probes.parquet: suite (the probe families, their budgets, run_probes) and
comm_probe (the torchrun entry that times collectives)."""
