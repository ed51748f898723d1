"""What each training framework can run: the one capability table that the plan generator, `--emit` and collect
read.

One frozen `Capability` per framework (and per TRL backend). `why_not(plan, model)` is the single legality check
built from it: None when the framework can run the plan, else one clause saying why not. The plan generator counts
its reasons as rejections, emit refuses with it, `predict` refuses a scenario with it, and collect checks its own
harness row with it.

Sources read (cited as repo:path, the `search` tool's code/docs corpora):
- Megatron-LM: tensor/sequence/pipeline/context/expert parallelism (`--tensor-model-parallel-size`,
  `--sequence-parallel`, `--pipeline-model-parallel-size`, `--context-parallel-size`,
  `--expert-model-parallel-size`); 1F1B and interleaved 1F1B (`--num-layers-per-virtual-pipeline-stage`), no GPipe;
  uneven stages through `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`: the first and
  last stage take the given counts, the middle stages split the rest evenly; the embedding lives on the first stage
  and the output head + loss on the last, not counted as layers (megatron/core/transformer/transformer_block.py
  get_num_layers_to_build; vwxyzjn/Megatron-MoE-ModelZoo:design_docs/MR2795-flexible_asym_vpp_with_custom_pp_layout.md:
  with first/last given, each stage's count must still be divisible by the virtual pipeline size);
  distributed optimizer = ZeRO-1, Megatron-FSDP for ZeRO-2/3 (`--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads[_params]`); optimizer CPU offload (`--optimizer-cpu-offload
  --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer`, HybridDeviceOptimizer,
  megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) on top of the distributed optimizer, on any dp;
  Megatron turns `--sequence-parallel` off when tp is 1 (megatron/training/arguments.py: "Disabling sequence
  parallelism because tensor model parallelism is disabled").
- nanotron: ParallelismArgs dp/pp/tp/expert_parallel_size, pp_engine "1f1b" or "afab" (all-forward-all-backward =
  GPipe), tp_mode REDUCE_SCATTER = sequence parallel (nanotron/config/parallelism_config.py); ZeRO-1 only, no
  interleaved schedule, no ring attention / CP (README roadmap); pipeline blocks (embedding, each decoder layer, final
  norm + lm_head) are assigned to pp ranks by balancing their compute cost, so layers split unevenly when pp does
  not divide them and the embedding/head count as work on the first/last rank.
- DeepSpeed as TRL / HF Trainer drive it through accelerate: ZeRO 0-3 over data parallelism only (its pipeline
  engine needs a PipelineModule, which the HF Trainer never builds); `offload_optimizer` with stage 1, 2 or 3 and
  `offload_param` with stage 3 (ZeRO-Infinity), on any GPU count: ZeRO-Offload "enables large models with up to 13
  billion parameters to be efficiently trained on a single GPU" (deepspeed.ai/tutorials/zero-offload).
- FSDP as accelerate drives it: FULL_SHARD (3) / SHARD_GRAD_OP (2), no TP/PP/CP through accelerate's FSDP plugin;
  `fsdp_offload_params` (CPUOffload) moves parameters, gradients and the optimizer step to the host, single GPU
  included.
- TRL 1.16 (DPOTrainer, CPOTrainer/ORPOTrainer under trl.experimental, KTOTrainer) on accelerate 1.15: `trl` is the
  plain accelerate launch (one process, or DDP: accelerator.prepare wraps the model in DistributedDataParallel),
  `trl+deepspeed` ZeRO 0-3 with optimizer/param offload, `trl+fsdp` FSDP (zero 2/3); no TP/PP/CP. Measured by
  `perfpredict collect trl` and modelled by features/trl.py: `rank --framework trl` ranks all three.
- perfpredict collect's harness (perfpredict/collect/harness/parallel.py, torchtitan-like, PyTorch-native): DDP, FSDP2
  (zero 2/3; zero 1 runs as 2), DTensor TP (+SP, not with MoE), 2-D TP x FSDP, torch.distributed.pipelining alone
  (tp = dp = 1) with GPipe or 1F1B and an even split; no CP, no offload. Its rows are recorded as framework "fsdp".
- FSDP2 + TP on DTensor, launched by torchrun without accelerate (`fsdp2`): torchtitan's parallelize (fully_shard
  per transformer block over the dp mesh, DTensor tensor/sequence parallelism over the tp mesh; activation
  checkpointing `full` per block or `selective` per op: pytorch/torchtitan torchtitan/distributed/
  activation_checkpoint.py:185-192, 269-273 saves matmul, attention and reduce-scatter outputs except every second
  matmul, and recomputes the rest) for pretraining; NeMo-RL's DTensor policy worker for SFT and DPO (NVIDIA/NeMo-RL
  nemo_rl/models/policy/dtensor_policy_worker.py:172-195: a (dp, tp) device mesh, `_parallelize_model` with
  sequence_parallel and cpu_offload; nemo_rl/models/dtensor/parallelize.py:467-469 checkpoints only each layer's
  MLP, which is not modelled, so its plans rank without recompute).
- Which objectives run where (`Trainer`, Capability.trainers): a plan of a framework is ranked for an objective only
  where one of its trainers runs that objective, with that trainer's own restrictions and reference handling.
  Megatron-LM's pretrain_gpt.py trains the causal-LM loss only; preference objectives on Megatron run under
  NeMo-Aligner's DPO trainer (dpo, ipo and rpo losses; distributed_fused_adam, no ZeRO-2/3 or optimizer offload; the
  reference's weights kept on the host and swapped in to score each global batch, `cpu_weight_swap`). NeMo-RL's DPO
  keeps the reference state dict in pinned host memory and copies it into the model for the reference log-probs
  (dtensor_policy_worker.py:207-214 and use_reference_model, :621-657). nanotron has no preference trainer. TRL's
  trainers (and the TRL/accelerate DeepSpeed and FSDP launches) run every objective of core.objectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perfpredict.core.errors import PerfPredictError

if TYPE_CHECKING:
    from perfpredict.core.model import ModelSpec
    from perfpredict.core.plan import Plan

# How a framework splits layers over pipeline stages when it may split them unevenly.
EVEN = "even"  # every stage the same number of layers
FIRST_LAST = "first_last"  # Megatron: first/last stage counts given, middle stages even
BALANCED = "balanced"  # nanotron / torchtitan: as even as possible, embedding and head counted as work


# How a framework's `recompute selective` recomputes, in forward passes per micro-batch and layer (the composition
# and the FLOP count read these): Megatron/nanotron recompute the core attention (softmax, dropout, the attention
# product: Korthikanti et al. 2022, megatron/core/transformer/transformer_config.py recompute_granularity
# "selective", recompute_modules ["core_attn"]); torchtitan's per-op SAC keeps matmul and attention outputs except
# every second matmul, so it recomputes half the matmuls and every elementwise op, never attention
# (torchtitan/distributed/activation_checkpoint.py:269-273).
@dataclass(frozen=True)
class SelectiveRecompute:
    gemm_fwd: float = 0.0  # share of the layer's forward matmuls recomputed
    attention_fwd: float = 1.0  # attention forwards recomputed
    elementwise_fwd: float = 0.0  # elementwise (norm, activation, residual) forwards recomputed

    def __post_init__(self) -> None:
        for f in ("gemm_fwd", "attention_fwd", "elementwise_fwd"):
            v = getattr(self, f)
            if not 0.0 <= v <= 1.0:
                raise PerfPredictError(f"selective recompute {f} must be a share in [0, 1], got {v!r}")


CORE_ATTENTION = SelectiveRecompute()
EVERY_OTHER_MATMUL = SelectiveRecompute(gemm_fwd=0.5, attention_fwd=0.0, elementwise_fwd=1.0)

# Reference handling a trainer may impose (core.workload's reference modes).
AS_ASKED = ""  # the workload's own (live / offloaded / precomputed)
HOST_SWAP = "offloaded"  # weights in host memory, swapped in to score a batch without a gradient


@dataclass(frozen=True)
class Trainer:
    """A real program that trains some objectives on a framework's plans, with its own limits. Capability.trainers
    lists them; a (framework, objective) pair is ranked only where one of them runs it (trainer_refusal)."""

    name: str
    objectives: tuple[str, ...]
    zero_stages: tuple[int, ...] | None = None  # None: what the framework allows
    optimizer_offload: bool = True
    recompute: tuple[str, ...] | None = None  # None: what the framework allows
    recompute_why: str = ""  # the clause refusing a recompute it lacks
    reference: str = AS_ASKED  # how a live reference is held (HOST_SWAP: the trainer swaps it in from host memory)
    # Host<->GPU copies of the rank's resident weights per reference scoring (once per global batch) when it swaps
    # them: NeMo-Aligner's cpu_weight_swap (NVIDIA/NeMo-Aligner nemo_aligner/utils/utils.py swap_dict: the policy's
    # state dict to host, the reference's in, the policy's back) and NeMo-RL's use_reference_model
    # (dtensor_policy_worker.py:621-657) both make three.
    reference_swap_copies: int = 0
    emit: str = ""  # what `--emit` writes for it (messages)
    config: str = ""  # which config emit writes for it (predictor.emit reads it: "torchtitan", "nemo-rl" ...)

    def __post_init__(self) -> None:
        from perfpredict.core.objectives import OBJECTIVES

        bad = [o for o in self.objectives if o not in OBJECTIVES]
        if not self.objectives or bad:
            raise PerfPredictError(f"trainer {self.name}: objectives must be among {', '.join(OBJECTIVES)}, got {bad}")
        if self.reference not in (AS_ASKED, HOST_SWAP):
            raise PerfPredictError(f"trainer {self.name}: reference must be {AS_ASKED!r} or {HOST_SWAP!r}")


@dataclass(frozen=True)
class Capability:
    name: str
    display: str  # how messages name it
    tp: bool = False
    sequence_parallel: bool = False
    pp: bool = False
    schedules: tuple[str, ...] = ("1f1b",)  # pipeline schedules (pp > 1)
    interleaved_needs_ga_multiple: bool = True  # Megatron: micro-batches a multiple of pp for interleaving
    stage_split: str = EVEN
    pp_alone: bool = False  # pipeline only without tp and dp (collect's harness)
    cp: bool = False
    ep: bool = False
    zero_stages: tuple[int, ...] = (0,)  # with dp > 1
    zero_with_pp: tuple[int, ...] = (0, 1)
    zero_with_tp_dp: tuple[int, ...] = (0, 1, 2, 3)  # stages legal when tp > 1 and dp > 1
    # Stages legal at dp = 1: they shard nothing there, but ZeRO-Offload runs ZeRO on one GPU to offload; the plan
    # generator only offers them with offload.
    zero_single_replica: tuple[int, ...] = (0,)
    optimizer_offload_zero: tuple[int, ...] = ()  # ZeRO stages optimizer offload works with (empty: none)
    param_offload_zero: tuple[int, ...] = ()
    recompute: tuple[str, ...] = ("none", "full")
    moe_sequence_parallel: bool = True
    rankable: bool = True  # the predictor models it, so `rank`/`predict` accept it
    unrankable_why: str = ""
    emit_target: str | None = None  # the config-writing `--emit` target named after it
    records_as: str = ""  # framework label its measured rows carry ("" = its own name)
    backends: tuple[str, ...] = ()
    runtime: str = ""  # the distributed runtime whose memory/communication rules apply ("" = its own name)
    explicit_only: bool = False  # ranked only when asked for (--framework), not in the default plan space
    # Frameworks of one family share learned corrections' domains and intervals ("" = its own name): the 3-D
    # parallel trainers, the ZeRO trainers, TRL's trainers.
    family: str = ""
    zero_refusal: str = ""  # the clause refusing a ZeRO stage it lacks, when it says more than the stages
    offload_zero0_refusal: str = ""  # the clause refusing optimizer offload at zero 0, when it says more
    launcher: str = "accelerate"  # how emitted scripts start it: "torchrun" (Megatron) or "accelerate launch"
    emit_writes: str = ""  # what its own `--emit` target writes (messages)
    notes: tuple[str, ...] = field(default=())
    selective: SelectiveRecompute = CORE_ATTENTION  # what `recompute selective` recomputes
    # Steps run in transformers' Trainer loop (TRL's trainers subclass it) on transformers' eager model code: the
    # loop's no_sync over all but the last micro-batch (Runtime.no_sync_keeps_unsharded_grads) and, on a GPU, the
    # eager layer ops of HF_EAGER_LAYER (models.compose).
    hf_trainer: bool = False
    trainers: tuple[Trainer, ...] = ()  # () = every objective, as the workload asks (TRL's trainers)

    def trainer_for(self, objective: str) -> Trainer | None:
        """The first trainer that runs `objective` on this framework (None: none does). A framework without a
        trainer list runs every objective itself."""
        if not self.trainers:
            return Trainer(self.display, (objective,))
        return next((t for t in self.trainers if objective in t.objectives), None)

    def zero_choices(self, *, tp: int, pp: int, dp: int, offload: bool) -> tuple[int, ...]:
        """ZeRO stages this framework can run on this layout (offload: only those offload works with)."""
        if dp == 1:
            allowed = set(self.zero_single_replica)
        else:
            allowed = set(self.zero_stages)
            if pp > 1:
                allowed &= set(self.zero_with_pp)
            if tp > 1:
                allowed &= set(self.zero_with_tp_dp)
        if offload:
            allowed &= set(self.optimizer_offload_zero)
        return tuple(sorted(allowed))


_FSDP_ZERO = "FSDP shards gradients and optimizer state at least: zero must be 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD)"
_DS_OFFLOAD = "DeepSpeed optimizer offload needs ZeRO stage 1 or more"
_HF = dict(tp=False, pp=False, cp=False, ep=False, recompute=("none", "full"), hf_trainer=True)


@dataclass(frozen=True)
class EagerLayerTraffic:
    """What transformers' eager decoder layer moves through memory per forward, beyond the fused kernels the
    composition times (an RMSNorm reading and writing its tensor once, a fused SwiGLU, the residual adds), in 16-bit
    element moves (reads + writes; an fp32 element counts 2). Read from transformers 5.24.0 (installed):
    - models/llama/modeling_llama.py:62-67 LlamaRMSNorm: `.to(float32)` (1 read, 2 written), `pow(2)` (2, 2),
      `.mean(-1)` (2), `* rsqrt(...)` (2, 2), `.to(input_dtype)` (2, 1), `weight *` (1, 1): 18 per element against
      the fused 2, two norms per layer on [T, h];
    - :119-123, 147-148 rotary: `q * cos` (1, 1), `-x2` (half: 0.5, 0.5), `torch.cat` (1, 1), `* sin` (1, 1), `+`
      (2, 1): 10 per element of q [T, a*hd] and k [T, kv*hd];
    - integrations/sdpa_attention.py:42-51, 126-127: with an attention mask (TRL pads chosen and rejected) CUDA SDPA
      runs without GQA, so `repeat_kv` copies K and V out to every head (a*hd written and kv*hd read per token,
      each), and :194-195 `transpose(1, 2).contiguous()` copies the attention output [T, a*hd] (1, 1);
    - :164 LlamaMLP `act_fn(gate_proj(x)) * up_proj(x)`: SiLU (1, 1) and the product (2, 1), 5 per element of
      [T, ffn] against the fused SwiGLU's 3.
    The backward moves about twice the forward's bytes, as for the other elementwise ops (models.compose)."""

    norm_extra: float = 2.0 * (18.0 - 2.0)  # per hidden element: both norms, beyond the fused ones
    rotary: float = 10.0  # per element of q and of k
    repeat_kv: float = 1.0  # per element of K and of V after repeating (written), plus their read at kv/a
    attn_out_copy: float = 2.0  # per element of the attention output
    mlp_extra: float = 5.0 - 3.0  # per element of the MLP's intermediate, beyond the fused SwiGLU


