"""Build the real TRL 1.16 trainer for a TrlConfig (no re-implementation: the trainers run as users run them).

- Configs: TRL 1.16's base config defaults `bf16=True` and `gradient_checkpointing=True`
  (trl/trainer/base_config.py:62-108); both are set explicitly here (fp32 on this CPU).
- DPO/KTO reference: `live` passes `ref_model=` (a second random-weight model with the policy's weights), which TRL
  prepares with accelerate in evaluation mode (dpo_trainer.py:980-986); `precomputed` passes `ref_model=None` with
  `precompute_ref_log_probs=True`: TRL then keeps no reference (dpo_trainer.py:908-914) and runs the policy once over
  the dataset at construction (dpo_trainer.py:1019-1025, 1168-1240).
- DPO/KTO never materialise the logits: `add_fused_lm_head` (trl/trainer/utils.py:1548-1690, applied at
  dpo_trainer.py:956-962) projects the hidden states through the head in 32768-token tiles; off Triton devices (this
  CPU) it scores every position (utils.py:1640-1652). CPO/ORPO (trl/experimental) still build the full
  (2B, T, V) logits (cpo_trainer.py:792-835) and take selective_log_softmax of them.
- FSDP: `fsdp="full_shard auto_wrap"` with FSDP2 per LlamaDecoderLayer. accelerate 1.15 turns FSDP on only for
  accelerator distributed types (accelerate/state.py:986-1016): on MULTI_CPU it would silently wrap the model in
  DDP. `enable_fsdp_on_cpu` sets the state's distributed type to FSDP when an FSDP plugin was given (the one line
  accelerate skips on CPU); everything after it (fsdp2_prepare_model, TRL's prepare_fsdp of the reference) is
  accelerate's and TRL's own code, and FSDP2 `fully_shard` runs over gloo (shared/notes/cpu-measurement.md)."""

from __future__ import annotations

from typing import Any

from perfpredict.collect.trl.grid import TrlConfig
from perfpredict.core.frameworks import zero_optimization

LAYER_CLASS = "LlamaDecoderLayer"


def enable_fsdp_on_cpu() -> None:
    """Let accelerate's FSDP path run on CPU (see the module docstring); idempotent."""
    import accelerate.state as state
    from accelerate.utils import DistributedType

    init = state.AcceleratorState.__init__
    if getattr(init, "_pp_fsdp_on_cpu", False):
        return

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin
            # Later AcceleratorState() calls copy PartialState's shared fields over their own (state.py:914-919):
            # the shared distributed type must say FSDP too, or the next one reads MULTI_CPU again.
            state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    patched._pp_fsdp_on_cpu = True  # type: ignore[attr-defined]
    state.AcceleratorState.__init__ = patched


def deepspeed_config(zero_stage: int, *, bf16: bool = False) -> dict[str, Any]:
    """The DeepSpeed config a user hands TrainingArguments(deepspeed=...): the ZeRO block `perfpredict rank --emit`
    writes (core.frameworks.zero_optimization: overlap_comm, contiguous gradients, bucket sizes "auto"), fp32
    (bf16/fp16 off, as the rest of the trainer), and "auto" where transformers fills values from the arguments and
    the model (transformers/integrations/deepspeed.py:204-240: reduce_bucket_size = hidden^2, ZeRO-3 prefetch
    0.9 hidden^2 and persistence threshold 10 hidden). Without "auto" DeepSpeed's default reduce bucket is 5e8
    elements (a 1.86 GiB fp32 buffer per step on these small models: measured). No `optimizer` block: the Trainer's
    torch AdamW goes to deepspeed.initialize and the ZeRO optimizer wraps it (DeepSpeed's own AdamW would be its
    CUDA/CPU-Adam op, not what runs on GPUs). bf16 (a GPU run): DeepSpeed's bf16 block, which keeps fp32 master
    weights in its optimizer, as TrainingArguments(bf16=True) writes it."""
    return {"zero_optimization": zero_optimization(zero_stage), "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto",
            "bf16": {"enabled": bf16}, "fp16": {"enabled": False}}


