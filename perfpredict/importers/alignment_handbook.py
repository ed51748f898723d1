"""The alignment handbook's own runs: measured step times of TRL DPO (live reference) and packed SFT under DeepSpeed
ZeRO-3 on one node of 8 H100s and of ORPO on Mixtral-8x22B under FSDP FULL_SHARD on 4 nodes, from the Trainer metrics
its authors pushed with the models (transcribed rows)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers.common import Upstream
from perfpredict.importers.transcribed import Transcribed
from perfpredict.importers.transcribed import run as run_transcribed

UPSTREAM = Upstream(folder="alignment_handbook", repo="huggingface/alignment-handbook",
                    commit="f0ffa0d7a6ab666b1f80f3f7dbb3c6364ac31967",
                    # the recipe commit (2024-01-10) the zephyr runs follow; each row's commit is the Hub commit of the
                    # metrics file it quotes
                    date="2024-01-10", license="Apache-2.0",
                    software={"framework": "alignment-handbook scripts on TRL 0.7.7 (DPOTrainer, SFTTrainer), "
                                           "transformers 4.36.2, DeepSpeed 0.12.2 ZeRO-3 through accelerate, torch 2.1.2",
                              "dtype": "bf16"})

SECTION = """\
# The alignment handbook's runs: TRL DPO and packed SFT under DeepSpeed ZeRO-3 on 8 H100, ORPO under FSDP on 32 H100 (step time)

What: the Hugging Face alignment handbook (github.com/huggingface/alignment-handbook, Apache-2.0) publishes the recipes
its authors used for Zephyr-7B-beta and the Constitutional-AI models, and the models they trained with them on the
Hugging Face Hub. `Trainer.train()` writes `train_results.json` / `all_results.json` (`train_runtime`: wall seconds of
the training loop, `train_samples`, `train_samples_per_second`, `train_steps_per_second`), and the handbook's scripts push
them with the model (scripts/run_dpo.py, scripts/run_sft.py: `metrics["train_samples"] = ...`,
`trainer.log_metrics("train", metrics)`, `trainer.save_metrics`). These are machine-measured wall times. The rows are
the figures of those files as the Hub shows them at the quoted commit, transcribed by hand into `transcribed.csv` (no
code copied); imported by `perfpredict.importers.alignment_handbook` into `runs.parquet`.

## Plan fields (recipes at f0ffa0d7a6ab666b1f80f3f7dbb3c6364ac31967, 2024-01-10, 8df22713248701df4e5f9609cb5531d774decb97, 2024-02-01, and 70769f9e, 2024-04-11)

- Launch: `recipes/launch.slurm` (`#SBATCH --gres=gpu:8`, `--partition=hopper-prod`, set in f0ffa0d, the commit that
  introduced these DPO and SFT configs) runs `accelerate launch --config_file
  recipes/accelerate_configs/deepspeed_zero3.yaml` (`zero_stage: 3`, no offload, `zero3_init_flag: true`,
  `mixed_precision: bf16`, `num_processes: 8`): framework `deepspeed`, zero 3, dp 8, one node. The GPU: the handbook's
  cluster partition "hopper-prod" (H100, catalog `h100-sxm-80gb`); the recipes say "8 GPUs (80GB of VRAM)". The
  measured rates confirm it: the packed SFT rows run 6,360-6,770 tokens/s per GPU of a 7.24B model, 2.8-2.9e14
  model FLOP/s (6N per token, before recompute), 88-94 % of an A100's 312 TFLOPS peak but 28-30 % of an H100's 989.
- `zephyr-7b-dpo-full` (recipes/zephyr-7b-beta/dpo/config_full.yaml): `per_device_train_batch_size: 8`,
  `gradient_accumulation_steps: 2` (128 pairs per step), `gradient_checkpointing: true` (recompute `full`),
  `max_length: 1024`, `max_prompt_length: 512`, `beta: 0.01`, one epoch of UltraFeedback's 61,135 train pairs =
  478 steps (ceil(61135 / 128)); objective `dpo` with a live reference: scripts/run_dpo.py passes `ref_model = model`
  (the model name) and TRL 0.7.7 builds the reference and wraps it in a ZeRO-3 inference engine
  (trl/trainer/dpo_trainer.py:373-377 at v0.7.7), so each step runs the reference forward on the sharded copy and the
  policy forward/backward on the concatenated chosen+rejected batch. `torch_dtype: null` and no `use_flash_attention_2`:
  the attention is transformers' eager path (transformers 4.36 has no SDPA class for Mistral; its `MistralAttention`
  materialises the scores and upcasts the softmax to fp32): `kernels` token `eager_attention`, plan field
  `eager_attention` (core.frameworks EAGER_ATTENTION). The model is alignment-handbook/zephyr-7b-sft-full (Mistral-7B-v0.1:
  catalog `mistral-7b`, whose v0.3 vocabulary of 32,768 vs 32,000 adds 0.1 % parameters).
- `zephyr-7b-sft-full` (recipes/zephyr-7b-beta/sft/config_full.yaml): `per_device_train_batch_size: 16`,
  `gradient_accumulation_steps: 1`, `max_seq_length: 2048`, `gradient_checkpointing: true`,
  `use_flash_attention_2: true`, and scripts/run_sft.py passes `packing=True` to TRL's SFTTrainer (ConstantLengthDataset:
  every sequence is 2,048 tokens, documents concatenated): 128 x 2,048 tokens per step, objective `sft`. 1,088 steps
  (`train_steps_per_second` 0.194 x 5,608.3 s; the rounding allows 1,086-1,090, +-0.2 % on the step time).