HF_EAGER_LAYER = EagerLayerTraffic()
# The same layer with Liger-Kernel's layer kernels (plan fused_head: `use_liger_kernel` / `--use_liger_kernel` apply
# apply_liger_kernel_to_<model> with its defaults, which swap the norms, rotary and MLP besides fusing the head and
# loss: linkedin/Liger-Kernel src/liger_kernel/transformers/monkey_patch.py:253-268 at ead96b61, :28-67 at 1dce7fd4,
# the build of its Hugging Face example logs). LigerRMSNorm is one kernel reading X and writing Y
# (ops/rms_norm.py:185-217 at 1dce7fd4): the fused norm the composition already times, nothing extra.
# LigerSwiGLUMLP computes silu(a) * b in one kernel (ops/swiglu.py:63-74): the fused SwiGLU, nothing extra.
# liger_rotary_pos_emb rotates q and k in place in one kernel (ops/rope.py:120-140): 2 moves per element of q and
# k against eager rotary's 10. The attention path (repeat_kv, the output copy) is transformers' own and stays.
LIGER_LAYER = EagerLayerTraffic(norm_extra=0.0, rotary=2.0, mlp_extra=0.0)


@dataclass(frozen=True)
class EagerAttentionTraffic:
    """What transformers' eager attention (attn_implementation "eager": no flash kernel; the only non-flash path
    of Mistral and Mixtral before transformers 4.37, which added their SDPA classes) moves through memory per
    element of the materialised score matrix [micro-batch sequences, heads, s, s], in 16-bit element moves (an fp32
    element counts 2), beyond the fused attention kernel timed for the same FLOPs. Read from transformers 5.24.0
    (installed) models/mistral/modeling_mistral.py:96-118 eager_attention_forward, the same op sequence as the 4.36
    MistralAttention.forward the alignment handbook's DPO run used:
    - forward: `matmul(query, key^T)` writes the scores (1); `* scaling` (1 read, 1 written); `+ attention_mask`
      (1, 1; the [b, 1, s, s] mask is broadcast over the heads); `softmax(..., dtype=float32)` (1 read, 2 written);
      `.to(query.dtype)` (2, 1); `matmul(attn_weights, value)` reads them (1): 12. `dropout(p=0.0)` returns its
      input without a kernel (torch: F.dropout(x, 0.0, True) is x, checked on the installed torch).
    - backward (autograd of the same ops): dP = dO V^T written (1) and P read for dV (1); the cast's backward to fp32
      (1, 2); softmax backward reading the fp32 gradient and output, writing the input-dtype gradient (2 + 2, 1); the
      scaling's backward (1, 1); dS read for dQ and dK (2): 14.
    The score GEMMs' FLOPs stay with the attention kernel's time (models.compose)."""

    fwd_per_score: float = 12.0
    bwd_per_score: float = 14.0


