"""The legal plan space: small generators that yield only legal plans and count what they reject, and why.

What each framework can run comes from the one capability table, perfpredict.core.frameworks (TP/SP, PP schedules
and how layers split over stages, CP, EP, ZeRO stages, offload and on which GPU counts, recompute); emit and collect
read the same table, so every plan yielded here can be emitted for its framework. Beyond legality the generator
skips only redundant plans (ZeRO over one replica without offload), counted with the reason too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from perfpredict.core.errors import require
from perfpredict.core.frameworks import DEFAULT_RANKED, Capability, capability, expand_backends, stage_layers
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import FRAMEWORKS, RECOMPUTE, Plan
from perfpredict.core.workload import Workload


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True)
class PlanSpace:
    """Which knobs to search. Defaults cover what a team would try."""

    frameworks: tuple[str, ...] = DEFAULT_RANKED  # a framework with backends (trl) brings them along
    recompute: tuple[str, ...] = RECOMPUTE
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_cp: int = 8
    cross_node_tp: bool = False
    offload: bool = True
    interleaved_stages: int = 2

    def __post_init__(self) -> None:
        for f in self.frameworks:
            require(f in FRAMEWORKS, f"unknown framework {f!r}; accepted: {', '.join(FRAMEWORKS)}")
        object.__setattr__(self, "frameworks", expand_backends(tuple(self.frameworks)))
        for r in self.recompute:
            require(r in RECOMPUTE, f"unknown recompute {r!r}; accepted: {', '.join(RECOMPUTE)}")
        require(all(isinstance(m, int) and m > 0 for m in self.micro_batches), "micro_batches must be positive integers")
        require(self.max_cp >= 1, "max_cp must be >= 1")


@dataclass
class Rejections:
    counts: Counter = field(default_factory=Counter)

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _layouts(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace,
             rej: Rejections) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) that tile the cluster and fit the model's shape (framework rules come later)."""
    n = cluster.gpus
    for tp in divisors(n):
        if model.heads % tp or model.kv_heads % tp:
            rej.add("tp does not divide heads and kv_heads")
            continue
        if tp > cluster.gpus_per_node and not space.cross_node_tp:
            rej.add("tp spans nodes")
            continue
        for pp in divisors(n // tp):
            if pp > model.layers:
                rej.add("pp exceeds the layer count")
                continue
            for cp in divisors(n // (tp * pp)):
                if cp > space.max_cp:
                    rej.add("cp above the searched maximum")
                    continue
                if cp > 1 and workload.seq_len % (2 * cp):
                    rej.add("cp does not divide seq_len into 2*cp chunks")
                    continue
                dp = n // (tp * pp * cp)
                if workload.global_batch % dp:
                    rej.add("global batch not divisible by dp")
                    continue
                yield tp, pp, cp, dp


def _framework_ok(cap: Capability, tp: int, pp: int, cp: int, dp: int, rej: Rejections) -> bool:
    """Layout-level rules of the capability table."""
    reason = None
    if tp > 1 and not cap.tp:
        reason = f"{cap.name} has no tensor parallelism"
    elif pp > 1 and not cap.pp:
        reason = f"{cap.name} has no pipeline parallelism"
    elif cp > 1 and not cap.cp:
        reason = f"{cap.name} has no context parallelism"
    elif pp > 1 and cap.pp_alone and (tp > 1 or dp > 1):
        reason = f"{cap.name} builds pipeline parallelism alone (tp = dp = 1)"
    elif not cap.zero_choices(tp=tp, pp=pp, dp=dp, offload=False):
        reason = f"{cap.name} has no ZeRO stage for this layout"
    if reason:
        rej.add(reason)
    return reason is None


def _stage_choices(cap: Capability, model: ModelSpec, pp: int, rej: Rejections) -> tuple[int, ...] | None:
    if pp == 1:
        return ()
    split = stage_layers(cap, model.layers, pp)
    if split is None:
        rej.add(f"{cap.name}: cannot split the layers over pp stages" if cap.stage_split != "even"
                else f"{cap.name}: pp does not divide layers (it splits evenly)")
        return None
    return () if len(set(split)) == 1 else split


def _schedules(cap: Capability, stages: tuple[int, ...], model: ModelSpec, pp: int, grad_accum: int,
               space: PlanSpace, rej: Rejections) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1
        return
    for sched in cap.schedules:
        if sched != "interleaved":
            yield sched, 1
            continue
        v = space.interleaved_stages
        counts = stages or (model.layers // pp,)
        if any(n % v for n in counts):
            rej.add("interleaved: a stage's layers not divisible by the virtual stages")
        elif cap.interleaved_needs_ga_multiple and grad_accum % pp:
            rej.add("interleaved: micro-batches not a multiple of pp")
        else:
            yield "interleaved", v


def _ep_choices(cap: Capability, model: ModelSpec, dp: int, rej: Rejections) -> tuple[int, ...]:
    if not model.is_moe:
        return (1,)
    eps = [e for e in divisors(dp) if e > 1 and model.experts % e == 0]
    if eps and not cap.ep:
        rej.add(f"{cap.name} has no expert parallelism", len(eps))
        return (1,)
    return (1, *eps)


def enumerate_plans(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                    rejections: Rejections | None = None) -> Iterator[Plan]:
    """Every plan the capability table (core.frameworks) says its framework can run on this cluster."""
    space = space or PlanSpace()
    rej = rejections if rejections is not None else Rejections()
    caps = [capability(f) for f in space.frameworks]
    for tp, pp, cp, dp in _layouts(model, cluster, workload, space, rej):
        per_replica = workload.global_batch // dp
        for cap in caps:
            if not _framework_ok(cap, tp, pp, cp, dp, rej):
                continue
            stages = _stage_choices(cap, model, pp, rej)
            if stages is None:
                continue
            sps = (False, True) if tp > 1 and cap.sequence_parallel else (False,)
            if tp > 1 and len(sps) == 2 and model.is_moe and not cap.moe_sequence_parallel:
                sps = (False,)
            if True in sps and workload.seq_len % tp:
                rej.add("sequence parallel: seq_len not divisible by tp")
                sps = (False,)
            eps = _ep_choices(cap, model, dp, rej)
            for mb in space.micro_batches:
                if per_replica % mb:
                    rej.add("micro-batch does not divide the per-replica batch")
                    continue
                ga = per_replica // mb
                for zero in cap.zero_choices(tp=tp, pp=pp, dp=dp, offload=False):
                    offload_ok = space.offload and zero in cap.optimizer_offload_zero
                    if dp == 1 and zero > 0 and not offload_ok:
                        rej.add("zero over one data-parallel replica shards nothing (only worth it to offload)")
                        continue
                    offloads: list[tuple[bool, bool]] = [(True, False)] if dp == 1 and zero > 0 else \
                        [(False, False)] + ([(True, False)] if offload_ok else [])
                    if offload_ok and zero in cap.param_offload_zero:
                        offloads.append((True, True))
                    for schedule, v in _schedules(cap, stages, model, pp, ga, space, rej):
                        for rc in space.recompute:
                            if rc not in cap.recompute:
                                rej.add("selective recompute is Megatron/nanotron only" if rc == "selective"
                                        else f"{cap.name} has no {rc} recompute")
                                continue
                            for sp in sps:
                                for ep in eps:
                                    for off, poff in offloads:
                                        yield Plan(tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp, zero=zero,
                                                   recompute=rc, micro_batch=mb, grad_accum=ga,
                                                   optimizer_offload=off, param_offload=poff, framework=cap.name,
                                                   schedule=schedule, virtual_stages=v, ep=ep, stage_layers=stages)
