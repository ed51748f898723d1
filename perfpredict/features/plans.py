"""The legal plan space: small generators that yield only legal plans and count what they reject, and why.

What each framework can run comes from the one capability table, perfpredict.core.frameworks (TP/SP, PP schedules
and how layers split over stages, CP, EP, ZeRO stages, offload and on which GPU counts, recompute); emit and collect
read the same table, so every plan yielded here can be emitted for its framework. Beyond legality the generator
skips only redundant plans (ZeRO over one replica without offload), counted with the reason too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import polars as pl

from perfpredict.core.errors import require
from perfpredict.core.frameworks import (
    DEFAULT_RANKED,
    OPTIMIZERS,
    Capability,
    capability,
    expand_backends,
    pairing_refusal,
    refusal,
    stage_layers,
    trainer_refusal,
)
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import FRAMEWORKS, RECOMPUTE, Plan, stage_layers_text
from perfpredict.core.scenario import PLAN_COLUMNS
from perfpredict.core.workload import Workload

ZERO_STAGES = (0, 1, 2, 3)


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


def replace(plan: Plan, **changes) -> Plan:
    """dataclasses.replace for the probe plans below, without its generic walk over the fields (the enumeration
    makes thousands): the same fields and the same __post_init__ (validation, normalisation)."""
    new = object.__new__(Plan)
    new.__dict__.update(plan.__dict__, **changes)
    new.__post_init__()
    return new


# Every framework-legality decision below asks core.frameworks.refusal (why_not's rule) about a probe plan: the
# layout with every other knob at a value the framework runs, one knob changed at a time. Its tally line is what a
# rejection is counted as.


def _layout_probe(cap: Capability, tp: int, pp: int, cp: int, dp: int, rej: Rejections) -> tuple[Plan, tuple[int, ...]] | None:
    """A legal plan of this layout for the framework (its lowest ZeRO stage), and the ZeRO stages it runs there;
    None (the reason counted) when it runs none. Remembered per (capability, layout) for the process: the answer
    reads the capability table alone (no model, cluster or workload), which does not change, and a ranking asks
    a few hundred layouts, each four validated probe plans and their refusals (a third of a new scenario's
    enumeration); the rankings of one process (`--gpus auto`, what would fit, a server) ask the same ones again."""
    def answer() -> tuple[Plan, tuple[int, ...]] | str:  # the plan and stages, or the tally of the refusal
        probes = [Plan(tp=tp, pp=pp, dp=dp, cp=cp, zero=z, framework=cap.name) for z in ZERO_STAGES]
        zeros = tuple(p.zero for p in probes if refusal(p) is None)
        return (probes[zeros[0]], zeros) if zeros else refusal(probes[0]).tally

    hit = _remembered(("layout", cap.name, tp, pp, cp, dp), answer)
    if isinstance(hit, str):  # the tally of the refusal: counted at every enumeration it stops
        rej.add(hit)
        return None
    return hit


# Probes remembered (a 1,024-GPU ranking asks ~600 layouts per framework, and a few probes of each); then it starts
# again.
LAYOUT_PROBE_MEMO = 50_000
_PROBES: dict[tuple, object] = {}  # _remembered's answers, keyed by what asked (LAYOUT_PROBE_MEMO entries)


def _remembered(key: tuple, answer: Callable[[], object]) -> object:
    """answer(), remembered per process under `key` (its first item names the probe): the probes of a layout and
    of its plan (the layout's ZeRO stages, its stage split, interleaved schedule, offloads, sequence parallelism,
    recompute), which read the plan, the capability table and the model, never the workload or the cluster (a new
    scenario of the same model asks them again: ~40 % of its enumeration)."""
    if key not in _PROBES:
        if len(_PROBES) >= LAYOUT_PROBE_MEMO:
            _PROBES.clear()
        _PROBES[key] = answer()
    return _PROBES[key]


def _stage_choices(cap: Capability, model: ModelSpec, base: Plan, rej: Rejections) -> tuple[int, ...] | None:
    """The framework's own split of the layers over the stages (() when even), or None when it cannot run one."""
    if base.pp == 1:
        return ()

    def answer() -> tuple[int, ...] | str:  # the split, or the tally of its refusal (counted at every enumeration)
        split = stage_layers(cap, model.layers, base.pp)
        r = refusal(replace(base, stage_layers=split or ()), model)
        return r.tally if r else (() if len(set(split)) == 1 else split)

    hit = _remembered(("stages", cap.name, model, base), answer)
    if isinstance(hit, str):
        rej.add(hit)
        return None
    return hit