EAGER_ATTENTION = EagerAttentionTraffic()
# Frameworks whose ZeRO-3 gathers every wrapped block once more for the recompute when recompute runs as
# transformers' gradient_checkpointing with use_reentrant true (plan reentrant_checkpoint; transformers' default when
# gradient_checkpointing_kwargs is not given), i.e. torch.utils.checkpoint's reentrant function called on the
# FSDP-wrapped decoder layer from outside it. FSDP1 (torch/distributed/fsdp/_runtime_utils.py @00ae0bc, the FSDP of
# torch 2.1-2.2): the checkpointed first forward runs under no_grad, so `_register_pre_backward_hooks` registers
# nothing ("if not torch.is_grad_enabled(): return outputs") and `_post_forward_reshard` frees the block
# (FULL_SHARD is in RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES); in the backward the recompute calls the block's
# forward again, whose `_pre_forward_unshard` all-gathers it, `_post_forward` reshards it and registers the
# pre-backward hooks, and `_pre_backward_hook` all-gathers it a third time (`_needs_pre_backward_unshard`) for the
# block's backward. The published runs that set it (the handbook's ORPO, torch 2.1-2.2) ran that FSDP1. accelerate's
# `fsdp_activation_checkpointing` wraps the layer inside the FSDP unit with the non-reentrant checkpoint_wrapper, whose
# recompute runs within the unshard of the block's pre-backward: two gathers; `--emit` writes that (and never sets
# this field). DeepSpeed keeps the recompute's gather for the backward (stage3_max_reuse_distance,
# Runtime.zero3_reuse_distance): two as well. FSDP2's fully_shard is not claimed here (not read).
REENTRANT_REGATHER_FRAMEWORKS = ("fsdp", "trl+fsdp")
_MEGATRON_LM = Trainer("Megatron-LM pretrain_gpt.py", ("pretrain", "sft"), emit="Megatron-LM arguments",
                       config="megatron-lm")
# NeMo-Aligner's Megatron DPO trainer: preference_loss dpo / ipo / rpo_*, distributed_fused_adam (ZeRO-1-like), the
# reference on the host swapped in per global batch (cpu_weight_swap); what `--emit torchrun` writes for it.
_NEMO_ALIGNER_DPO = Trainer("NeMo-Aligner DPO (examples/nlp/gpt/train_gpt_dpo.py)", ("dpo", "ipo"),
                            zero_stages=(0, 1), optimizer_offload=False, reference=HOST_SWAP, reference_swap_copies=3,
                            emit="NeMo-Aligner overrides (target torchrun)", config="nemo-aligner")

