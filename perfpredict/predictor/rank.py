"""Rank every legal plan of a (model, cluster, workload) by predicted throughput, from the learned predictor."""

from __future__ import annotations

import contextlib
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.formatting import num
from perfpredict.core.hardware import Cluster, node_shape
from perfpredict.core.model import ModelSpec
from perfpredict.core.schema import RANK_COLUMNS
from perfpredict.core.workload import Workload
from perfpredict.features.frame import plans_frame
from perfpredict.features.plans import PlanSpace, Rejections, plan_columns_frame
from perfpredict.models.bundle import Bundle
from perfpredict.predictor.predict import ENGINE_TERMS, fit_line, load_predictor, predict_frame

c = pl.col
STALL_NOTE_SHARE = 0.1  # rank says so when #1's expected step exceeds its stall-free one by this share
# The ranking's order, (column, descending), one place for rank_plans and whoever checks it: fitting first, then the
# expected throughput over the stall regimes (models.stall; the predicted throughput where no pipeline may stall);
# equal throughput goes to the plan needing less memory, then to the label (so a rerun ranks identically).
RANK_ORDER = (("fits", True), ("expected_samples_per_s", True), ("peak_memory_gib", False), ("plan", False))
HOST_RAM_UNBOUNDED_GIB = 1e6  # what_would_fit's "more host RAM": no node limit, the tip names what the plan needs
__all__ = ["RANK_COLUMNS", "RANK_ORDER", "GpuSearch", "Ranking", "fewest_gpus", "host_ram_refused", "rank_plans", "ranking_notes",
           "what_would_fit"]
@dataclass
class Ranking:
    table: pl.DataFrame  # every legal plan, fitting ones first, best predicted throughput first
    rejections: Rejections
    cluster: Cluster
    workload: Workload
    model: ModelSpec
    notes: list[str] = field(default_factory=list)

    # Each plan carries its own verdict (fit_verdict, oom_risk) and margin (oom_margin, fit_limit_gib: models.oom).
    @property
    def fitting(self) -> pl.DataFrame:
        return self.table.filter(c("fits"))

    @property
    def at_risk(self) -> pl.DataFrame:
        return self.table.filter(c("fit_verdict") == "at risk")

    @property
    def misses(self) -> pl.DataFrame:
        return self.table.filter(~c("fits")).sort("oom_risk", "peak_memory_gib")


def _label_expr() -> pl.Expr:
    parts = [c("p_framework"), pl.lit(" tp"), c("p_tp").cast(pl.Utf8), pl.lit(" pp"), c("p_pp").cast(pl.Utf8),
             pl.lit(" dp"), c("p_dp").cast(pl.Utf8),
             pl.when(c("p_cp") > 1).then(pl.lit(" cp") + c("p_cp").cast(pl.Utf8)).otherwise(pl.lit("")),
             pl.when(c("p_ep") > 1).then(pl.lit(" ep") + c("p_ep").cast(pl.Utf8)).otherwise(pl.lit("")),
             pl.when(c("p_sp")).then(pl.lit(" sp")).otherwise(pl.lit("")),
             pl.lit(" z"), c("p_zero").cast(pl.Utf8), pl.lit(" mb"), c("p_micro_batch").cast(pl.Utf8),
             pl.lit(" ga"), c("p_grad_accum").cast(pl.Utf8),
             pl.when(c("p_recompute") != "none").then(pl.lit(" rc-") + c("p_recompute")).otherwise(pl.lit("")),
             pl.when(c("p_offload")).then(pl.lit(" offload")).otherwise(pl.lit("")),
             pl.when(c("p_param_offload")).then(pl.lit("+params")).otherwise(pl.lit("")),
             pl.when(c("p_pp") > 1).then(pl.lit(" ") + c("p_schedule")).otherwise(pl.lit("")),
             pl.when(c("p_vstages") > 1).then(pl.lit("v") + c("p_vstages").cast(pl.Utf8)).otherwise(pl.lit("")),
             pl.when(c("p_stage_layers") != "").then(pl.lit(" stages[") + c("p_stage_layers") + pl.lit("]"))
             .otherwise(pl.lit(""))]
    return pl.concat_str(parts)