- `mistral-7b-grok` (recipes/constitutional-ai/sft/config_grok.yaml at 8df2271, the recipe the handbook names for
  this model): `per_device_train_batch_size: 8`, `gradient_accumulation_steps: 4` (256 packed 2,048-token sequences per
  step), flash attention 2, gradient checkpointing, packing; the model card gives 545 steps, 8 devices, total batch 256,
  Transformers 4.36.2.

- `zephyr-orpo-141b-A35b` (recipes/zephyr-141b-A35b/orpo/config_full.yaml at 70769f9e9ba41c7f08ba6c4ff3725441b68b7ca3,
  2024-04-11): `sbatch --nodes=4 recipes/launch.slurm zephyr-141b-A35b orpo full fsdp`, i.e. accelerate with
  recipes/accelerate_configs/fsdp.yaml (`fsdp_sharding_strategy: FULL_SHARD`, TRANSFORMER_BASED_WRAP, BACKWARD_PRE,
  forward prefetch, `mixed_precision: bf16`) on 4 nodes of 8 H100 ("trained ... for 1.3 hours on 4 nodes of 8 x H100s",
  the model card; 4,772 s = 1.33 h): framework `fsdp`, zero 3, dp 32 across 4 nodes. TRL's ORPOTrainer (no reference
  model), `per_device_train_batch_size: 1`, `gradient_accumulation_steps: 1` (32 pairs per step),
  `gradient_checkpointing: true` with `gradient_checkpointing_kwargs: {use_reentrant: true}` (transformers' reentrant
  checkpoint outside each FSDP unit, not accelerate's `fsdp_activation_checkpointing`: FSDP1 gathers every block a
  third time for the recompute; `kernels` token `reentrant_checkpoint`, plan field `reentrant_checkpoint`, core.frameworks
  REENTRANT_REGATHER_FRAMEWORKS), flash attention 2, `max_length: 2048`, `optim: adamw_bnb_8bit`, `save_strategy: "no"`
  and no evaluation (the figure is the training loop alone); three epochs of 6,932 pairs = 3 x ceil(6932 / 32) = 651
  steps (`train_steps_per_second` 0.136 allows 647-651). Model mistral-community/Mixtral-8x22B-v0.1: catalog
  `mixtral-8x22b` (added with this source: 140.6B parameters, 39.2B active). The `kernels` token `adamw_bnb_8bit`
  sets the workload's optimizer (Workload.optimizer, core.frameworks OPTIMIZERS: bitsandbytes' 8-bit states); the
  inter-node link is the catalog H100's.

## Units and labels

- Step time: `train_runtime / steps`, seconds per optimizer step of the global batch. No memory is published.
- What else the figure holds: `train_runtime` is the whole training loop, so it includes the evaluations run inside it
  (SFT: one at the epoch end, 142 s by the published `eval_runtime`, 2.5 % of the SFT runs; DPO: four on 2,000 test
  pairs at `eval_steps: 100`) and the checkpoint saves every 100 steps (16-bit ZeRO-3 gathers of a 7B model): the
  label is an upper bound of the training step by a few per cent.

## Caveats

- The GPU of the DPO row: the SFT rows cannot have run on A100s (88-94 % of its peak), but the DPO row alone could
  (8N model FLOPs per token, policy 6N and reference 2N, recompute not counted: 17 % of an H100's peak at the 1,024
  cap, 55 % of an A100's), and the composition puts this plan at 11.16 s on
  8 A100 against 4.74 s on 8 H100 (measured: 11.15 s). What ties it to the H100 cluster: the recipe that run follows
  (beta 0.01, one epoch) and the `hopper-prod` partition arrived in the same commit, and the other DPO run of the
  handbook on that cluster (`mistral-7b-anthropic`, Feb. 2024, the Constitutional-AI models whose packed SFT runs at
  94 % of an A100's peak) evaluates 64 pairs (policy and reference forwards, 8 pairs per GPU) in 2.64 s ("eval_runtime":
  132.202 for 3,156 pairs, 50 steps), where this row trains 8 pairs per GPU (forward, recompute, backward, reference)
  in 5.57 s: 2.1x for 2.5x the FLOPs, the same GPU class, not an A100 against an H100.
- ORPO sequence length: TRL's ORPOTrainer pads each pair's chosen and rejected sequences to the longer of the two
  (one pair per GPU) and truncates at 2,048: the row carries the cap, an upper bound of the work as for DPO.
- DPO sequence length: TRL 0.7.7 pads each micro-batch's chosen and rejected sequences to the longest of the 16
  (trl/trainer/dpo_trainer.py:701-749, concatenated_inputs) and truncates at `max_length` 1024. The padded length varies
  per batch and is not published: the row carries the cap, 1024, so the work it implies is an upper bound, and a
  prediction that is too fast at 1024 tokens is too fast at any shorter length.
- 8-bit optimizer: the ORPO run's `adamw_bnb_8bit` keeps about 2 bytes of Adam state per parameter (a uint8 per
  moment and an fp32 absmax per 2,048 elements), where fp32 Adam keeps 8; the row carries it as its workload's
  optimizer, so its fit verdict is the run's (no memory label is published).
- The Hub shows a relative date; the rows' `collected_at` is the recipe commit date they follow.
- Versions: the recipes at f0ffa0d pin TRL 0.7.7, transformers 4.36.2, DeepSpeed 0.12.2, torch 2.1.2 (setup.py).

## Not imported

Other pushes to the same repositories whose figures do not belong to the recipe's run, a repeat of the imported SFT
plan, a DPO run whose runtime is half evaluation, and the many reruns of the recipe by other users (hardware not
stated): each is listed below with its reason.
"""

SPEC = Transcribed(upstream=UPSTREAM, module="alignment_handbook", section=SECTION)


def run(folder_root: Path, out_root: Path) -> dict[str, int]:
    return run_transcribed(folder_root, out_root, SPEC)