CAPABILITIES: dict[str, Capability] = {c.name: c for c in [
    Capability(
        "megatron", "Megatron-LM", tp=True, sequence_parallel=True, pp=True, schedules=("1f1b", "interleaved"),
        stage_split=FIRST_LAST, cp=True, ep=True, zero_stages=(0, 1, 2, 3), zero_with_pp=(0, 1),
        zero_single_replica=(0, 1), optimizer_offload_zero=(1, 2, 3), recompute=("none", "selective", "full"),
        emit_target="megatron", family="3d", launcher="torchrun", emit_writes="Megatron-LM arguments",
        notes=("zero 1 = distributed optimizer; zero 2/3 through Megatron-FSDP (not with pp)",
               "optimizer CPU offload needs the distributed optimizer (zero >= 1), any dp including 1"),
        trainers=(_MEGATRON_LM, _NEMO_ALIGNER_DPO)),
    Capability(
        "nanotron", "nanotron", tp=True, sequence_parallel=True, pp=True, schedules=("1f1b", "gpipe"),
        stage_split=BALANCED, cp=False, ep=True, zero_stages=(0, 1), zero_with_pp=(0, 1),
        recompute=("none", "selective", "full"), emit_target=None, family="3d",
        notes=("reads its own YAML config: no --emit target",),
        trainers=(Trainer("nanotron run_train.py", ("pretrain", "sft")),)),
    Capability(
        "deepspeed", "DeepSpeed (as TRL/accelerate drive it)", **_HF, zero_stages=(0, 1, 2, 3),
        zero_single_replica=(0, 1, 2, 3), optimizer_offload_zero=(1, 2, 3), param_offload_zero=(3,),
        emit_target="deepspeed", family="zero", emit_writes="DeepSpeed ZeRO configs",
        offload_zero0_refusal=_DS_OFFLOAD,
        notes=("ZeRO-Offload on a single GPU: ZeRO runs at world size 1",)),
    Capability(
        "fsdp", "FSDP (as TRL/accelerate drive it)", **_HF, zero_stages=(2, 3), zero_single_replica=(2, 3),
        optimizer_offload_zero=(3,), emit_target="fsdp", family="zero", emit_writes="an accelerate FSDP config",
        zero_refusal=_FSDP_ZERO,
        notes=("zero 2 = SHARD_GRAD_OP, 3 = FULL_SHARD; at dp 1 only with offload (fsdp_offload_params), which moves "
               "parameters, gradients and the optimizer step to the host",)),
    Capability(
        "fsdp2", "FSDP2 + TP on DTensor (torchtitan, NeMo-RL)", tp=True, sequence_parallel=True, pp=False, cp=False,
        ep=False, zero_stages=(2, 3), zero_with_tp_dp=(2, 3), zero_single_replica=(0, 3), optimizer_offload_zero=(3,),
        recompute=("none", "selective", "full"), selective=EVERY_OTHER_MATMUL, moe_sequence_parallel=False,
        runtime="fsdp", family="zero", emit_target="fsdp2", launcher="torchrun",
        emit_writes="a torchtitan configuration (pretraining) or NeMo-RL overrides (SFT, DPO)",
        zero_refusal=_FSDP_ZERO,
        notes=("fully_shard per transformer block over dp (zero 3; zero 2 = reshard_after_forward False), DTensor "
               "TP/SP over tp; zero 0 only at dp 1 (TP alone); optimizer offload = CPUOffloadPolicy",
               "recompute selective = torchtitan's per-op SAC (every second matmul and the elementwise ops "
               "recomputed), full = every block"),
        trainers=(Trainer("torchtitan (torchtitan/train.py)", ("pretrain",),
                          emit="a torchtitan configuration module and launch.sh", config="torchtitan"),
                  Trainer("NeMo-RL DTensor policy worker (examples/run_sft.py, examples/run_dpo.py)", ("sft", "dpo"),
                          zero_stages=(0, 3), recompute=("none",),
                          recompute_why=("NeMo-RL's DTensor worker checkpoints only each layer's MLP "
                                         "(nemo_rl/models/dtensor/parallelize.py:467-469), which is not modelled: use "
                                         "recompute none"),
                          reference=HOST_SWAP, reference_swap_copies=3, emit="NeMo-RL overrides in launch.sh",
                          config="nemo-rl"))),
    Capability(
        "harness", "perfpredict collect's PyTorch-native harness", tp=True, sequence_parallel=True, pp=True,
        schedules=("gpipe", "1f1b"), pp_alone=True, cp=False, ep=False, zero_stages=(0, 1, 2, 3), zero_with_pp=(0,),
        zero_with_tp_dp=(1, 2, 3), recompute=("none", "selective", "full"), moe_sequence_parallel=False,
        rankable=False, unrankable_why="it is the measurement harness; its rows train the fsdp model",
        records_as="fsdp", notes=("zero 1 runs (and is recorded) as zero 2: FSDP has no ZeRO-1",)),
    Capability(
        "trl", "TRL on accelerate (one process or DDP)", **_HF, zero_stages=(0,), zero_single_replica=(0,),
        emit_target="trl", runtime="ddp", explicit_only=True, backends=("trl+deepspeed", "trl+fsdp"), family="trl",
        emit_writes="a TRL trainer config and its accelerate (DDP, DeepSpeed or FSDP) files",
        notes=("accelerate's MULTI_GPU launch: DistributedDataParallel over dp, no ZeRO; `--framework trl` also ranks "
               "its DeepSpeed and FSDP backends",)),
    Capability(
        "trl+deepspeed", "TRL on DeepSpeed", **_HF, zero_stages=(0, 1, 2, 3), zero_single_replica=(0, 1, 2, 3),
        optimizer_offload_zero=(1, 2, 3), param_offload_zero=(3,), emit_target="deepspeed", runtime="deepspeed",
        explicit_only=True, family="trl", offload_zero0_refusal=_DS_OFFLOAD),
    Capability(
        "trl+fsdp", "TRL on FSDP", **_HF, zero_stages=(2, 3), zero_single_replica=(2, 3), optimizer_offload_zero=(3,),
        emit_target="fsdp", runtime="fsdp", explicit_only=True, family="trl", zero_refusal=_FSDP_ZERO),
]}
RANKABLE = tuple(n for n, c in CAPABILITIES.items() if c.rankable)
# What `rank` searches when no --framework is given: TRL plans run the same runtimes as deepspeed/fsdp, so they are
# ranked when asked for (`--framework trl`), not twice by default.
DEFAULT_RANKED = tuple(n for n in RANKABLE if not CAPABILITIES[n].explicit_only)
# Framework -> the runtime whose memory and communication rules apply (features read this, not the names).
RUNTIME = {n: (c.runtime or n) for n, c in CAPABILITIES.items()}
# nanotron's loss (huggingface/nanotron at 9055c664, 2025-01, the build the Ultra-Scale playbook ran; the same lines
# at HEAD 2411b022): LlamaModel.forward_with_hidden_states casts the lm_head's 16-bit vocab-parallel logits to fp32
# (`cast_to_fp32` = `x.float()`, src/nanotron/models/llama.py:874-876, 909) and Loss.forward passes them to
# sharded_cross_entropy with dtype=torch.float (:971-973, a no-op cast), whose _ShardedCrossEntropy.forward subtracts
# the max out of place (`sharded_logits - logits_max.unsqueeze(dim=-1)`,
# src/nanotron/parallel/tensor_parallel/functional.py:43) and exponentiates/normalises that copy in place (:74, :82)
# to save it as the softmax (:85). The fp32 logits stay referenced by LlamaForTraining.forward while the loss runs:
# 4 + 4 = 8 B per logit allocated at the loss's forward, the step's peak on the stage holding the head (all of the
# micro-batch's activations are still stored then). The 16-bit logits (2 B) are freed when forward_with_hidden_states
# returns (the fp32 cast saves nothing for its backward); their block stays cached, so a reserved-memory peak can
# hold 10 B, which is the caching allocator's, not counted here.
NANOTRON_CE_LOGIT_BYTES = 8.0