def rank_plans(*, model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
               bundle: Bundle | None = None) -> Ranking:
    rej = Rejections()
    described, canon = _described_plans(model, cluster, workload, space or PlanSpace(), rej)
    bundle = bundle or load_predictor()
    df = predict_frame(described, bundle=bundle, described=True, canon=canon)
    # Time to finish: the dataset's samples at the predicted rate, plus the one-off reference pass when the
    # reference log-probs are precomputed (a forward over the dataset at the step's achieved FLOP rate).
    rate = c("d_flops_per_step") / c("step_time_s")
    total = c("w_dataset_size").cast(pl.Float64) * c("w_epochs")
    df = df.with_columns(
        plan=_label_expr(),
        # What is left of GPU memory at the predicted peak, and the host RAM a node's offloaded states pin.
        headroom_gib=c("g_memory_gib") - c("peak_memory_gib"), host_ram_gib=c("d_host_ram_node_gib"),
        time_to_finish_h=pl.when(total > 0).then(
            (total / c("samples_per_s") + c("d_precompute_flops") / rate) / 3600.0).otherwise(None),
    )
    keys = [k for k, _ in RANK_ORDER]
    kept = [k for k in dict.fromkeys([*RANK_COLUMNS, *keys]) if k in df.columns]  # sort only what the table keeps
    df = df.select(kept).sort(keys, descending=[d for _, d in RANK_ORDER], maintain_order=True).with_row_index(
        "rank", offset=1)
    return Ranking(table=df.select([k for k in RANK_COLUMNS if k in df.columns]), rejections=rej,
                   cluster=cluster, workload=workload, model=model)


# The legal plans of a scenario, described, remembered per (model, cluster, workload, plan space) for the rankings of
# one process: they depend on nothing else (no bundle: the predictions are made anew each time), all four are frozen
# values, and polars frames are immutable. `--gpus auto`, what would fit, the API in a server and a repeated ranking
# ask the same scenarios again; enumerating and describing a 70B ranking's 7,104 plans was a third of its time.
# A few scenarios only: 70B on 512 GPUs holds 4.4 MB of descriptors, Mixtral on 64 GPUs 8 MB (13k plans).
SCENARIO_MEMO_SIZE = 8
_scenario_memo: OrderedDict[tuple, tuple[pl.DataFrame, tuple | None, Counter]] = OrderedDict()


def _described_plans(model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace, rej: Rejections
                     ) -> tuple[pl.DataFrame, tuple[pl.DataFrame, np.ndarray] | None]:
    """_host_ram_checked of the scenario's legal plans (the same error when there is none), their rejections
    counted in rej; remembered (see SCENARIO_MEMO_SIZE)."""
    key = (model, cluster, workload, space)
    hit = _scenario_memo.get(key) if SCENARIO_MEMO_SIZE else None
    if hit is None:
        own = Rejections()
        plans = plan_columns_frame(model, cluster, workload, space, own)
        if not plans.height:
            rej.counts.update(own.counts)
            raise _no_legal_plan(model, cluster, workload, own)
        try:
            described, canon = _host_ram_checked(model, cluster, workload, plans, own)
        finally:
            rej.counts.update(own.counts)
        if canon is not None:
            canon[1].flags.writeable = False  # shared by the rankings that reuse it
        hit = (described, canon, own.counts)
        if SCENARIO_MEMO_SIZE:
            _scenario_memo[key] = hit
            while len(_scenario_memo) > SCENARIO_MEMO_SIZE:
                _scenario_memo.popitem(last=False)
        return described, canon
    with contextlib.suppress(KeyError):  # another thread's ranking may have let it go meanwhile
        _scenario_memo.move_to_end(key)
    rej.counts.update(hit[2])
    return hit[0], hit[1]


def _host_ram_checked(model: ModelSpec, cluster: Cluster, workload: Workload, plans, rej: Rejections
                      ) -> tuple[pl.DataFrame, tuple[pl.DataFrame, np.ndarray] | None]:
    """The plans described, less those whose node cannot hold their offloaded states (features.plans
    .refuse_host_ram, counted in rej), and their canonical plans described (models.compose.compose's `canon`;
    None where they cannot be described together); no plan left is the same error as no legal plan."""
    from perfpredict.features.descriptors import describe
    from perfpredict.features.plans import refuse_host_ram
    from perfpredict.models.compose import canonical_plans

    flat = plans_frame(model, cluster, workload, plans)
    # The descriptors cost the same for a few rows as for thousands (one pass of expressions): the plans and their
    # canonical plans are described in one frame.
    shapes, of_row = canonical_plans(flat)
    try:
        both = describe(pl.concat([flat, shapes], how="vertical"))
        desc, canon = both.head(flat.height), both.tail(shapes.height)
    except pl.exceptions.SchemaError:
        desc, canon = describe(flat), None
    keep = desc.with_row_index("_plan")
    described = refuse_host_ram(keep, host_ram_gib_per_node=cluster.host_ram_gib_per_node, rej=rej)
    if canon is not None:
        canon = (canon, of_row[described["_plan"].to_numpy()])
    described = described.drop("_plan")
    if not described.height:
        raise _no_legal_plan(model, cluster, workload, rej)
    return described, canon