def common_args(cfg: TrlConfig, *, steps: int, out_dir: str) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        output_dir=out_dir, per_device_train_batch_size=cfg.per_device_batch,
        gradient_accumulation_steps=cfg.grad_accum, max_steps=steps, bf16=cfg.precision == "bf16", fp16=False,
        gradient_checkpointing=cfg.checkpointing, report_to=[], logging_steps=10_000, save_strategy="no",
        use_cpu=cfg.device == "cpu", dataloader_num_workers=0, disable_tqdm=True, seed=cfg.seed, learning_rate=1e-6,
        lr_scheduler_type="constant",
    )
    if cfg.backend == "fsdp":
        args.update(fsdp="full_shard auto_wrap",
                    fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": [LAYER_CLASS],
                                 "reshard_after_forward": True})
    if cfg.backend == "deepspeed":
        args.update(deepspeed=deepspeed_config(cfg.zero_stage, bf16=cfg.precision == "bf16"))
    return args


def build_trainer(cfg: TrlConfig, *, model: Any, ref_model: Any | None, tok: Any, train: Any, steps: int,
                  out_dir: str, callbacks: list[Any]) -> Any:
    """The trainer as a user would write it for this config."""
    common = common_args(cfg, steps=steps, out_dir=out_dir)
    max_length = cfg.seq_len + 8  # no truncation: lengths are the dataset's (+ BOS/EOS)
    if cfg.trainer == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, loss_type=[cfg.loss_type], max_length=max_length, padding_free=cfg.padding_free,
                         precompute_ref_log_probs=cfg.reference == "precomputed")
        return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=train, processing_class=tok,
                          callbacks=callbacks)
    if cfg.trainer == "kto":
        from trl import KTOConfig, KTOTrainer

        args = KTOConfig(**common, max_length=max_length, train_sampling_strategy="sequential",
                         precompute_ref_log_probs=cfg.reference == "precomputed")
        return KTOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=train, processing_class=tok,
                          callbacks=callbacks)
    if cfg.trainer == "cpo":
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        args = CPOConfig(**common, loss_type="simpo", cpo_alpha=0.0, max_length=max_length)
        return CPOTrainer(model=model, args=args, train_dataset=train, processing_class=tok, callbacks=callbacks)
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    args = ORPOConfig(**common, max_length=max_length)
    return ORPOTrainer(model=model, args=args, train_dataset=train, processing_class=tok, callbacks=callbacks)


def forwards_of(batch: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(rows, padded length, real tokens, scored tokens) of each model forward a collated batch feeds.

    DPO: one forward of [chosen; rejected] (input_ids, attention_mask, completion_mask; dpo_trainer.py:146-208).
    KTO: the batch and its KL batch (KL_* keys; kto_trainer.py:304-420). CPO/ORPO: chosen_* and rejected_* padded to
    the longer and concatenated into one forward (cpo_trainer.py:614-676), scored where labels != -100."""
    out: list[tuple[int, int, int, int]] = []
    if "chosen_input_ids" in batch:
        c, r = batch["chosen_input_ids"], batch["rejected_input_ids"]
        t = max(c.shape[1], r.shape[1])
        real = int(batch["chosen_attention_mask"].sum() + batch["rejected_attention_mask"].sum())
        scored = int((batch["chosen_labels"] != -100).sum() + (batch["rejected_labels"] != -100).sum())
        return [(c.shape[0] + r.shape[0], t, real, scored)]
    for prefix in ("", "KL_"):
        ids = batch.get(prefix + "input_ids")
        if ids is None:
            continue
        mask = batch.get(prefix + "attention_mask")
        comp = batch.get(prefix + "completion_mask")
        real = int(mask.sum()) if mask is not None else ids.numel()
        scored = int(comp.sum()) if comp is not None else 0
        out.append((ids.shape[0], ids.shape[1], real, scored))
    return out


def release(trainer: Any) -> None:
    """Drop what a finished trainer's DeepSpeed engines keep alive, as accelerate advises between two trainings
    (Accelerator.free_memory: DeepSpeedEngine.destroy(), then its lists of prepared objects). Without it a DeepSpeed
    run's fp32 partitions and Adam states stay reachable and count in the next run's memory."""
    acc = getattr(trainer, "accelerator", None)
    for eng in (getattr(trainer, "ref_model", None), getattr(trainer, "_precompute_engine", None)):
        if eng is not None and hasattr(eng, "destroy"):
            eng.destroy()
    if acc is not None:
        acc.free_memory()
    for name in ("model", "model_wrapped", "deepspeed", "optimizer", "lr_scheduler", "ref_model",
                 "_precompute_engine"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
