"""ms-swift's example scripts: measured GPU memory and s/it in their header comments (transcribed rows)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="msswift_examples", repo="modelscope/ms-swift",
                    commit="3602360a562313afbf2ef6065fdf61f271a2c5b9",
                    # the commit the scripts were read at; each row's collected_at is its header line's git-blame date
                    date="2026-08-22", license="Apache-2.0",
                    software={"framework": "ms-swift (swift sft on transformers + DeepSpeed; megatron sft on "
                                           "Megatron-LM)", "dtype": "bf16"})

SECTION = """\
# ms-swift example scripts: measured memory and s/it (GPU fine-tuning)

What: ms-swift (ModelScope's fine-tuning framework) ships example launch scripts whose header comments give what
the authors measured when they ran them: per-GPU memory and training speed (s/it), sometimes the GPU type. The
rows here are those headers, transcribed by hand into `transcribed.csv` (no code copied), each with the script
path, its lines and the commit it was read at (github.com/modelscope/ms-swift @ 3602360a562313afbf2ef6065fdf61f271a2c5b9,
2026-08-22), the quoted text, and the plan the script runs. License: Apache-2.0 (the repository's LICENSE).
Imported by `perfpredict.importers.msswift` (perfpredict/importers/transcribed.py) into `runs.parquet`.

## Plan fields (from each script's flags; defaults from ms-swift's code)

- `swift sft` runs transformers' Trainer: framework `deepspeed` with `--deepspeed zero3` -> zero 3 over data
  parallelism (dp = NPROC_PER_NODE), micro_batch = `--per_device_train_batch_size`, grad_accum =
  `--gradient_accumulation_steps`, global batch = micro_batch x grad_accum x dp. Gradient checkpointing is on by
  default (swift/trainers/arguments.py: `gradient_checkpointing: bool = True`): recompute `full` (HF checkpoints
  whole decoder layers).
- `megatron sft` runs Megatron-LM: framework `megatron`, tp = `--tensor_model_parallel_size`, sequence parallel as
  given, dp = GPUs / tp, micro_batch = `--micro_batch_size`, grad_accum = global_batch_size / (micro_batch x dp),
  recompute `full` for `--recompute_granularity full` (uniform, 1 layer) and `selective` for `selective`, zero 1 (ms-swift's default
  `use_distributed_optimizer: bool = True`, swift/megatron/arguments/megatron_args.py; at dp 1 it shards nothing).
- seq_len: only packed runs are imported (`--packing true`): ms-swift packs samples into sequences of up to
  `max_length` tokens (packing_length defaults to max_length, swift/arguments/base_args/base_args.py), so each
  micro-batch is one pack of about `max_length` tokens. Unpacked runs train dataset samples of unknown length and
  are left out (their memory and speed belong to lengths nobody published).
- Objective `sft`, bf16 (`--torch_dtype bfloat16`), full-parameter training (`--tuner_type full`).
- Optimizer (`kernels` token `adamw_torch`, Workload.optimizer) on the `swift sft --deepspeed` rows: ms-swift's
  DeepSpeed configs name no optimizer (swift/config/zero3.json, zero2.json at 3602360a) and ms-swift leaves
  transformers' `optim` at its default, "adamw_torch" until transformers 4.54 with torch >= 2.8 (the rows' ms-swift
  pinned transformers < 4.51-4.53, the H20 script 4.53), so transformers' DeepSpeed integration builds the Trainer's
  torch AdamW and sets zero_allow_untested_optimizer (integrations/deepspeed.py deepspeed_optim_sched), and ZeRO-3
  steps it on one fp32 sub-group at a time (stage3.py `_optimizer_step`): foreach's `exp_avg_sq_sqrt` is one more
  fp32 second moment of the sub-group beside its fp32 gradient (features.memory.optimizer_step).
- GPU: "A100" in the headers is read as `a100-sxm-80gb` (the rows peak at 42-54 GB, above a 40 GB A100's
  capacity; PCIe vs SXM is not stated).
- "H20" is the catalog's `h20` (96 GiB HBM3, 148 dense BF16 TFLOPS: perfpredict/catalog/gpus/h20.json, its
  figures cited there): `fa3-transformers-fa2` (examples/train/flash_attention_3/transformers.sh: swift sft,
  Qwen2.5-7B, `--deepspeed zero3` over 4 GPUs, micro-batch 1, grad_accum 4, packing 16384, Liger, transformers
  4.53 pinned, `PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'`). No H20 kernel probe exists, so its step time
  is composed from the hardware figures alone.
