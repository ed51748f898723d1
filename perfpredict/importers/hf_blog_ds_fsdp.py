"""Hugging Face's "From DeepSpeed to FSDP and Back Again" blog: measured step time of the same 7B fine-tuning step
under FSDP FULL_SHARD and DeepSpeed ZeRO-3 on 4 A100s, both driven by accelerate (transcribed rows)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="hf_blog_ds_fsdp", repo="huggingface/blog",
                    commit="09e9aa2d9b04feabe06bf98d25691caf8d967eea",
                    date="2024-06-10", license="Apache-2.0",
                    software={"framework": "accelerate 0.30 (FSDP FULL_SHARD aligned mode / DeepSpeed ZeRO-3) on the "
                                           "transformers Trainer (TRL SFTTrainer)", "dtype": "bf16"})

SECTION = """\
# "From DeepSpeed to FSDP and Back Again" (Hugging Face blog): FSDP vs DeepSpeed ZeRO-3 step time, 4 x A100

What: the Hugging Face blog post `deepspeed-to-fsdp-and-back.md` (github.com/huggingface/blog, read at
09e9aa2d9b04feabe06bf98d25691caf8d967eea; authors from IBM Research and Hugging Face; reviewed in huggingface/blog#2133 on
2024-06-10; the repository's license: Apache-2.0) compares the two ZeRO implementations as accelerate drives them after
accelerate#2674 made FSDP upcast its sharded parameters to fp32 under bf16 mixed precision ("aligned mode", the same
fp32 master weights and optimizer as DeepSpeed). Its Table 3 gives the measured tokens/s per device, step time and MFU
of IBM Granite 7B on four A100s: "FSDP (aligned mode) | 3158.7 | 10.4 | 0.41" and "DeepSpeed | 3094.5 | 10.6 | 0.40".
Transcribed by hand into `transcribed.csv`; imported by `perfpredict.importers.hf_blog_ds_fsdp` into `runs.parquet`.

## Plan fields

- Model: ibm-granite/granite-7b-base, "which follows the Meta Llama2 architecture" (the post): catalog `llama-2-7b`
  (32 layers, hidden 4,096, FFN 11,008, 32 heads, as the post's "Llama2 architecture" says).
- Hardware: "four A100 GPUs": catalog `a100-sxm-80gb`, 4 GPUs on one node (the 40 GB part cannot hold the step: the
  fp32 master weights and Adam states alone are 16 B x 6.7e9 / 4 = 25 GiB per GPU before any activation).
- Batch: "Batch size of 8", per device: tokens/s x step time = 3158.7 x 10.4 = 32,850 and 3094.5 x 10.6 = 32,802 tokens
  per device per step, 8 x 4,096 = 32,768 within the rounding of the published figures. So micro_batch 8, grad_accum 1,
  seq_len 4,096 (full sequences: the step's tokens are exactly batch x 4,096), objective `sft` (the reproduction script
  of accelerate#2624 trains with TRL's SFTTrainer).
- Framework: FSDP `full_shard` (the issue's `fsdp_sharding_strategy: 1`, TRANSFORMER_BASED_WRAP, BACKWARD_PRE) in
  accelerate's aligned mode -> framework `fsdp`, zero 3 (the capability table's FSDP as accelerate drives it, fp32
  sharded weights); DeepSpeed `zero_optimization.stage: 3` without offload -> framework `deepspeed`, zero 3; dp 4.
- Recompute: not stated; `full` by inference. Without activation checkpointing 32,768 tokens per GPU of a 32-layer
  4,096-wide model store over 100 GiB of 16-bit activations (at least 34 x hidden bytes per token and layer: the
  inputs of the seven projections, the norms, SwiGLU and attention outputs), which no A100 holds; with it the step
  fits.

## Units and labels

Step time in seconds per optimizer step of the global batch (4 x 8 sequences of 4,096 tokens), as published (one
decimal). MFU 0.41 = 6 x 6.74e9 x 3158.7 / 312e12: the post counts 6N per token, no recompute. No memory is published.

## Caveats

"Ballpark throughput comparisons" (the post): no run length, versions (accelerate >= 0.30 for the aligned mode;
the issue's environment: torch 2.2.1, transformers 4.39, DeepSpeed 0.14) or attention implementation are stated.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="hf_blog_ds_fsdp", section=SECTION)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
