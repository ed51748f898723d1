"""Apply a Plan to the collect model with PyTorch's own distributed APIs, and run one optimizer step.

What each plan becomes (the `framework` column of our rows is "fsdp": PyTorch-native throughout):
- dp > 1, zero 0: DistributedDataParallel. Gradient accumulation skips the all-reduce on all but the last
  micro-batch (no_sync), as HF accelerate does.
- dp > 1, zero 2 / 3: FSDP2 `fully_shard` on every block and then the root; zero 3 reshards parameters after
  forward, zero 2 keeps them unsharded until backward (`reshard_after_forward=False`). zero 1 has no FSDP
  counterpart: it runs as zero 2 (sharded grads too), which is what the row then measures. FSDP reduce-scatters the
  gradients on every micro-batch (its default, and DeepSpeed ZeRO-2/3's behaviour).
- tp > 1: torch.distributed.tensor.parallel: Colwise on wq/wk/wv and w1/w3 (every expert's too), Rowwise on wo
  and w2; embedding Rowwise with replicated token ids, head Colwise with replicated logits (the fp32 log-softmax
  then sees the full vocabulary, as TRL does). sequence_parallel adds SequenceParallel on the norms and
  PrepareModuleInput (Shard(1) -> Replicate) before attention and MLP. MoE with sequence parallel is not built.
- tp > 1 and dp > 1: a 2-D mesh ("dp", "tp"): TP on mesh["tp"], fully_shard on mesh["dp"]. DDP on top of TP needs
  a private API, so zero 0 is refused there.
- pp > 1 (tp = dp = 1): torch.distributed.pipelining, layers split evenly over stages, ScheduleGPipe or
  Schedule1F1B with grad_accum micro-batches; the reference runs through a second (forward-only) schedule; labels
  and reference log-probs are packed into the target; chosen/rejected are interleaved so a micro-batch holds whole
  pairs.
- recompute "selective" checkpoints the attention core (RoPE + SDPA, Megatron-LM's selective recompute); "full"
  checkpoints every block.
- The reference model is sharded exactly like the policy (what TRL gets from accelerator.prepare with FSDP), but
  with reshard_after_forward=True under FSDP: it has no backward, so keeping it gathered buys nothing. Under DDP
  it is a plain replica (accelerate does not wrap a model in eval mode).
- Tied embeddings are kept tied only without TP and PP (a tied weight cannot be split two ways / live on two
  stages); the row still carries the catalog's m_tied."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from perfpredict.collect.harness import objectives as O
from perfpredict.collect.harness.model import Decoder, build_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.frameworks import why_not
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def strategy(plan: Plan) -> str:
    """single | ddp | fsdp | tp | tp_fsdp | pp"""
    if plan.pp > 1:
        return "pp"
    if plan.tp > 1:
        return "tp_fsdp" if plan.dp > 1 else "tp"
    if plan.dp > 1:
        return "ddp" if plan.zero == 0 else "fsdp"
    return "single"


def check_plan(model: ModelSpec, workload: Workload, plan: Plan, world: int) -> None:
    """Raise PerfPredictError for a plan collect cannot run (one line, says why)."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise PerfPredictError(f"collect cannot run {plan.label()}: {msg}")

    need(plan.gpus == world, f"tp*pp*dp*cp = {plan.gpus} but world size is {world}")
    # What the harness builds at all (TP/SP, pipelining alone, ZeRO stages, no CP/offload/interleaving) is its row
    # of the capability table; the rest here is what its model code needs of the shapes.
    reason = why_not(plan, model, framework="harness")
    need(reason is None, reason or "")
    need(workload.reference in O.MEASURED_REFERENCES, f"reference {workload.reference!r} is not measured")
    need(workload.global_batch == plan.micro_batch * plan.grad_accum * plan.dp,
         f"global_batch ({workload.global_batch}) must be micro_batch*grad_accum*dp "
         f"({plan.micro_batch}*{plan.grad_accum}*{plan.dp})")
    if plan.tp > 1:
        for name, v in (("heads", model.heads), ("kv_heads", model.kv_heads), ("vocab", model.vocab)):
            need(v % plan.tp == 0, f"{name} ({v}) is not divisible by tp ({plan.tp})")
        ffn = model.expert_ffn if model.is_moe else model.ffn
        need(ffn % plan.tp == 0, f"ffn ({ffn}) is not divisible by tp ({plan.tp})")
    if plan.sequence_parallel:
        need(workload.seq_len % plan.tp == 0, "seq_len must be divisible by tp for sequence parallel")


