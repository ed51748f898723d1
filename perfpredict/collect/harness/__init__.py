"""Our PyTorch-native parallel training harness -> runs.parquet: model (Llama-style decoder, shrink), objectives
(dpo/ipo/simpo/orpo/sft/pretrain as TRL computes them), parallel (DDP, FSDP2, TP, TPxDP, pipelining on PyTorch's
APIs), run_step (torchrun entry), runs (one scenario -> one `runs` row), sweep (space-filling plan sampling,
resumable)."""