def _schedules(cap: Capability, base: Plan, model: ModelSpec, grad_accum: int,
               space: PlanSpace) -> list[tuple[str, int, str | None]]:
    """(schedule, virtual stages, the tally of its refusal or None) for each schedule the framework has, in its
    order: the caller counts a refusal at every combination it stops."""
    if base.pp == 1:
        return [("1f1b", 1, None)]
    out: list[tuple[str, int, str | None]] = []
    for sched in cap.schedules:  # the framework's schedules, in its order
        if sched != "interleaved":
            out.append((sched, 1, None))
            continue
        v = space.interleaved_stages
        # Remembered per process (_remembered): the answer reads the plan, the capability table and, of the model,
        # its layers and experts (core.frameworks._model_refusal; its name only words the reason, and the tally is
        # what is kept).
        def answer(v: int = v) -> str | None:
            probe = replace(base, schedule="interleaved", virtual_stages=v)
            # The layers-per-stage rule is counted before the micro-batch rule (refusal checks them the other way
            # round): the first probe runs a micro-batch count every pipeline accepts.
            r = refusal(replace(probe, grad_accum=base.pp), model) or refusal(replace(probe, grad_accum=grad_accum))
            return r.tally if r else None

        out.append(("interleaved", v,
                    _remembered(("interleaved", base, grad_accum, v, model.layers, model.experts), answer)))
    return out


def _ep_choices(cap: Capability, model: ModelSpec, base: Plan, rej: Rejections) -> tuple[int, ...]:
    if not model.is_moe:
        return (1,)
    eps = []
    for e in (e for e in divisors(base.dp) if e > 1 and model.experts % e == 0):
        r = refusal(replace(base, ep=e))
        if r:
            rej.add(r.tally)
        else:
            eps.append(e)
    return (1, *eps)


def _offloads(base: Plan, zero: int, dp: int, offload: bool) -> tuple[tuple[bool, bool], ...] | None:
    """(optimizer_offload, param_offload) pairs the framework runs at this ZeRO stage; None when the stage over one
    data-parallel replica would shard nothing and no offload makes it worth running. Remembered (_remembered)."""
    return _remembered(("offloads", base, zero, dp, offload), lambda: _offloads_of(base, zero, dp, offload))


def _offloads_of(base: Plan, zero: int, dp: int, offload: bool) -> tuple[tuple[bool, bool], ...] | None:
    at_zero = replace(base, zero=zero)
    offload_ok = offload and refusal(replace(at_zero, optimizer_offload=True)) is None
    if dp == 1 and zero > 0 and not offload_ok:
        return None
    offloads = [(True, False)] if dp == 1 and zero > 0 else [(False, False)] + ([(True, False)] if offload_ok else [])
    if offload_ok and refusal(replace(at_zero, optimizer_offload=True, param_offload=True)) is None:
        offloads.append((True, True))
    return tuple(offloads)  # shared by the enumerations that remember it


def refuse_host_ram(described: pl.DataFrame, *, host_ram_gib_per_node: float, rej: Rejections) -> pl.DataFrame:
    """The plans whose offloaded states fit in a node's host RAM (features.memory.host_memory: what the ranks of one
    node pin there); the others are refused, counted with the reason. The enumeration above cannot ask this (it
    needs the model's sizes per rank), so it is asked of the described frame, before anything is predicted.
    A cluster without a host RAM figure (0: CPU hosts, whose device memory is host memory) is not checked."""
    if host_ram_gib_per_node <= 0 or not described.height:
        return described
    need = described["d_host_ram_node_gib"]
    over = need > host_ram_gib_per_node
    n = int(over.sum())
    if n:
        rej.add(f"{HOST_RAM_REFUSAL} {need.filter(over).min():,.0f} GiB or more per node, the node has "
                f"{host_ram_gib_per_node:,.0f} GiB", n)
    return described.filter(~over) if n else described  # nothing refused: no copy of the frame


HOST_RAM_REFUSAL = "their offloaded states need host RAM:"  # how refuse_host_ram's tally reasons start


def enumerate_plans(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                    rejections: Rejections | None = None) -> Iterator[Plan]:
    """Every plan the capability table (core.frameworks) says its framework can run on this cluster."""
    for fields in _plan_fields(model, cluster, workload, space, rejections):
        yield Plan(**dict(zip(PLAN_COLUMNS, fields, strict=True)))