def nanotron_stage_layers(layers: int, pp: int, *, hidden: int, attn_width: int, ffn: int,
                          vocab: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage as nanotron places them (huggingface/nanotron at 9055c664,
    src/nanotron/models/base.py:216-236 build_model): every PipelineBlock in module order gets the current rank, and
    the rank advances once the cumulative cost exceeds rank_threshold = total x (rank + 1) / pp, so a stage takes
    blocks until it passes its share, the one passing included. Costs (src/nanotron/models/llama.py:913-924
    get_block_compute_costs): a decoder layer 4 x heads x head_dim x hidden + 3 x ffn x hidden, the lm_head
    (TensorParallelColumnLinear) vocab x hidden, every other block (embedding, final norm, the fp32 cast, the loss)
    0. The head's cost makes the split front-loaded: Llama-1B-like (16 layers, head = 4 layers' cost) over 8 stages
    gives the first stage 3 layers, not 2. Stages after the last layer hold 0 (only the head)."""
    if pp < 1 or layers < 1:
        raise PerfPredictError(f"nanotron_stage_layers needs pp >= 1 and layers >= 1, got pp={pp}, layers={layers}")
    layer = 4.0 * attn_width * hidden + 3.0 * ffn * hidden
    # (cost, is a decoder layer) in LlamaModel's block order: embedding, layers, final norm, lm_head, cast, loss.
    blocks = [(0.0, False)] + [(layer, True)] * layers + [(0.0, False), (float(vocab) * hidden, False),
                                                          (0.0, False), (0.0, False)]
    total = sum(cost for cost, _ in blocks)
    counts = [0] * pp
    rank, cum = 0, 0.0
    for cost, is_layer in blocks:
        cum += cost
        counts[rank] += is_layer
        if rank < pp - 1 and cum > total * ((rank + 1) / pp):  # nanotron's thresholds, same float order
            rank += 1
    return tuple(counts)


@dataclass(frozen=True)
class Runtime:
    """How a distributed runtime behaves while it trains: the rules the descriptors (features.compute, .memory,
    .trl), the composition (models.compose) and emit read instead of testing runtime names. A framework's runtime is
    its Capability.runtime (trl+deepspeed runs DeepSpeed's); rows carry it as d_runtime.

    Bytes and dtypes: Megatron/nanotron keep fp32 main gradients and reduce them in fp32 and hold an fp32 master
    copy; DeepSpeed holds bf16 gradients and an fp32 master; FSDP2's fp32 sharded parameters double as the master
    (fp32 gradients, no separate copy); plain torch DDP (TRL on accelerate) optimises the parameters as loaded (fp32
    under autocast with master weights, else the 16-bit dtype throughout)."""

    name: str
    grad_reduce_fp32: bool = False  # gradients reduced in fp32 whatever the compute dtype
    params_as_loaded: bool = False  # torch optimizer on the parameters as loaded: no master copy, dtype as loaded
    weights_fp32: bool = False  # parameters held in fp32 (FSDP2 mixed precision: the sharded fp32 copy)
    grads_fp32: bool = False  # gradients held in fp32
    separate_master: bool = True  # an fp32 master copy beside 16-bit weights (mixed precision)
    # DeepSpeed's ZeRO optimizers clone their partition into an fp32 master even for an fp32 model, from this stage
    master_clone_from_zero: int | None = None
    # Gradients reduced every micro-batch (not once per step) from this ZeRO stage on
    reduce_every_microbatch_from_zero: int | None = None
    overlaps_grad_reduce: bool = True  # gradient reduction overlaps the backward by default
    fused_vocab_ce: bool = False  # vocab-parallel fused cross entropy (fp32 softmax only), not HF's logits path
    # Bytes per vocab-parallel logit alive at the loss's forward (fused_vocab_ce runtimes): Megatron's fused loss keeps
    # the fp32 softmax (6 with the 16-bit logits); nanotron's, see NANOTRON_CE_LOGIT_BYTES.
    vocab_ce_logit_bytes: float = 6.0
    # The runtime splits layers over pipeline stages by its own compute-cost rule (nanotron_stage_layers) when the
    # plan gives no split.
    cost_balanced_stages: bool = False
    zero2_keeps_unsharded: bool = False  # ZeRO-2 keeps the whole unsharded model from forward to backward (FSDP)
    ddp_buckets_at_zero0: bool = False  # torch DDP's gradient buckets at zero 0 over dp > 1 without tp/pp
    # A live reference is sharded like the policy from this ZeRO stage on (0: always; None: a full replica)
    reference_sharded_from_zero: int | None = None
    # ZeRO-3 keeps parameters gathered within stage3_max_reuse_distance, and over one rank gathers nothing
    zero3_reuse_distance: bool = False
    frees_grads_each_step: bool = False  # the HF Trainer's zero_grad(set_to_none) frees gradients between steps
    own_grad_buffers: bool = False  # the engine keeps its own gradient buckets/partitions (DeepSpeed ZeRO 0-2)
    engine_step_host_work: bool = False  # an engine with per-step host work and per-module ZeRO-3 hooks (DeepSpeed)
    # ZeRO-3 gathers in prefetch buckets of parameters (DeepSpeed: one all_gather_coalesced per submodule and per
    # prefetch set, partitioned_param_coordinator.py:285-343, 380-413) rather than one message per wrapped block (FSDP)
    zero3_prefetch_buckets: bool = False
    accelerate_activation_checkpointing: bool = False  # recompute is accelerate's plugin option, not transformers'
    accelerate_config_file: str = "accelerate_config.yaml"
    # Host RAM of optimizer offload (features.memory.host_memory): FSDP's only offload, CPUOffload(offload_params),
    # keeps the sharded parameters on the host too; DeepSpeed pins a 16-bit staging copy of the shard beside it.
    offload_moves_params: bool = False
    offload_16bit_host_buffer: bool = False
    # Under transformers' Trainer (Capability.hf_trainer) every micro-batch but the last runs in accelerate's no_sync
    # (transformers trainer.py:1904-1916, all runtimes but DeepSpeed). accelerate's FSDP2 no_sync is
    # `set_requires_gradient_sync(False)` (accelerator.py:1165-1170), after which FSDP2's post_backward reshards the
    # parameters but keeps each block's unsharded gradient (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
    # post_backward :607-612; _fsdp_param.py:802-813 to_accumulated_grad_if_needed leaves it as is when it is
    # already in reduce_dtype, the compute dtype under accelerate's policy, utils/dataclasses.py:2120): the whole
    # model's unsharded gradients stay alive until the last micro-batch's reduce-scatter, the step's only one.
    no_sync_keeps_unsharded_grads: bool = False
    # The optimizer step's own transients (features.memory.optimizer_step), alive once the activations are gone:
    # - the torch AdamW transformers' Trainer builds when nothing else names the optimizer (`optim` "adamw_torch", its
    #   default until transformers 4.54 with torch >= 2.8 made it "adamw_torch_fused", huggingface/transformers#37358)
    #   runs `_multi_tensor_adam` on GPU tensors (foreach is torch's default for cuda, never for cpu:
    #   torch/optim/optimizer.py:161-186 `_default_to_fused_or_foreach`), whose `exp_avg_sq_sqrt =
    #   torch._foreach_sqrt(device_exp_avg_sqs)` (torch/optim/adam.py:790 in torch 2.13) allocates one copy of the
    #   second moment of a whole parameter group (the group's tensors are stepped together, grouped only by device
    #   and dtype, :626): the moments' bytes per parameter of the rank's shard. Not DeepSpeed: the config we emit
    #   names DeepSpeed's own AdamW (predictor/emit/deepspeed.py), its FusedAdam steps in fixed chunks.
    trainer_torch_adamw: bool = False
    # DeepSpeed's ZeRO optimizers flatten an optimizer unit's 16-bit gradients and cast them into an fp32 `.grad` of
    # the unit's master partition at the step, freed after it: ZeRO-3 one sub-group at a time (stage3.py:2398-2410
    # `_prepare_fp32_grad_for_sub_group`, :2448-2453 `_release_sub_group`, sub-groups of sub_group_size parameters
    # :1160-1183, DS_SUB_GROUP_SIZE), ZeRO-1/2 the rank's partition of each parameter group (stage_1_and_2.py:2345-2382:
    # `flat_grad_partition.to(fp32)`, `del flat_grad_partition`, `.grad = None` after `_optimizer_step(i)`; deepspeed
    # 0.19.6). From this ZeRO stage on.
    step_fp32_grad_copy_from_zero: int | None = None
    # DeepSpeed's contiguous-gradient reduce buckets (`contiguous_gradients`, which our configs and ms-swift's set),
    # allocated for the whole run in the gradients' dtype, reduce_bucket_size elements each (DS_REDUCE_BUCKET_HIDDEN2):
    # ZeRO-1/2 two with overlap_comm (stage_1_and_2.py:2497-2513, `buf_0` and the double buffer `buf_1`), ZeRO-3
    # one per communication dtype (stage3.py:731-735). Counts at (ZeRO-1/2, ZeRO-3).
    reduce_buckets_zero12_zero3: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        for f in ("master_clone_from_zero", "reduce_every_microbatch_from_zero", "reference_sharded_from_zero",
                  "step_fp32_grad_copy_from_zero"):
            v = getattr(self, f)
            if v is not None and v not in (0, 1, 2, 3):
                raise PerfPredictError(f"runtime {self.name}: {f} must be a ZeRO stage 0-3 or None, got {v!r}")


RUNTIMES: dict[str, Runtime] = {r.name: r for r in [
    Runtime("megatron", grad_reduce_fp32=True, grads_fp32=True, overlaps_grad_reduce=False, fused_vocab_ce=True),
    Runtime("nanotron", grad_reduce_fp32=True, grads_fp32=True, fused_vocab_ce=True,
            vocab_ce_logit_bytes=NANOTRON_CE_LOGIT_BYTES, cost_balanced_stages=True),
    Runtime("deepspeed", master_clone_from_zero=1, reduce_every_microbatch_from_zero=2, reference_sharded_from_zero=3,
            zero3_reuse_distance=True, own_grad_buffers=True, engine_step_host_work=True, zero3_prefetch_buckets=True,
            offload_16bit_host_buffer=True, step_fp32_grad_copy_from_zero=1,
            reduce_buckets_zero12_zero3=(2, 1)),
    Runtime("fsdp", weights_fp32=True, grads_fp32=True, separate_master=False, reduce_every_microbatch_from_zero=2,
            zero2_keeps_unsharded=True, ddp_buckets_at_zero0=True, reference_sharded_from_zero=0,
            frees_grads_each_step=True, accelerate_activation_checkpointing=True,
            accelerate_config_file="accelerate_fsdp.yaml", offload_moves_params=True,
            no_sync_keeps_unsharded_grads=True, trainer_torch_adamw=True),
    Runtime("ddp", params_as_loaded=True, separate_master=False, ddp_buckets_at_zero0=True, frees_grads_each_step=True,
            trainer_torch_adamw=True),
]}


@dataclass(frozen=True)
class Optimizer:
    """An optimizer implementation a workload names (Workload.optimizer, transformers' `TrainingArguments.optim`
    values): what it keeps per parameter of the shard it steps and what its step allocates. The memory rules
    (features.memory.state_bytes_per_param, .optimizer_step) read this table, never the names.

    "" is the runtime's own, what every plan was predicted with before this field: torch AdamW with foreach under
    transformers' Trainer on a GPU (Runtime.trainer_torch_adamw), DeepSpeed's own AdamW in the configs we emit,
    Megatron's / nanotron's distributed Adam; moments in fp32 (bf16 for a bf16-loaded model on plain torch)."""

    name: str
    # Bytes per parameter of each of Adam's two moments; None: the parameters' dtype rule above.
    moment_bytes: float | None = None
    # The step allocates foreach's `exp_avg_sq_sqrt`, one more second moment of the unit it steps (torch/optim/adam.py
    # `_multi_tensor_adam`); None: the runtime's default (Runtime.trainer_torch_adamw). On GPUs only: torch never
    # picks foreach for CPU tensors (torch/optim/optimizer.py `_default_to_fused_or_foreach`).
    foreach_step: bool | None = None
    # The moments live in CUDA managed memory outside torch's caching allocator, which the driver pages to host memory
    # when the device fills: they neither count in torch.cuda.max_memory_allocated nor cause an OOM.
    paged: bool = False
    # It can step on the host, as optimizer offload does (DeepSpeed's DeepSpeedCPUAdam, FSDP CPUOffload's torch step on
    # the host parameters); bitsandbytes' update kernels take CUDA tensors only, so its plans never offload.
    host_step: bool = True

    def __post_init__(self) -> None:
        if self.moment_bytes is not None and not 0.0 <= self.moment_bytes <= 8.0:
            raise PerfPredictError(f"optimizer {self.name!r}: moment_bytes must be in 0..8, got {self.moment_bytes!r}")


# bitsandbytes' 8-bit blockwise Adam (bitsandbytes/optim/optimizer.py at 06029dd6, Optimizer2State.init_state): each
# moment is a uint8 tensor of the parameter's shape (`get_state_buffer(p, dtype=torch.uint8)`, state1 and state2)
# plus one fp32 absmax per block of 2048 elements (`blocks = n // 2048`, absmax1 and absmax2); the two 256-entry
# quantile maps (qmap1 "dynamic", qmap2 "udynamic") are shared by every parameter (`self.name2qmap`): a few KB in all.
# Tensors under min_8bit_size (4096 elements: norms, biases) keep fp32 moments, a negligible share of an LLM's.
# The update is one kernel per parameter (F.optimizer_update_8bit_blockwise), in place: no step temporary.
# Paged variants (`is_paged`) allocate the moments of every tensor of 1e5 elements or more with F.get_paged
# (`get_state_buffer`: CUDA managed memory, outside torch's allocator).
BNB_8BIT_BLOCK = 2048
BNB_8BIT_MOMENT_BYTES = 1.0 + 4.0 / BNB_8BIT_BLOCK
OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in [
    Optimizer(""),
    Optimizer("adamw_torch", foreach_step=True),
    # torch AdamW(fused=True): one fused kernel per parameter group, no foreach temporaries (torch/optim/adam.py
    # `_fused_adam`); transformers' default `optim` from 4.54 with torch >= 2.8 (huggingface/transformers#37358).
    Optimizer("adamw_torch_fused", foreach_step=False),
    # transformers' `adamw_bnb_8bit` and `adamw_8bit` both build bnb.optim.AdamW with optim_bits 8
    # (transformers trainer.py get_optimizer_cls_and_kwargs); `paged_adamw_8bit` the paged variant.
    Optimizer("adamw_bnb_8bit", moment_bytes=BNB_8BIT_MOMENT_BYTES, foreach_step=False, host_step=False),
    Optimizer("adamw_8bit", moment_bytes=BNB_8BIT_MOMENT_BYTES, foreach_step=False, host_step=False),
    Optimizer("paged_adamw_8bit", moment_bytes=BNB_8BIT_MOMENT_BYTES, foreach_step=False, paged=True,
              host_step=False),
]}


def runtimes_where(rule) -> list[str]:
    """Names of the runtimes for which rule(Runtime) is true, in table order (for d_runtime.is_in(...))."""
    return [n for n, r in RUNTIMES.items() if rule(r)]


def runtime_of(framework: str) -> Runtime:
    """The Runtime row a framework's plans run under."""
    return RUNTIMES[RUNTIME[capability(framework).name]]


# Framework -> its family (learned corrections' domains and intervals).
FAMILY = {n: (c.family or n) for n, c in CAPABILITIES.items()}
TRL_FRAMEWORKS = tuple(n for n, c in CAPABILITIES.items() if c.family == "trl")


# The ZeRO settings every DeepSpeed config we write carries (`rank --emit deepspeed`, `collect trl --backends
# deepspeed`): "auto" where transformers fills them from the model (integrations/deepspeed.py: reduce bucket hidden^2,
# ZeRO-3 prefetch 0.9 hidden^2, persistence threshold 10 hidden), the 1e9 stage-3 limits of HF's examples. The
# memory model reads the reuse distance (features.trl: what ZeRO-3 keeps gathered between forward and backward).
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
# transformers' "auto" stage3_prefetch_bucket_size: 0.9 x hidden^2 elements (integrations/deepspeed.py); DeepSpeed's
# own default is 5e7 (deepspeed/runtime/zero/config.py:208). The coordinator prefetches whole parameters until the
# bucket is reached (partitioned_param_coordinator.py:380-406), at most stage3_max_live_parameters (1e9, :381) alive.
DS_PREFETCH_BUCKET_HIDDEN2 = 0.9
# transformers' "auto" reduce_bucket_size: hidden^2 elements (DeepSpeed's own default 5e8, config.py:109): ZeRO 1-3
# reduce gradients in buckets of that many elements (stage3.py:1258-1270 flushes the bucket when the next gradient
# would overflow it).
DS_REDUCE_BUCKET_HIDDEN2 = 1.0
# ZeRO-3 steps the optimizer one sub-group of about this many parameters at a time (deepspeed/runtime/zero/config.py:175
# `sub_group_size` default 1e9; our configs, HF's examples and ms-swift's swift/llm/ds_config/zero3.json set 1e9).
DS_SUB_GROUP_SIZE = 1_000_000_000


def zero_optimization(stage: int, *, optimizer_offload: bool = False, param_offload: bool = False) -> dict:
    """DeepSpeed's `zero_optimization` block for a ZeRO stage (0-3), with optimizer / parameter offload to host."""
    zero: dict = {"stage": stage}
    if stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"})
    if optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if param_offload:  # ZeRO-Infinity: stage 3 parameters in host memory too
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero.update({"stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                     "stage3_max_live_parameters": 1_000_000_000,
                     "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE, "sub_group_size": DS_SUB_GROUP_SIZE})
    return zero


def expand_backends(names) -> tuple[str, ...]:
    """A framework with backends stands for itself and its backends (`trl` -> trl, trl+deepspeed, trl+fsdp)."""
    out: list[str] = []
    for n in names:
        for m in (n, *(CAPABILITIES[n].backends if n in CAPABILITIES else ())):
            if m not in out:
                out.append(m)
    return tuple(out)


def capability(name: str) -> Capability:
    if name not in CAPABILITIES:
        raise PerfPredictError(f"unknown framework {name!r}; accepted: {', '.join(RANKABLE)}")
    return CAPABILITIES[name]


def stage_layers(cap: Capability, layers: int, pp: int) -> tuple[int, ...] | None:
    """The framework's default layers per pipeline stage, or None when it cannot split `layers` over `pp`.

    EVEN: layers/pp each. BALANCED (nanotron, torchtitan): sizes differ by at most one; the extra layers go to the
    middle stages, since the first also runs the embedding and the last the head and loss. FIRST_LAST (Megatron):
    even when pp divides layers; otherwise the most balanced first/last counts whose remainder splits evenly over
    the middle stages, the lighter counts on the first and last stage."""
    if pp <= 0 or layers < pp:
        return None
    if pp == 1:
        return (layers,)
    if layers % pp == 0:
        return (layers // pp,) * pp
    if cap.stage_split == BALANCED:
        base, extra = divmod(layers, pp)
        order = sorted(range(pp), key=lambda i: (min(i, pp - 1 - i) == 0, -min(i, pp - 1 - i), i))
        big = set(order[:extra])
        return tuple(base + (1 if i in big else 0) for i in range(pp))
    if cap.stage_split == FIRST_LAST and pp > 2:
        best = None
        for mid in range(1, layers // (pp - 2) + 1):
            rest = layers - mid * (pp - 2)
            for first in range(1, rest):
                last = rest - first
                if first > mid or last > mid:
                    continue
                key = (mid, abs(first - last), last)
                if best is None or key < best[0]:
                    best = (key, (first,) + (mid,) * (pp - 2) + (last,))
        return best[1] if best else None
    return None


def _stage_problem(cap: Capability, plan: Plan, layers: int) -> str | None:
    split = plan.stage_layers
    if not split:
        return None if layers % plan.pp == 0 else "uneven"
    if len(split) != plan.pp:
        return f"stage_layers lists {len(split)} stages but pp is {plan.pp}"
    if sum(split) != layers:
        return f"stage_layers sum to {sum(split)} but the model has {layers} layers"
    if len(set(split)) == 1:
        return None
    if cap.stage_split == EVEN:
        return f"{cap.display} splits layers evenly over pipeline stages (stage_layers {list(split)})"
    if cap.stage_split == FIRST_LAST and len(set(split[1:-1])) > 1:
        return (f"{cap.display} sets only the first and last stage's layer counts "
                "(--decoder-first/last-pipeline-num-layers); the middle stages must be equal")
    return None


@dataclass(frozen=True)
class Refusal:
    """Why a framework cannot run a plan: the clause messages show (why_not) and the short form the plan generator
    counts its rejections by (one tally line per rule, without the plan's numbers)."""

    reason: str
    tally: str


def pairing_refusal(framework: str, objective: str, optimizer: str = "") -> Refusal | None:
    """None when the framework can run the workload at all, whatever the plan: one of its trainers runs `objective`
    and builds the workload's `optimizer`; else why not. The plan generator asks this once per framework;
    trainer_refusal asks it first."""
    cap = capability(framework)
    if optimizer and not cap.hf_trainer:
        # OPTIMIZERS' names are transformers' `TrainingArguments.optim` values, which only the Trainer loop reads
        # (trainer.py get_optimizer_cls_and_kwargs); Megatron (megatron/core/optimizer/__init__.py
        # get_megatron_optimizer: apex/TE FusedAdam) and nanotron (its config's `optimizer_factory`) build their own.
        hf = ", ".join(n for n, c in CAPABILITIES.items() if c.hf_trainer and c.rankable)
        return Refusal(f"{cap.display} builds its own optimizer; transformers' optim {optimizer!r} runs on {hf} only",
                       f"{cap.name}: no transformers optim")
    if cap.trainers and cap.trainer_for(objective) is None:
        runs = "; ".join(f"{x.name}: {', '.join(x.objectives)}" for x in cap.trainers)
        return Refusal(f"no {cap.display} trainer runs {objective} (its trainers: {runs})",
                       f"{cap.name}: no trainer runs {objective}")
    return None


def trainer_refusal(plan: Plan, objective: str, *, framework: str | None = None,
                    optimizer: str = "") -> Refusal | None:
    """None when one of the framework's trainers runs `objective` on this plan, else why not: pairing_refusal, or
    the trainer that runs the objective cannot run the plan's ZeRO stage, offload or recompute."""
    cap = capability(framework or plan.framework)
    r = pairing_refusal(cap.name, objective, optimizer)
    if r is not None or not cap.trainers:  # no trainer list: runs every objective itself (TRL and its runtimes)
        return r
    t = cap.trainer_for(objective)
    if t.zero_stages is not None and plan.zero not in t.zero_stages:
        return Refusal(f"{t.name} runs zero {', '.join(map(str, t.zero_stages))}, not zero {plan.zero}",
                       f"{cap.name}: its {objective} trainer runs no zero {plan.zero}")
    if plan.optimizer_offload and not t.optimizer_offload:
        return Refusal(f"{t.name} has no optimizer offload", f"{cap.name}: its {objective} trainer has no offload")
    if t.recompute is not None and plan.recompute not in t.recompute:
        return Refusal(t.recompute_why or f"{t.name} has no {plan.recompute} recompute",
                       f"{cap.name}: its {objective} trainer has no {plan.recompute} recompute")
    return None


def reference_handling(framework: str, objective: str, reference: str) -> str:
    """How the trainer that runs `objective` on `framework` holds a reference the workload asks for live: its own
    way (NeMo-Aligner and NeMo-RL swap the weights in from host memory), else as asked."""
    t = capability(framework).trainer_for(objective) if framework in CAPABILITIES else None
    if reference == "live" and t is not None and t.reference:
        return t.reference
    return reference


def reference_swap_copies(framework: str, objective: str) -> int:
    """Copies of the rank's resident weights the trainer moves over PCIe per step to score with the reference
    (0: it does not swap; an `offloaded` reference the user asked for then streams the weights once)."""
    t = capability(framework).trainer_for(objective) if framework in CAPABILITIES else None
    return t.reference_swap_copies if t is not None and capability(framework).trainers else 0


def refusal(plan: Plan, model: ModelSpec | None = None, *, framework: str | None = None,
            objective: str | None = None, optimizer: str = "") -> Refusal | None:
    """None when the framework (default: the plan's) can run the plan, else the Refusal of the first rule it breaks.

    The one legality rule: why_not, check and the plan generator (features.plans) all read it; with an objective
    it also asks the framework's trainers (trainer_refusal). Checks the table only; shape divisibility (tp | heads,
    cp | seq_len) stays with Scenario."""
    r = _table_refusal(plan, model, framework=framework)
    if r is None and objective is not None:
        return trainer_refusal(plan, objective, framework=framework, optimizer=optimizer)
    return r


def _table_refusal(plan: Plan, model: ModelSpec | None = None, *, framework: str | None = None) -> Refusal | None:
    cap = capability(framework or plan.framework)
    who, name = cap.display, cap.name

    def no(reason: str, tally: str) -> Refusal:
        return Refusal(reason, tally)

    if plan.tp > 1 and not cap.tp:
        return no(f"{who} has no tensor parallelism (tp={plan.tp})", f"{name} has no tensor parallelism")
    if plan.pp > 1 and not cap.pp:
        return no(f"{who} has no pipeline parallelism (pp={plan.pp})", f"{name} has no pipeline parallelism")
    if plan.cp > 1 and not cap.cp:
        return no(f"{who} has no context parallelism (cp={plan.cp})", f"{name} has no context parallelism")
    if plan.ep > 1 and not cap.ep:
        return no(f"{who} has no expert parallelism (ep={plan.ep})", f"{name} has no expert parallelism")
    if plan.sequence_parallel and not cap.sequence_parallel:
        return no(f"{who} has no sequence parallelism", f"{name} has no sequence parallelism")
    # fused_head is Liger's chunked head and loss on a Hugging Face model (features.memory.activations): Megatron and
    # nanotron have their own vocab-parallel fused cross entropy (already their head), and the TRL family's head is
    # modelled by its own path (features.trl), which has no Liger variant yet.
    if plan.fused_head and (runtime_of(name).fused_vocab_ce or cap.family == "trl"):
        why = ("its vocab-parallel fused cross entropy is its head already" if runtime_of(name).fused_vocab_ce
               else "its head is modelled by the TRL path, which has no Liger variant yet")
        return no(f"{who} takes no fused_head (Liger's chunked head for Hugging Face models): {why}",
                  f"{name}: no fused_head")
    if plan.pp > 1 and cap.pp_alone and (plan.tp > 1 or plan.dp > 1):
        return no(f"{who} builds pipeline parallelism alone (tp = dp = 1)",
                  f"{name} builds pipeline parallelism alone (tp = dp = 1)")
    if plan.recompute not in cap.recompute:
        if plan.recompute == "selective":
            sel = ", ".join(n for n, c in CAPABILITIES.items() if "selective" in c.recompute and c.rankable)
            return no(f"selective recompute runs on {sel} only; HF gradient checkpointing recomputes whole layers "
                      "(use recompute full)", "selective recompute: not with HF gradient checkpointing")
        return no(f"{who} has no {plan.recompute} recompute; accepted: {', '.join(cap.recompute)}",
                  f"{name} has no {plan.recompute} recompute")
    if plan.pp > 1 and plan.schedule not in cap.schedules:
        tally = f"{name} has no {plan.schedule} schedule"
        if plan.schedule == "gpipe":
            return no(f"{who} has no GPipe schedule (use {' or '.join(cap.schedules)})", tally)
        return no(f"{who} has no {plan.schedule} schedule; accepted: {', '.join(cap.schedules)}", tally)
    if (plan.pp > 1 and plan.schedule == "interleaved" and cap.interleaved_needs_ga_multiple
            and plan.grad_accum % plan.pp):
        return no(f"{who}'s interleaved schedule needs the micro-batches per step (grad_accum {plan.grad_accum}) to "
                  f"be a multiple of pp ({plan.pp})", "interleaved: micro-batches not a multiple of pp")
    zeros = cap.zero_choices(tp=plan.tp, pp=plan.pp, dp=plan.dp, offload=False)
    if plan.zero not in zeros:
        tally = f"{name} has no ZeRO stage for this layout" if not zeros else f"{name} runs no zero {plan.zero} here"
        where = ("one data-parallel replica" if plan.dp == 1 else "pipeline parallelism" if plan.pp > 1 and
                 plan.zero not in cap.zero_with_pp else "tp x dp" if plan.tp > 1 and plan.zero not in
                 cap.zero_with_tp_dp else "data parallelism")
        if cap.zero_refusal:
            return no(f"{cap.zero_refusal}, got {plan.zero}", tally)
        return no(f"{who} runs zero {', '.join(map(str, zeros)) or 'none'} with {where}, not zero {plan.zero}", tally)
    if plan.optimizer_offload and plan.zero not in cap.optimizer_offload_zero:
        tally = f"{name} offloads no optimizer at zero {plan.zero}"
        if not cap.optimizer_offload_zero:
            return no(f"{who} has no optimizer offload", tally)
        if cap.offload_zero0_refusal and plan.zero == 0:
            return no(f"{cap.offload_zero0_refusal} (plan has zero 0)", tally)
        return no(f"{who} offloads the optimizer only with zero {', '.join(map(str, cap.optimizer_offload_zero))} "
                  f"(plan has zero {plan.zero})", tally)
    if plan.param_offload:
        if plan.zero not in cap.param_offload_zero:
            return no(f"{who} has no parameter offload" if not cap.param_offload_zero else
                      f"{who} offloads parameters only with zero {', '.join(map(str, cap.param_offload_zero))}",
                      f"{name} offloads no parameters at zero {plan.zero}")
        if not plan.optimizer_offload:
            return no("parameter offload needs optimizer offload too (ZeRO-Infinity offloads both)",
                      "parameter offload without optimizer offload")
    if model is not None:
        return _model_refusal(cap, plan, model)
    return None


def _model_refusal(cap: Capability, plan: Plan, model: ModelSpec) -> Refusal | None:
    """The rules that need the model's shape: experts, layers over pipeline stages."""
    who, name = cap.display, cap.name
    if plan.ep > 1:
        if not model.is_moe:
            return Refusal(f"ep={plan.ep} needs a mixture-of-experts model ({model.name} is dense)",
                           "ep on a dense model")
        if model.experts % plan.ep:
            return Refusal(f"ep ({plan.ep}) must divide the model's {model.experts} experts",
                           "ep does not divide the experts")
        if plan.dp % plan.ep:
            return Refusal(f"ep ({plan.ep}) must divide dp ({plan.dp}): expert groups are carved out of data "
                           "parallelism", "ep does not divide dp")
    if model.is_moe and plan.sequence_parallel and not cap.moe_sequence_parallel:
        return Refusal(f"{who} does not build MoE with sequence parallel", f"{name}: no MoE with sequence parallel")
    if plan.pp > model.layers:
        return Refusal(f"pp ({plan.pp}) exceeds the model's {model.layers} layers", "pp exceeds the layer count")
    if plan.pp > 1:
        problem = _stage_problem(cap, plan, model.layers)
        if problem == "uneven":
            if cap.stage_split == EVEN:
                return Refusal(f"pp ({plan.pp}) does not divide the model's {model.layers} layers and {who} splits "
                               "evenly", f"{name}: pp does not divide layers (it splits evenly)")
            split = stage_layers(cap, model.layers, plan.pp)
            if split is None:
                return Refusal(f"{who} cannot split {model.layers} layers over {plan.pp} stages",
                               f"{name}: cannot split the layers over pp stages")
            if cap.stage_split == FIRST_LAST:
                return Refusal(f"pp ({plan.pp}) does not divide {model.layers} layers: {who} needs the split given "
                               f"(--decoder-first/last-pipeline-num-layers), e.g. stage_layers {list(split)}",
                               f"{name}: an uneven split must be given (stage_layers)")
        elif problem:
            return Refusal(problem, f"{name}: stage_layers it cannot run")
        if plan.schedule == "interleaved" and plan.virtual_stages > 1:
            split = plan.stage_layers or (model.layers // plan.pp,) * plan.pp
            if any(n % plan.virtual_stages for n in split):
                return Refusal(f"interleaved schedule needs every stage's layers divisible by the virtual stages "
                               f"({plan.virtual_stages}); stages hold {sorted(set(split))}",
                               "interleaved: a stage's layers not divisible by the virtual stages")
    return None


def why_not(plan: Plan, model: ModelSpec | None = None, *, framework: str | None = None,
            objective: str | None = None, optimizer: str = "") -> str | None:
    """None when the framework (default: the plan's) can run the plan (for `objective` and the workload's
    `optimizer`, when given), else one clause saying why not."""
    r = refusal(plan, model, framework=framework, objective=objective, optimizer=optimizer)
    return r.reason if r else None


def check(plan: Plan, model: ModelSpec | None = None, *, objective: str | None = None) -> None:
    """Raise PerfPredictError naming why the plan's framework cannot run it."""
    reason = why_not(plan, model, objective=objective)
    if reason:
        raise PerfPredictError(f"{plan.framework} cannot run {plan.label()}: {reason}")


def table_rows() -> list[dict[str, object]]:
    """The table as rows (README / `perfpredict frameworks`)."""
    out = []
    for c in CAPABILITIES.values():
        out.append({"framework": c.name, "tp": c.tp, "sp": c.sequence_parallel, "pp": c.pp,
                    "schedules": "/".join(c.schedules) if c.pp else "-", "stage split": c.stage_split if c.pp else "-",
                    "cp": c.cp, "ep": c.ep, "zero (dp>1)": "/".join(map(str, c.zero_stages)),
                    "zero (dp=1)": "/".join(map(str, c.zero_single_replica)),
                    "optimizer offload (zero)": "/".join(map(str, c.optimizer_offload_zero)) or "-",
                    "param offload (zero)": "/".join(map(str, c.param_offload_zero)) or "-",
                    "recompute": "/".join(c.recompute), "ranked": c.rankable, "emit": c.emit_target or "-",
                    "objectives": "/".join(o for t in c.trainers for o in t.objectives) or "all"})
    return out
