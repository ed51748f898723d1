"""collect stage: measure kernels, collectives and end-to-end training steps on this machine.

The only part of perfpredict that imports torch. Modules: fingerprint (hardware/software provenance), timing
(repeats, calibration, load sampling), probes + comm_probe (kernel and collective probes), model (Llama-style
decoder, shrink), objectives (dpo/ipo/simpo/orpo/sft/pretrain as TRL computes them), parallel (DDP, FSDP2, TP,
TPxDP, pipelining on PyTorch's APIs), run_step (torchrun entry), runs (one scenario -> one `runs` row), sweep
(space-filling plan sampling, resumable), store (typed parquet appends), cli (`perfpredict collect ...`)."""