def _no_legal_plan(model: ModelSpec, cluster: Cluster, workload: Workload, rej: Rejections) -> PerfPredictError:
    """The error when no plan is left (none legal, or none whose node holds its offloaded states): its three most
    common reasons."""
    reasons = ", ".join(f"{r} ({n})" for r, n in rej.counts.most_common(3))
    return PerfPredictError(f"no legal plan for {model.name} on {cluster.gpus} GPUs with global batch "
                            f"{workload.global_batch}: {reasons}")


def host_ram_refused(ranking: Ranking) -> int:
    """How many offload plans the ranking refused because a node cannot hold their offloaded states."""
    from perfpredict.features.plans import HOST_RAM_REFUSAL

    return sum(n for reason, n in ranking.rejections.counts.items() if reason.startswith(HOST_RAM_REFUSAL))


def ranking_notes(ranking: Ranking) -> list[str]:
    """What a ranking says beside its table: offload plans refused for host RAM (and what they need), and #1's
    pipeline-stall risk when it is a sizeable share of its step."""
    from perfpredict.features.plans import HOST_RAM_REFUSAL

    notes = []
    for reason, n in ranking.rejections.counts.items():
        if reason.startswith(HOST_RAM_REFUSAL):
            notes.append(f"{n:,} offload plan(s) refused: {reason} (--host-ram-gib)")
    top = ranking.fitting.head(1)
    if top.height and top["expected_time_s"][0] - top["stall_free_time_s"][0] > STALL_NOTE_SHARE * top[
            "stall_free_time_s"][0]:
        t = top.row(0, named=True)
        # the stall model's scope is every multi-node plan of a family with measured stalls, with or without a
        # pipeline (the playbook 1B's pp-1 runs stall too on 64 nodes)
        notes.append(f"#1 spans nodes, where measured runs either stall or do not (models.stall): "
                     f"P(stall) {100 * t['stall_risk']:.0f}%, stall-free {t['stall_free_time_s']:.3g} s, stalled "
                     f"{t['stalled_time_s']:.3g} s per step (expected {t['expected_time_s']:.3g} s); the plans are "
                     f"ranked by the throughput expected over both")
    return notes


def what_would_fit(*, model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                   bundle: Bundle | None = None, gpus_per_node: int | None = None,
                   more_host_ram: bool = False) -> list[str]:
    """When nothing fits: which single change makes some plan fit (more GPUs, a precomputed or offloaded
    reference, and with more_host_ram, when offload plans were refused for it, a node with more host RAM), each
    with the best plan it gives."""
    tips = []
    variants: list[tuple[str, Cluster, Workload]] = []
    if workload.reference == "live":
        variants.append(("precompute the reference log-probs (--reference precomputed)", cluster,
                         replace(workload, reference="precomputed")))
        variants.append(("offload the reference model (--reference offloaded)", cluster,
                         replace(workload, reference="offloaded")))
    if more_host_ram:  # the offload plans refused for host RAM, alone and with the reference precomputed
        roomy = replace(cluster, host_ram_gib_per_node=HOST_RAM_UNBOUNDED_GIB)
        variants.append(("use", roomy, workload))
        if workload.reference == "live":
            variants.append(("precompute the reference log-probs (--reference precomputed) and use", roomy,
                             replace(workload, reference="precomputed")))
    # More GPUs as the one GPU-count rule builds them: fill the node first, then whole nodes.
    per_node = max(gpus_per_node or 0, cluster.gpus_per_node)
    for mult in (2, 4, 8):
        try:
            gpn, nodes = node_shape(cluster.gpus * mult, per_node)
        except PerfPredictError:
            continue
        bigger = replace(cluster, gpus_per_node=gpn, nodes=nodes)
        variants.append((f"use {bigger.gpus} GPUs ({nodes} node(s) of {gpn})", bigger, workload))
    for tip, cl, wl in variants:
        try:
            r = rank_plans(model=model, cluster=cl, workload=wl, space=space, bundle=bundle)
        except PerfPredictError:
            continue
        if r.fitting.height:
            best = r.fitting.row(0, named=True)
            unit = "pairs" if wl.is_preference else "samples"
            if cl.host_ram_gib_per_node == HOST_RAM_UNBOUNDED_GIB:
                tip = f"{tip} a node with {math.ceil(best['host_ram_gib']):,} GiB of host RAM (--host-ram-gib)"
            tips.append(f"{tip}: best {best['plan']} at {num(best['samples_per_s'])} {unit}/s, "
                        f"{best['peak_memory_gib']:.1f} GiB")
            if tip.startswith("use ") and cl.host_ram_gib_per_node != HOST_RAM_UNBOUNDED_GIB:
                break
    return tips


