"""A lent GPU machine (the `device` tool: one H200 for minutes, nothing installable there but carried wheels, no
polars): session.py runs the probes and a TRL step grid there and writes raw JSON lines under $OUT, importer.py
turns the returned files into datasets/ours/<that machine's hash>/ rows here (`perfpredict collect import-device`).
benchmarks/device/h200_session.sh is the one command; docs/collecting.md "When a device is lent" the call."""
