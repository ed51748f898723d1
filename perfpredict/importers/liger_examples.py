"""Liger-Kernel's Hugging Face example logs: measured step time and allocated peak memory of FSDP1 SFT runs with and
without Liger's kernels on 4 A100s (transcribed rows)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="liger_hf_examples", repo="linkedin/Liger-Kernel",
                    commit="1dce7fd4c945cada18b6a86be0050cd03de21180",
                    # the last commit holding every log (2024-09-12); each row's commit is the one that added its log
                    date="2024-09-12", license="BSD-2-Clause",
                    software={"framework": "TRL SFTTrainer on transformers 4.44.2 Trainer + PyTorch FSDP1 "
                                           "(accelerate)", "dtype": "bf16"})

SECTION = """\
# Liger-Kernel Hugging Face example logs: FSDP1 SFT step time and allocated peak (4 x A100)

What: Liger-Kernel (github.com/linkedin/Liger-Kernel, read at 1dce7fd4c945cada18b6a86be0050cd03de21180, the last
commit holding every log; license BSD-2-Clause) committed, in September 2024, the training logs
of its Hugging Face example (`examples/huggingface/results/<model>_use_liger_<bool>_patching_type_<how>.log`, added
at 92047d9e..1dce7fd4, 2024-09-10..12, removed again at 99f801c2 "Clean up"): ten steps of TRL's SFTTrainer per
model, with and without Liger's kernels, each step logged by the example's EfficiencyCallback
(examples/huggingface/callback.py): `step_time_sec` (perf_counter around the optimizer step),
`avg_step_time_sec` (mean over the steps after the first), `step_peak_memory_allocated_MB` (torch.cuda
max_memory_allocated after reset_peak_memory_stats at each step begin, MiB) and `num_input_tokens_seen` (the
Trainer's count of input ids, gathered over the 4 ranks, padding included). Transcribed from the logs by
`transcribe.py` (in this folder, run in a clone) into `transcribed.csv` (one row per log: path, the log lines read, the commit that added it,
the quoted figures); imported by `perfpredict.importers.liger_examples` into `runs.parquet`.

## Plan fields (from the committed launch script and config)

- `examples/huggingface/run_patching_methods.sh` (as committed with the logs): `torchrun --nnodes=1
  --nproc-per-node=4 training.py --bf16 --max_steps $MAX_STEPS --per_device_train_batch_size $BATCH_SIZE
  --fsdp "full_shard auto_wrap" --fsdp_config config/fsdp_config.json --logging_steps 1
  --include_num_input_tokens_seen`, no gradient accumulation; `config/fsdp_config.json`: `backward_prefetch
  backward_pre`, `forward_prefetch true`, `activation_checkpointing true` (transformers applies accelerate's
  per-layer activation checkpointing: recompute `full`). Plan: framework `fsdp` (the capability table's FSDP as
  TRL/accelerate drive it; accelerate upcasts the trainable parameters to fp32 under bf16 mixed precision, as the
  fsdp runtime's weights_fp32 says), zero 3, dp 4, micro_batch = BATCH_SIZE, grad_accum 1, objective `sft`.
- Per-device batch: the script committed with each log names it: 24 for qwen2 (4581599f), 128 for phi3
  (f11c0cf1, c10c1ba0); llama and mistral ran with the script's first value 32 (92047d9e, whose MODEL_TYPE lines list
  llama and mistral), gemma2 with 32 too. The logs agree: every step's token count is a multiple of
  4 ranks x batch x 16 (the collator pads to a multiple of 16) for these batch sizes and not for the others the
  script ever set.
- seq_len: training.py (TRL `DataCollatorForCompletionOnlyLM`, `pad_to_multiple_of=16`, `max_seq_length 512`) pads
  each rank's micro-batch to its longest Alpaca sample, so the length varies per step and rank. seq_len is the
  mean padded length over the averaged steps: (tokens seen after the last step - after step 1) / steps /
  (4 x batch), rounded: what the step time sees on average.
- seq_len_cv (Workload.seq_len_cv): how much one rank's padded length varies, from the log's per-step token counts.
  Each step's count sums 4 ranks' independent batches, so its variance is a quarter of one rank's: seq_len_cv = 2 x
  the sample standard deviation of the steps' mean padded lengths / their mean (0.22-0.43; from 4 steps for qwen2,
  9 for llama, mistral and phi3, 19 for gemma2: the qwen2 figures are the roughest). FSDP gathers every block, so
  every micro-batch runs at its slowest rank's length (features.compute slowest_rank_factor).
