"""collect stage: measure kernels, collectives, training steps and generation on this machine.

The only part of perfpredict that imports torch (none of it at package import). One subpackage per collector, each
writing one table of datasets/ours/<hardware hash>/ and launching its own workers:
- probes/: kernel probes (GEMM, attention, memory-bound ops) and the torchrun collective probe -> probes.parquet
- harness/: our PyTorch-native training harness (Llama-style decoder, TRL's objectives, DDP/FSDP2/TP/pipelining),
  its torchrun step, one scenario -> one row, the space-filling sweep -> runs.parquet
- trl/: the real TRL trainers on sampled configs, measured in accelerate launches -> trl.parquet
- vllm/: the real vLLM engine generating, one worker process per replica -> generate.parquet
- device/ (a session, not a collector): probes and trl on a lent GPU machine without polars, JSON lines back,
  imported here by `perfpredict collect import-device`; the one package that imports collectors
What every collector shares sits here: fingerprint (hardware/software provenance), timing (repeats, calibration,
load sampling), store (typed parquet schemas), host (the machine as a catalog cluster and its dataset folder),
processes (workers' PYTHONPATH, killing a launch's tree), tensors (live tensor bytes, OOM test). The collectors
import only these and core, never each other. cli: `perfpredict collect ...`."""