@dataclass
class Runner:
    """One rank's view of a training setup. step() runs one optimizer step (all micro-batches) and returns this
    rank's loss contribution; global_loss() averages it over the data-parallel replicas."""

    strategy: str
    objective: O.Objective
    policy: nn.Module
    reference: nn.Module | None
    optimizer: torch.optim.Optimizer
    micro_batches: list[O.Batch]
    grad_accum: int
    autocast_dtype: torch.dtype | None
    device: torch.device
    dp_group: Any = None
    pp: dict[str, Any] = field(default_factory=dict)  # schedules and stage info for pipeline plans
    # DDP's flat gradient buckets (one copy of the gradients; gradient_as_bucket_view is off): allocated in C++ at
    # wrap time, invisible to the profiler and the gc scan, so recorded beside the memory label, not in it.
    ddp_bucket_bytes: int = 0

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._step_pp() if self.strategy == "pp" else self._step_micro()
        self.optimizer.step()
        return loss

    def _step_micro(self) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for j, mb in enumerate(self.micro_batches):
            last = j == self.grad_accum - 1
            sync = (self.policy.no_sync() if self.strategy == "ddp" and not last
                    else contextlib.nullcontext())
            with sync:
                with self._autocast():
                    loss = O.compute_loss(self.objective, self.policy, self.reference, mb) / self.grad_accum
                loss.backward()
            total += loss.detach().float()
        return total

    def _step_pp(self) -> torch.Tensor:
        p = self.pp
        batch = self.micro_batches[0]  # the whole per-step batch; the schedule cuts it into grad_accum chunks
        ref = batch.ref_logps
        with self._autocast():
            if self.objective.reference == "live":
                with torch.no_grad():
                    out = p["ref_schedule"].eval(batch.input_ids) if p["first"] else p["ref_schedule"].eval()
                if p["last"]:
                    ref, _ = O.sequence_logps(out, batch.labels)
            losses: list[torch.Tensor] = []
            target = O.pack_target(batch.labels, ref) if p["last"] else None
            args = (batch.input_ids,) if p["first"] else ()
            p["schedule"].step(*args, target=target, losses=losses, return_outputs=False)
        if p["last"]:
            return torch.stack([x.detach().float() for x in losses]).mean()
        return torch.zeros((), device=self.device)

    def global_loss(self, local: torch.Tensor) -> float:
        """The step's loss as one process would report it (mean over replicas; the last stage's under PP)."""
        t = local.detach().float().clone()
        if self.strategy == "pp":
            dist.all_reduce(t)  # only the last stage holds a non-zero value
        elif self.dp_group is not None:
            dist.all_reduce(t, group=self.dp_group)
            t /= dist.get_world_size(self.dp_group)
        return float(t)


def _tp_layer_plan(block: nn.Module, sp: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),
    }
    ff = block.feed_forward
    if hasattr(ff, "experts"):
        for i in range(len(ff.experts)):
            plan[f"feed_forward.experts.{i}.w1"] = ColwiseParallel()
            plan[f"feed_forward.experts.{i}.w2"] = RowwiseParallel()
            if ff.experts[i].w3 is not None:
                plan[f"feed_forward.experts.{i}.w3"] = ColwiseParallel()
    else:
        plan["feed_forward.w1"] = ColwiseParallel()
        plan["feed_forward.w2"] = RowwiseParallel(output_layouts=out)
        if ff.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
        plan["attention"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        if block.post_attention_norm is not None:
            # The residual stream stays a local sequence shard: hand the sandwich norms' output back as local.
            plan["post_attention_norm"] = SequenceParallel(use_local_output=True)
            plan["post_ffn_norm"] = SequenceParallel(use_local_output=True)
    return plan


def apply_tp(model: Decoder, mesh: Any, sp: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    top: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Replicate()),
    }
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    for block in model.layers.values():
        parallelize_module(block, mesh, _tp_layer_plan(block, sp))


