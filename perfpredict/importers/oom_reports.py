"""Published out-of-memory outcomes: training runs whose users report, on a public issue tracker, that a fully
stated plan ran out of GPU memory (PyTorch's CUDA OOM error) or ran, transcribed by hand (the project's first
`oom` labels; models.oom calibrates its per-cell margins on such outcomes)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="oom_reports", repo="GitHub issues of several projects (each row cites its URL)",
                    commit="", date="2025-02-19",
                    license="short quotations of public GitHub issues and READMEs (facts, no code copied)",
                    software={"framework": "DeepSpeed through LLaMA-Factory, ms-swift, OpenRLHF and TRL (open-r1); "
                                           "FSDP through the transformers Trainer (Stanford Alpaca); one run on "
                                           "ms-swift's plain Trainer", "dtype": "bf16 or fp16 (same bytes)"})

SECTION = """\
# Published out-of-memory outcomes (GitHub issues): fully stated plans that ran out of GPU memory, or ran

Upstream: GitHub issues of several projects (each row cites its URL).
License: short quotations of public GitHub issues and READMEs (facts, no code copied).

What: users of LLaMA-Factory, ms-swift, OpenRLHF, open-r1 and Stanford Alpaca report on those projects' issue trackers
that a training run ran out of GPU memory (PyTorch's `torch.cuda.OutOfMemoryError`, the machine's own verdict) or that
a changed plan then ran; the Alpaca README states the plan its authors ran on 4 A100 80G. Only reports whose plan is fully stated are imported: model, GPU type and count, framework and ZeRO stage,
micro-batch, gradient accumulation, sequence length, gradient checkpointing and precision, written in the report or
the named tool's stated default (cited below). Each row's `upstream_path` is the issue's URL and `upstream_lines`
the post it quotes; issues have no commit, so `upstream_commit` is blank and `header_date` is the post's date.
Transcribed by hand into `transcribed.csv` (status `oom`, `ok` or `skip`); imported by
`perfpredict.importers.oom_reports` into `runs.parquet` with outcome `oom` (no step time, no peak) or `ok` (ran; no
label beyond that: none of these reports gives a measured peak, the "13G per card" of #5977 is a reading of
nvidia-smi, not a peak of the allocator).

Where the OOM message is quoted, its numbers (the request that failed, PyTorch's allocated and reserved memory, the
capacity) are the columns `oom_tried_gib`, `oom_allocated_gib`, `oom_reserved_gib`, `oom_capacity_gib`; they are
evidence beside the label (the need was above allocated + tried), never a peak label. None of the imported rows
quotes the message's numbers; four skipped rows do.

## Defaults of the named tools (where a report leaves a field at its default)

- LLaMA-Factory: `disable_gradient_checkpointing` defaults to False (src/llamafactory/hparams/model_args.py), so
  gradient checkpointing is on (recompute `full`); `flash_attn: auto` picks SDPA or FA2 (fused attention).
  `examples/deepspeed/ds_z3_config.json` is ZeRO-3 without offload, `ds_z3_offload_config.json` offloads the optimizer
  and the parameters to the CPU (`kernels` token `param_offload`, plan `param_offload`).
- ms-swift 3.x: `per_device_train_batch_size` 1 and `gradient_checkpointing` True (swift/trainers/arguments.py,
  TrainArgumentsMixin). ms-swift 2.x (#2559, `--sft_type`, `--batch_size`) states every field on its command line.
- Stanford Alpaca `train.py` (README at 761dc5b): `model_max_length` 512 (the tokenizer truncates there; a batch is
  padded to its longest), the model loaded in fp32 and wrapped by the transformers Trainer's FSDP (`--fsdp
  "full_shard auto_wrap"`: framework `fsdp`, ZeRO 3) under `--bf16` or `--fp16` mixed precision, no gradient
  checkpointing (recompute `none`); transformers 4.27-4.28 has no SDPA path for LLaMA, so attention is eager
  (`kernels` token `eager_attention`). LLaMA-7B / 13B (v1) have the shapes of catalog `llama-2-7b` / `llama-2-13b`
  (the context length differs, 2,048 against 4,096; one added pad token).
- open-r1 `recipes/Qwen2.5-1.5B-Instruct/sft/config_demo.yaml` at 5dcfae8 (the state of 2025-03-14): packing,
  `max_length` 16384, gradient checkpointing, `use_liger: true` (Liger's fused linear cross entropy: plan
  `fused_head`), FlashAttention-2, bf16; `recipes/accelerate_configs/zero3.yaml`: ZeRO-3 without offload on 8
  processes. The user of #506 overrode only the batch sizes (2).
- OpenRLHF `train_sft`: every field is on the command line (`--zero_stage 2 --bf16 --flash_attn
  --gradient_checkpointing --micro_train_batch_size 1 --max_len 128`); `--adam_offload` is DeepSpeed's
  `offload_optimizer` to the CPU.

## Mapping and caveats

- Models: Meta-Llama-3-8B(-Instruct) is catalog `llama-3.1-8b` (the same shapes; only the RoPE scaling differs);
  DeepSeek-R1-Distill-Qwen-32B and Qwen2.5-32B-Instruct are `qwen2.5-32b` (the distill is that base model's
  architecture); Qwen2.5-14B-Instruct is `qwen2.5-14b`.
- GPUs: an A10 (24 GB) is catalog `a10g` (the same 24 GB; the AWS part differs in clocks, not memory); A800 80GB is catalog `a100-sxm-80gb` with its NVLink cut to 200 GB/s per direction (the msswift_examples
  convention); "an 80 GB A100" (OpenRLHF #698, form factor not stated) is `a100-sxm-80gb` (the same 80 GiB; the
  OOM verdict does not read the link).
- Precision: fp16 mixed precision (#5977) holds the same bytes as bf16; the rows carry the schema's bf16.
- Sequence length: the row carries the cap (`cutoff_len`, `max_length`, `max_len`). A run that ran out of memory at
  some batch of at most the cap would at the cap too; a run that ran may never have met a batch at the cap (the
  alpaca demo data of #5977 is short), so a "does not fit" at the cap on an `ok` row may still be the data's, not
  the predictor's: see the per-row listing in the report before reading a false OOM as a model error.
- ms-swift #2947 ran torch 1.13.1 with transformers 4.40: no SDPA in that torch, so Qwen2's attention is the eager
  path (`kernels` token `eager_attention`); it ran out of memory "halfway through training" (at a long batch).
- Stanford Alpaca #39: the mb-4 README plan ran out of memory on 8 A100 40GB and mb 2 then ran for its author
  (waterhorse1); another user on the same hardware reports "intermittent fsdp memory errors" later in a run at mb 2,
  so that `ok` row is a near-limit one.
- ms-swift #2559 is one A800 without DeepSpeed (the plain Trainer, framework `trl`, ZeRO 0): a 32B model's weights,
  gradients and Adam states alone exceed 80 GiB many times over; it is an easy OOM and is kept as one.

## Not imported

Reports whose plan is not fully stated, whose model or GPU is not in the catalog, or whose objective the schema
cannot state (LoRA, PPO, GRPO, vision-language models): each is listed below with its reason. The search that found
these covered the issue trackers of DeepSpeed, accelerate, TRL, transformers, LLaMA-Factory, ms-swift, OpenRLHF,
axolotl, open-r1 and a few model repositories; most OOM reports there omit the sequence length or use LoRA, and were
not transcribed one by one.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="oom_reports", section=SECTION, fit_outcomes=True)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