@dataclass
class GpuSearch:
    """What `--gpus auto` found: the smallest cluster that meets the goal (a fitting plan, and the throughput target
    when one is set), else the fastest fitting cluster tried; the counts ranked, and why the search stopped."""

    ranking: Ranking | None  # the smallest cluster meeting the goal, else the fastest fitting one (None: none fits)
    met: bool
    tried: tuple[int, ...]
    stopped: str = ""


def gpu_counts(gpus_per_node: int, max_nodes: int = 128) -> tuple[list[int], list[int]]:
    """The cluster sizes `--gpus auto` tries, smallest first: part of one node (1, 2, 4) and powers of two of whole
    nodes, then the sizes between them (3, 6, 12 ... nodes), tried only below the first size that meets the goal."""
    part = [g for g in (1, 2, 4) if g < gpus_per_node]
    main = part + [gpus_per_node * n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= max_nodes]
    between = [gpus_per_node * n for n in (3, 6, 12, 24, 48, 96) if n <= max_nodes]
    return main, between


# A target the throughput is not reaching: stop after this many larger sizes in a row without a gain of at least
# PLATEAU_GAIN over the best so far (more GPUs at a fixed global batch run out of data parallelism and pay for
# deeper pipelines and wider TP), or as soon as even SCALING_SLACK x perfectly linear scaling of the best per-GPU
# rate found would not reach it on the largest size (the slack covers what more memory buys: no offload, larger
# micro-batches). Ranking 1,024 GPUs takes seconds, so searching on to say no cost half a minute.
PLATEAU_COUNTS = 3
PLATEAU_GAIN = 1.05
SCALING_SLACK = 4.0


def fewest_gpus(*, model: ModelSpec, cluster: Cluster, workload: Workload, target_samples_per_s: float = 0.0,
                space: PlanSpace | None = None, bundle: Bundle | None = None, max_nodes: int = 128) -> GpuSearch:
    """The smallest cluster of this GPU (whole nodes beyond one) with a plan predicted to fit, or, with a target,
    whose best fitting plan meets it. Sizes are tried as gpu_counts orders them: powers of two first, then the sizes
    between the last one that fell short and the first that met the goal. A target that is not reached: the fastest
    fitting cluster tried, the search stopping early as PLATEAU_COUNTS and SCALING_SLACK say."""
    gpn = cluster.gpus_per_node
    main, between = gpu_counts(gpn, max_nodes)
    tried: list[int] = []

    def best_at(g: int) -> Ranking | None:
        """The ranking of g GPUs when some plan fits there, else None."""
        per_node, nodes = node_shape(g, gpn)
        tried.append(g)
        try:
            r = rank_plans(model=model, cluster=replace(cluster, gpus_per_node=per_node, nodes=nodes),
                           workload=workload, space=space, bundle=bundle)
        except PerfPredictError:
            return None
        return r if r.fitting.height else None

    def meets(r: Ranking | None) -> bool:
        return r is not None and (target_samples_per_s <= 0 or r.fitting["samples_per_s"][0] >= target_samples_per_s)

    def speed(r: Ranking) -> float:
        return r.fitting["samples_per_s"][0]

    best: Ranking | None = None
    since_best, rate, below = 0, 0.0, 0
    for g in main:
        r = best_at(g)
        if meets(r):
            for h in (h for h in between if below < h < g):  # a smaller size between the last short one and g
                rh = best_at(h)
                if meets(rh):
                    return GpuSearch(ranking=rh, met=True, tried=tuple(tried))
            return GpuSearch(ranking=r, met=True, tried=tuple(tried))
        below = g
        if r is None:
            since_best += best is not None
        elif best is None or speed(r) >= PLATEAU_GAIN * speed(best):
            best, since_best = r, 0
        else:
            since_best += 1
            best = r if speed(r) > speed(best) else best
        if r is not None:
            rate = max(rate, speed(r) / g)
        if best is not None and since_best >= PLATEAU_COUNTS:
            return GpuSearch(ranking=best, met=False, tried=tuple(tried),
                             stopped=f"stopped: {PLATEAU_COUNTS} larger sizes in a row gained less than "
                                     f"{100 * (PLATEAU_GAIN - 1):.0f}%")
        if rate and rate * main[-1] * SCALING_SLACK < target_samples_per_s:
            unit = "pairs" if workload.is_preference else "samples"
            return GpuSearch(ranking=best, met=False, tried=tuple(tried),
                             stopped=f"out of reach: even {SCALING_SLACK:g}x linear scaling of the best rate per "
                                     f"GPU found ({num(rate)} {unit}/s) gives {num(rate * main[-1] * SCALING_SLACK)}"
                                     f" {unit}/s on {main[-1]:,} GPUs")
    return GpuSearch(ranking=best, met=False, tried=tuple(tried),
                     stopped=f"no larger size is tried (at most {max_nodes} nodes)")