def apply_fsdp(model: Decoder, mesh: Any, *, reshard: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def pipeline_stage(model: Decoder, stage: int, stages: int) -> Decoder:
    """Keep this stage's layers (even split, earlier stages take the remainder), the embedding on the first stage,
    norm and head on the last."""
    n = len(model.layers)
    sizes = [n // stages + (1 if s < n % stages else 0) for s in range(stages)]
    lo = sum(sizes[:stage])
    keep = {str(i) for i in range(lo, lo + sizes[stage])}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < stages - 1:
        model.norm = None
        model.output = None
    return model


def build_runner(spec: ModelSpec, workload: Workload, plan: Plan, *, rank: int, world: int,
                 device: torch.device, seed: int = 0, lr: float = 1e-3) -> Runner:
    check_plan(spec, workload, plan, world)
    strat = strategy(plan)
    obj = O.Objective(name=workload.objective, reference=workload.reference,
                      layout="interleave" if strat == "pp" else "concat")
    prec = workload.precision
    pure_low = prec != "fp32" and not workload.master_weights_fp32
    param_dtype = DTYPES[prec] if pure_low else torch.float32
    autocast_dtype = DTYPES[prec] if prec != "fp32" and not pure_low else None
    tie = plan.tp == 1 and plan.pp == 1

    def make(ref: bool) -> Decoder:
        m = build_model(spec, seed=seed, tie=tie, dtype=param_dtype, device=device,
                        recompute="none" if ref else plan.recompute)
        if ref:
            m.eval()
            m.requires_grad_(False)
        return m

    policy = make(False)
    reference = make(True) if obj.reference == "live" else None
    dp_group = None
    dp_rank, dp_size = 0, plan.dp
    ddp_bytes = 0
    pp_info: dict[str, Any] = {}
    dev_type = device.type

    if strat in ("ddp", "fsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(dev_type, (plan.dp,), mesh_dim_names=("dp",))
        dp_group, dp_rank = mesh.get_group("dp"), mesh.get_local_rank("dp")
        if strat == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ddp_bytes = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
            policy = DDP(policy, device_ids=[device.index] if dev_type == "cuda" else None)
        else:
            apply_fsdp(policy, mesh, reshard=plan.zero == 3)
            if reference is not None:
                apply_fsdp(reference, mesh, reshard=True)
    elif strat in ("tp", "tp_fsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(dev_type, (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
        apply_tp(policy, mesh["tp"], plan.sequence_parallel)
        if reference is not None:
            apply_tp(reference, mesh["tp"], plan.sequence_parallel)
        if strat == "tp_fsdp":
            dp_group, dp_rank = mesh.get_group("dp"), mesh.get_local_rank("dp")
            apply_fsdp(policy, mesh["dp"], reshard=plan.zero == 3)
            if reference is not None:
                apply_fsdp(reference, mesh["dp"], reshard=True)
    elif strat == "pp":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        sched_cls = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
        policy = pipeline_stage(policy, rank, plan.pp)
        stage = PipelineStage(policy, rank, plan.pp, device)
        loss_fn = (lambda out, target: O.packed_loss(obj, out, target))  # noqa: E731
        pp_info = {"first": rank == 0, "last": rank == plan.pp - 1,
                   "schedule": sched_cls(stage, n_microbatches=plan.grad_accum, loss_fn=loss_fn)}
        if reference is not None:
            reference = pipeline_stage(reference, rank, plan.pp)
            ref_stage = PipelineStage(reference, rank, plan.pp, device)
            pp_info["ref_schedule"] = ScheduleGPipe(ref_stage, n_microbatches=plan.grad_accum)

    # Data: one global pool of samples from a fixed seed; each data-parallel replica takes its contiguous share,
    # cut into grad_accum micro-batches. The global mean loss is then the same whatever the plan.
    per_rank = plan.micro_batch * plan.grad_accum
    src = O.make_samples(obj, samples=per_rank * dp_size, seq_len=workload.seq_len, vocab=spec.vocab, seed=seed)
    base = dp_rank * per_rank
    if strat == "pp":
        mbs = [O.select(obj, src, range(base, base + per_rank))]
    else:
        mbs = [O.select(obj, src, range(base + j * plan.micro_batch, base + (j + 1) * plan.micro_batch))
               for j in range(plan.grad_accum)]
    mbs = [O.to_device(b, device) for b in mbs]

    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    return Runner(strategy=strat, objective=obj, policy=policy, reference=reference, optimizer=opt,
                  micro_batches=mbs, grad_accum=plan.grad_accum, autocast_dtype=autocast_dtype, device=device,
                  dp_group=dp_group, pp=pp_info, ddp_bucket_bytes=ddp_bytes)