def plan_columns_frame(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                       rejections: Rejections | None = None) -> pl.DataFrame:
    """enumerate_plans' plans as the flat plan columns (core.scenario.plan_columns, in its order), built without a
    Plan object per plan: a large ranking has tens of thousands, and validating each took longer than ranking them.
    The plans are the same, in the same order (tests/test_speed.py)."""
    rows = list(_plan_fields(model, cluster, workload, space, rejections))
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(PLAN_COLUMNS)
    data = {}
    for (name, col), values in zip(PLAN_COLUMNS.items(), cols, strict=True):
        if name == "stage_layers":
            text = {v: stage_layers_text(v) for v in set(values)}
            values = [text[v] for v in values]
        data[col] = pl.Series(col, values, dtype=_PLAN_DTYPES[type(getattr(_DEFAULT_PLAN, name))])
    return pl.DataFrame(data)


_DEFAULT_PLAN = Plan()
_PLAN_DTYPES = {int: pl.Int64, bool: pl.Boolean, str: pl.Utf8, tuple: pl.Utf8}


def _plan_fields(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                 rejections: Rejections | None = None) -> Iterator[tuple]:
    """The legal plans as tuples of Plan's fields in core.scenario.PLAN_COLUMNS' order (the one enumeration)."""
    space = space or PlanSpace()
    rej = rejections if rejections is not None else Rejections()
    trainer_refusals: dict[tuple, object] = {}
    caps = []
    for f in space.frameworks:  # only frameworks that run the objective with the optimizer (pairing_refusal)
        refused = pairing_refusal(f, workload.objective, workload.optimizer)
        if refused is not None:
            rej.add(refused.tally)
        else:
            caps.append(capability(f))
    for tp, pp, cp, dp in _layouts(model, cluster, workload, space, rej):
        per_replica = workload.global_batch // dp
        for cap in caps:
            layout = _layout_probe(cap, tp, pp, cp, dp, rej)
            if layout is None:
                continue
            base, zeros = layout
            stages = _stage_choices(cap, model, base, rej)
            if stages is None:
                continue
            base = replace(base, stage_layers=stages)
            sps: tuple[bool, ...] = (False,)
            if tp > 1 and _remembered(("sp", model, base),
                                      lambda b=base: refusal(replace(b, sequence_parallel=True), model) is None):
                sps = (False, True)
            if True in sps and workload.seq_len % tp:
                rej.add("sequence parallel: seq_len not divisible by tp")
                sps = (False,)
            eps = _ep_choices(cap, model, base, rej)
            # What depends on neither the micro-batch nor the schedule is asked once per layout and framework;
            # its rejections are still counted at every combination they stop, as before.
            rc_refusals = {rc: _remembered(("recompute", base, rc),
                                           lambda b=base, rc=rc: refusal(replace(b, recompute=rc)))
                           for rc in space.recompute}
            # An optimizer whose kernels need the GPU (core.frameworks Optimizer.host_step) never steps offloaded.
            offload_by_zero = {zero: _offloads(base, zero, dp, space.offload and OPTIMIZERS[workload.optimizer].host_step)
                               for zero in zeros}
            for mb in space.micro_batches:
                if per_replica % mb:
                    rej.add("micro-batch does not divide the per-replica batch")
                    continue
                ga = per_replica // mb
                schedules = _schedules(cap, base, model, ga, space)  # depends on the micro-batches, not the stage
                for zero in zeros:
                    offloads = offload_by_zero[zero]
                    if offloads is None:
                        rej.add("zero over one data-parallel replica shards nothing (only worth it to offload)")
                        continue
                    for schedule, v, refused in schedules:
                        if refused:
                            rej.add(refused)
                            continue
                        for rc in space.recompute:
                            r = rc_refusals[rc]
                            if r:
                                rej.add(r.tally)
                                continue
                            for sp in sps:
                                for ep in eps:
                                    for off, poff in offloads:
                                        # The trainer that runs the objective may run less than its framework
                                        # (trainer_refusal reads the framework, ZeRO stage, offload and recompute:
                                        # asked once per combination, counted at every plan it stops).
                                        key = (cap.name, zero, off, rc)
                                        if key not in trainer_refusals:
                                            trainer_refusals[key] = trainer_refusal(
                                                Plan(tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp, zero=zero,
                                                     recompute=rc, micro_batch=mb, grad_accum=ga,
                                                     optimizer_offload=off, param_offload=poff, framework=cap.name,
                                                     schedule=schedule, virtual_stages=v, ep=ep,
                                                     stage_layers=stages), workload.objective)
                                        tr = trainer_refusals[key]
                                        if tr:
                                            rej.add(tr.tally)
                                            continue
                                        # fused_head, eager_attention, reentrant_checkpoint: the ranking does
                                        # not choose kernels (the default head, a fused attention kernel, the
                                        # recompute --emit writes)
                                        yield (tp, pp, dp, cp, sp, zero, rc, mb, ga, off, cap.name, schedule, v,
                                               ep, poff, stages, False, False, False)