EXPLAIN_PARTS = (("compute", "b_compute_s"), ("TP communication", "b_tp_comm_s"), ("DP communication", "b_dp_comm_s"),
                 ("pipeline communication", "b_pp_comm_s"), ("pipeline bubble", "b_bubble_s"),
                 ("optimizer/offload", "b_optimizer_s"), ("pipeline stall risk", "b_stall_s"))


def explain(ranking: Ranking) -> str:
    """Why the best fitting plan beats the second, term by term (the `--explain` text)."""
    df = ranking.fitting
    unit = "pairs" if ranking.workload.is_preference else "samples"
    if df.height < 2:
        return "\n".join(["only one plan fits: nothing to compare", *map(fit_line, df.head(1).iter_rows(named=True))])
    a, b = df.row(0, named=True), df.row(1, named=True)
    diffs = sorted(((b[k] - a[k], name) for name, k in EXPLAIN_PARTS), reverse=True)
    lines = [f"#1 {a['plan']}: {num(a['samples_per_s'])} {unit}/s, step {a['step_time_s']:.3g} s, "
             f"{a['peak_memory_gib']:.1f} GiB",
             f"#2 {b['plan']}: {num(b['samples_per_s'])} {unit}/s, step {b['step_time_s']:.3g} s, "
             f"{b['peak_memory_gib']:.1f} GiB",
             f"#1 is {100 * (a['samples_per_s'] / b['samples_per_s'] - 1):.1f}% faster. Per step (s), #1 vs #2:"]
    for name, k in EXPLAIN_PARTS:
        if k != "b_stall_s" or a[k] or b[k]:  # the stall risk only where a pipeline crosses nodes
            lines.append(f"  {name:<24} {a[k]:8.3f} vs {b[k]:8.3f}")
    gain, why = diffs[0]
    if gain > 0:
        lines.append(f"The main gain is {why} ({gain:.3f} s less per step).")
    lines.append("Engine terms (s), #1 vs #2 (models.compose: within the parts above):")
    for name, k in ENGINE_TERMS.items():
        if k in a:
            lines.append(f"  {name:<40} {a[k]:8.3f} vs {b[k]:8.3f}")
    lines.append(f"Memory: states {a['mem_states_gib']:.1f} vs {b['mem_states_gib']:.1f}, activations "
                 f"{a['mem_activations_gib']:.1f} vs {b['mem_activations_gib']:.1f}, logits {a['mem_logits_gib']:.1f} vs "
                 f"{b['mem_logits_gib']:.1f}, reference {a['mem_reference_gib']:.1f} vs {b['mem_reference_gib']:.1f}, "
                 f"other (gathered parameters, buckets, the optimizer step's temporaries) {a['mem_other_gib']:.1f} vs "
                 f"{b['mem_other_gib']:.1f} GiB (the peak rank's parts at its peak moment, the backward or the "
                 "optimizer step; they add up to its peak).")
    lines.append(fit_line(a))
    return "\n".join(lines)


def misses_line(ranking: Ranking, n: int = 3) -> str:
    """The closest plans that do not fit (at risk first, least risk first), and by how much."""
    miss = ranking.misses.head(n)
    risky = ranking.at_risk.height
    return (f"not counted as fitting: {risky} at risk, {ranking.misses.height - risky} do not fit (a plan fits when its "
            "predicted peak x (1 + its margin), from its memory interval and the margin calibrated per framework "
            "family and GPU memory class, stays within the memory the allocator can use). Closest: "
            + "; ".join(f"{m['plan']} {m['fit_verdict']} (P(OOM) {100 * m['oom_risk']:.0f}%): "
                        f"{m['peak_memory_gib']:.1f} GiB x {1 + m['oom_margin']:.2f} vs {m['r_usable_gib']:.1f} "
                        f"usable of {m['g_memory_gib']:.0f}"
                        for m in miss.iter_rows(named=True)))