- The Megatron-SWIFT benchmark (`bench-dense-*`): one table, Qwen2.5-14B full-parameter SFT, 8K packed, the same
  16 sequences per step under three runtimes, published at 9d297f99a (2025-03-21,
  docs/source_en/Instruction/Megatron-SWIFT-Training.md:106-111) with its two scripts in the same commit:
  `examples/train/megatron/base_to_chat.sh` (megatron sft, tp 4 with sequence parallel -> dp 2, micro-batch 1,
  global batch 16 -> grad_accum 8, `--recompute_granularity selective`, distributed optimizer by default -> zero 1,
  fused cross entropy, flash attention) and `examples/train/megatron/benchmark/deepspeed.sh` (swift sft, dp 8,
  micro-batch 1, grad_accum 2, `--deepspeed zero2`; the ZeRO-3 column is the same script with zero3). The GPU is
  named later (docs/source_en/Megatron-SWIFT/Quick-start.md:250 at 3602360a: "a single-node, eight-GPU A800
  environment"). An A800 SXM is A100 SXM 80GB silicon with NVLink cut to 400 GB/s bidirectional: the rows use
  catalog `a100-sxm-80gb` with `intra_node_bw_gb_per_s` 200 (per direction; the catalog A100 has 300), so the
  A100 kernel probes stay valid. The ZeRO-2 column's memory ("8*80GB") is the whole card: the allocator's cache
  filled it (the 2025-03 script does not set expandable segments), which bounds nothing, so that row carries its
  step time only.
- The MoE benchmark's Megatron-LM column (`bench-moe-megatron`): Qwen3-30B-A3B (catalog `qwen3-30b-a3b`, 128 experts,
  8 per token) full-parameter SFT on 2 nodes of 8 A800 (docs/source_en/BestPractices/Qwen3-Best-Practice.md:339),
  read from the script that carried the numbers when they were written (`examples/train/megatron/qwen3_moe.sh` at
  ad907793e9, 2025-04-29): tp 2 with sequence parallel, expert parallel 8 (carved out of dp 8), micro-batch 1,
  global batch 16 -> grad_accum 2, full recompute, 8K packed, grouped-GEMM experts. The inter-node link is not
  stated (Alibaba Cloud DLC): the catalog A100's 25 GB/s per GPU is kept. The script was later changed to pp 2;
  the numbers were not re-measured.

## Units and labels

- Memory: ms-swift logs `memory(GiB)` = `torch.cuda.max_memory_reserved() / 1024**3`, the maximum over the
  rank's devices (swift/utils/torch_utils.py get_max_reserved_memory; the Megatron path takes the maximum over the
  model-parallel group, swift/megatron/callbacks/print.py). The headers write "GB" or "GiB" for the same figure; it
  is stored as GiB in `peak_memory_gib` and `peak_reserved_gib`, memory_kind `reported`: it is the allocator's
  reserved peak, above the tensors' allocated peak by the caching allocator's slack (fragmentation is small with
  `expandable_segments`, which only some scripts set).
- Step time: `train_speed(s/it)` is seconds per optimizer step (one global batch). tokens_per_s = global batch x
  seq_len / step time (packs taken as full).
- Rows whose header gives a total wall time instead of s/it (`liger/sft.sh`) are memory-only: the number of packs,
  hence of steps, is not published.

## Caveats

- A header is one number from one run, often rounded (10 s/it, 42 GB); the ms-swift, transformers, DeepSpeed and
  torch versions are not stated (collected_at is the date the header line was written, from git blame).
- The same plan was published with a different memory over time: `packing/liger_kernel.sh` (then
  `long_text/zero3.sh`) said "4 * 56GB, 10s/it" at 9d09048d80 (2025-04-11) and "4 * 42GB" from e3f270866a
  (2025-05-08, "fix sequence_parallel"). The later figure is imported; the change shows how much version drift
  moves these labels.
- Liger-Kernel (`--use_liger_kernel true`) fuses the LM head with the cross entropy, so the full logits are never
  materialised: those rows carry the plan's `fused_head` (transcribed.csv column `fused_head`; the composition
  charges Liger's chunked head instead of the logits, features.memory.fused_head_bytes). The `liger/sft.sh` pair
  (42 vs 54 GB, otherwise the same plan) measures exactly that difference.
- Packs are "about" max_length: the last pack of an epoch and packs the bin-packer could not fill are shorter.
  The long-text rows suggest much shorter: taken as full, `packing-liger-16k` (10 s/it for 2 x 16,384 tokens per
  A100) and `fa3-transformers-fa2` (35.5 s/it for 4 x 16,384 per H20) would run at about 72 % and 86 % of the dense
  BF16 peak in model FLOPs (6 N per token plus the recomputed forward and causal attention), beyond what ZeRO-3
  with full recompute reaches; LongAlpaca-12k's samples (the H20 script's dataset) are long enough that many
  16K packs hold one sample. Their step-time labels therefore overstate the tokens per step by an unknown factor.

## Not imported

LoRA rows (the plan schema has no adapter training), the FlashAttention-3 twin of the H20 row, rows whose GPU type is
not stated (among them every DPO header: the ZeRO-3 full fine-tuning in `rlhf/dpo/full.sh` and the Megatron DPO
scripts), unpacked rows, Ulysses/ring sequence-parallel rows, the MoE benchmark's ZeRO-3 column and multimodal
rows: each is listed below with its reason. No DPO run with a stated GPU and packed lengths was found in ms-swift.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="msswift", section=SECTION)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
