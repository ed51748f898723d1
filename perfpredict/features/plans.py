"""The legal plan space: small generators that yield only legal plans and count what they reject, and why.

Rules follow what each framework really supports:
- megatron: TP (+SP), PP (1F1B or interleaved), CP, distributed optimizer = ZeRO-1. No GPipe schedule.
- nanotron: TP (+SP), PP (1F1B, or all-forward-all-backward = GPipe), ZeRO-1. No CP.
- deepspeed (as TRL/accelerate drive it): ZeRO 0-3 with optional CPU optimizer offload; no tensor parallelism;
  its pipeline engine only with ZeRO <= 1.
- fsdp (FSDP2): FULL_SHARD (3) or SHARD_GRAD_OP (2), optionally 2-D with TP; no pipeline, no CP here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from perfpredict.core.errors import require
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

    frameworks: tuple[str, ...] = FRAMEWORKS
    recompute: tuple[str, ...] = RECOMPUTE
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_cp: int = 8
    cross_node_tp: bool = False
    offload: bool = True
    interleaved_stages: int = 2

    def __post_init__(self) -> None:
        for f in self.frameworks:
            require(f in FRAMEWORKS, f"unknown framework {f!r}; accepted: {', '.join(FRAMEWORKS)}")
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
    """(tp, pp, cp, dp) that tile the cluster."""
    n = cluster.gpus
    for tp in divisors(n):
        if model.heads % tp or model.kv_heads % tp:
            rej.add("tp does not divide heads and kv_heads")
            continue
        if tp > cluster.gpus_per_node and not space.cross_node_tp:
            rej.add("tp spans nodes")
            continue
        for pp in divisors(n // tp):
            if model.layers % pp:
                rej.add("pp does not divide layers")
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


def _framework_ok(fw: str, tp: int, pp: int, cp: int, dp: int, rej: Rejections) -> bool:
    reason = None
    if fw == "deepspeed" and tp > 1:
        reason = "deepspeed has no tensor parallelism"
    elif fw in ("deepspeed", "fsdp", "nanotron") and cp > 1:
        reason = f"{fw} has no context parallelism here"
    elif fw == "fsdp" and pp > 1:
        reason = "fsdp has no pipeline parallelism"
    elif fw == "fsdp" and dp == 1:
        reason = "fsdp over dp=1 shards nothing"
    if reason:
        rej.add(reason)
    return reason is None


def _zero_stages(fw: str, pp: int, dp: int) -> tuple[int, ...]:
    if fw == "fsdp":
        return (2, 3)
    if fw in ("megatron", "nanotron"):
        return (0, 1) if dp > 1 else (0,)
    if pp > 1:
        return (0, 1) if dp > 1 else (0,)
    return (0, 1, 2, 3) if dp > 1 else (0,)


def _schedules(fw: str, model: ModelSpec, pp: int, grad_accum: int, space: PlanSpace,
               rej: Rejections) -> Iterator[tuple[str, int]]:
    if pp == 1:
        yield "1f1b", 1
        return
    yield "1f1b", 1
    if fw == "nanotron":
        yield "gpipe", 1
    if fw == "megatron":
        v = space.interleaved_stages
        if model.layers % (pp * v):
            rej.add("interleaved: layers not divisible by pp*virtual stages")
        elif grad_accum % pp:
            rej.add("interleaved: micro-batches not a multiple of pp")
        else:
            yield "interleaved", v


def enumerate_plans(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                    rejections: Rejections | None = None) -> Iterator[Plan]:
    space = space or PlanSpace()
    rej = rejections if rejections is not None else Rejections()
    for tp, pp, cp, dp in _layouts(model, cluster, workload, space, rej):
        per_replica = workload.global_batch // dp
        for fw in space.frameworks:
            if not _framework_ok(fw, tp, pp, cp, dp, rej):
                continue
            for mb in space.micro_batches:
                if per_replica % mb:
                    rej.add("micro-batch does not divide the per-replica batch")
                    continue
                ga = per_replica // mb
                for zero in _zero_stages(fw, pp, dp):
                    for schedule, v in _schedules(fw, model, pp, ga, space, rej):
                        for rc in space.recompute:
                            if rc == "selective" and fw not in ("megatron", "nanotron"):
                                rej.add("selective recompute is Megatron/nanotron only")
                                continue
                            for sp in ((False, True) if tp > 1 else (False,)):
                                offloads = (False, True) if space.offload and (
                                    (fw == "deepspeed" and zero >= 1) or (fw == "fsdp" and zero == 3)) else (False,)
                                for off in offloads:
                                    yield Plan(tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp, zero=zero,
                                               recompute=rc, micro_batch=mb, grad_accum=ga, optimizer_offload=off,
                                               framework=fw, schedule=schedule, virtual_stages=v)