- peak_seq_len (Workload.peak_seq_len; the memory is composed at it): the allocated peak is rank 0's highest step,
  and that is the step whose batch is longest. Each step's peak moves in whole 16-token padding multiples (e.g.
  gemma2: 43,259 / 45,079 / 50,541 / 56,002 / 66,926 MiB, 1,820 MiB per 16 tokens at batch 32 and 256K vocabulary),
  so it belongs to rank 0's longest batch, not to the mean. The logs give each step's tokens over the 4 ranks, not
  rank 0's: `transcribe.py` takes the ranks' padded lengths as independent draws with the steps' mean and 2x the
  spread of the 4-rank step means, and rank 0's longest of its n logged steps at mean + spread x E[max of n standard
  normals], rounded up to 16 and capped at 512 (304-512; the mean is 229-420). An estimate from the logged token
  counts, never from the memory; the rows whose peak is the optimizer step (mistral, llama and qwen2 with Liger)
  do not depend on it.
- GPU: the logs do not name it; the example's README in the same commits states the benchmark conditions "FSDP1 on
  4 A100s" and "The default hyperparameters and configurations work on single node with 4xA100 80GB GPUs": catalog
  `a100-sxm-80gb` (reserved peaks of 46-78 GB fit 80 GB only).
- Models: `Meta-Llama-3-8B` -> `llama-3.1-8b` (the same architecture; only RoPE scaling differs),
  `Mistral-7B-v0.1` -> `mistral-7b` (the catalog's v0.3 has a 32,768 vocabulary vs 32,000: 0.1 % more parameters),
  `Qwen2-7B-Instruct` -> `qwen2.5-7b` (identical configuration: hidden 3584, 28 layers, 28/4 heads, FFN 18944,
  vocabulary 152,064), `Phi-3.5-mini-instruct` -> `phi-3-mini` (identical shapes), `gemma-2-2b-it` -> `gemma-2-2b`.

## Units and labels

- Step time: `avg_step_time_sec` of the last step (the mean over steps 2..N, N = 10, 5 for qwen2, 20 for gemma2),
  seconds per optimizer step of the global batch (4 x batch sequences).
- Memory: `total_peak_memory_allocated_MB` (MiB) / 1024 = GiB, the maximum over the averaged steps of rank 0's
  allocated peak: memory_kind `cuda_max_allocated`. The reserved peak is in the quote only.

## Caveats

- Padded batches of varying length: see seq_len above. The step time is the slowest rank's (FSDP synchronises every
  layer), whose batch was at least the mean length: seq_len_cv gives the expected excess. The steps themselves vary
  far more in Gemma 2's logs (1.4-6.6 s for the same token counts, its allocator's reserved peak at 78 of 80 GB:
  the cache flushes and retries of an allocator near the card's capacity, which nothing here models).
- The Liger rows (`-liger-True-pre-init`) apply Liger's RMSNorm, RoPE, SwiGLU and fused linear cross entropy (the
  LM head and the loss in chunks, no full logits): plan `fused_head` true. Gemma 2's patch at these commits applies
  Liger's cross entropy only, not the fused head (`apply_liger_kernel_to_gemma2(cross_entropy=True)`,
  src/liger_kernel/transformers/monkey_patch.py:322-350), so gemma2's `post-init-class` row keeps `fused_head`
  false with `liger` in its `kernels`. Mistral's memory is the same with and without Liger (34,548 MiB): its peak
  is the optimizer step's (docs/finetune-memory.md), not the logits of a 32K vocabulary.
- Ten steps each, a short run: the patching-method twins of one plan differ by up to 20 % in step time (e.g. llama
  2.82-3.01 s, mistral 3.03-3.54 s), which bounds what any predictor can match on a single row.
- The example pins transformers 4.44.2 (requirements.txt); torch, accelerate and TRL versions are not stated.

## Not imported

Gemma-7B (not in the catalog), Qwen2-VL (vision-language), the Mixtral log (no step logged), the diverged gemma2
Liger runs (nan gradients), the *_old reruns, the other patching methods of an imported plan, and the exploratory
`llama_B_48_*.log` files whose launch command was never committed: each is listed below with its reason.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="liger_examples", section=SECTION)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
