"""Rank every legal plan of a (model, cluster, workload) by predicted throughput, from the learned predictor."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
from perfpredict.predictor.predict import load_predictor, predict_frame

c = pl.col
__all__ = ["RANK_COLUMNS", "Ranking", "fewest_gpus", "rank_plans", "what_would_fit"]
@dataclass
class Ranking:
    table: pl.DataFrame  # every legal plan, fitting ones first, best predicted throughput first
    rejections: Rejections
    cluster: Cluster
    workload: Workload
    model: ModelSpec
    oom_margin: float = 0.0  # fits when predicted peak x (1 + margin) <= GPU memory
    notes: list[str] = field(default_factory=list)

    @property
    def fitting(self) -> pl.DataFrame:
        return self.table.filter(c("fits"))

    @property
    def misses(self) -> pl.DataFrame:
        return self.table.filter(~c("fits")).sort("peak_memory_gib")


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
    plans = plan_columns_frame(model, cluster, workload, space, rej)
    if not plans.height:
        reasons = ", ".join(f"{r} ({n})" for r, n in rej.counts.most_common(3))
        raise PerfPredictError(f"no legal plan for {model.name} on {cluster.gpus} GPUs with global batch "
                               f"{workload.global_batch}: {reasons}")
    bundle = bundle or load_predictor()
    df = predict_frame(plans_frame(model, cluster, workload, plans), bundle=bundle)
    # Time to finish: the dataset's samples at the predicted rate, plus the one-off reference pass when the
    # reference log-probs are precomputed (a forward over the dataset at the step's achieved FLOP rate).
    rate = c("d_flops_per_step") / c("step_time_s")
    total = c("w_dataset_size").cast(pl.Float64) * c("w_epochs")
    df = df.with_columns(
        plan=_label_expr(),
        time_to_finish_h=pl.when(total > 0).then(
            (total / c("samples_per_s") + c("d_precompute_flops") / rate) / 3600.0).otherwise(None),
    )
    # Deterministic order: fitting first, then throughput; equal throughput goes to the plan needing less memory,
    # then to the label (so a rerun ranks identically).
    df = df.sort(["fits", "samples_per_s", "peak_memory_gib", "plan"], descending=[True, True, False, False],
                 maintain_order=True).with_row_index("rank", offset=1)
    return Ranking(table=df.select([k for k in RANK_COLUMNS if k in df.columns]), rejections=rej,
                   cluster=cluster, workload=workload, model=model, oom_margin=bundle.oom_margin)


def what_would_fit(*, model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace | None = None,
                   bundle: Bundle | None = None, gpus_per_node: int | None = None) -> list[str]:
    """When nothing fits: which single change makes some plan fit (more GPUs, a precomputed or offloaded
    reference), each with the best plan it gives."""
    tips = []
    variants: list[tuple[str, Cluster, Workload]] = []
    if workload.reference == "live":
        variants.append(("precompute the reference log-probs (--reference precomputed)", cluster,
                         replace(workload, reference="precomputed")))
        variants.append(("offload the reference model (--reference offloaded)", cluster,
                         replace(workload, reference="offloaded")))
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
            tips.append(f"{tip}: best {best['plan']} at {num(best['samples_per_s'])} {unit}/s, "
                        f"{best['peak_memory_gib']:.1f} GiB")
            if tip.startswith("use"):
                break
    return tips


def fewest_gpus(*, model: ModelSpec, cluster: Cluster, workload: Workload, target_samples_per_s: float,
                space: PlanSpace | None = None, bundle: Bundle | None = None, max_nodes: int = 128
                ) -> Ranking | None:
    """The smallest cluster of this GPU (whole nodes beyond one) whose best fitting plan meets the target."""
    gpn = cluster.gpus_per_node
    counts = [g for g in (1, 2, 4) if g < gpn] + [gpn * n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
                                                  if n <= max_nodes]
    for g in counts:
        per_node, nodes = node_shape(g, gpn)
        cl = replace(cluster, gpus_per_node=per_node, nodes=nodes)
        try:
            r = rank_plans(model=model, cluster=cl, workload=workload, space=space, bundle=bundle)
        except PerfPredictError:
            continue
        if r.fitting.height and r.fitting["samples_per_s"][0] >= target_samples_per_s:
            return r
    return None


EXPLAIN_PARTS = (("compute", "b_compute_s"), ("TP communication", "b_tp_comm_s"), ("DP communication", "b_dp_comm_s"),
                 ("pipeline communication", "b_pp_comm_s"), ("pipeline bubble", "b_bubble_s"),
                 ("optimizer/offload", "b_optimizer_s"))


def explain(ranking: Ranking) -> str:
    """Why the best fitting plan beats the second, term by term (the `--explain` text)."""
    df = ranking.fitting
    unit = "pairs" if ranking.workload.is_preference else "samples"
    if df.height < 2:
        return "only one plan fits: nothing to compare"
    a, b = df.row(0, named=True), df.row(1, named=True)
    diffs = sorted(((b[k] - a[k], name) for name, k in EXPLAIN_PARTS), reverse=True)
    lines = [f"#1 {a['plan']}: {num(a['samples_per_s'])} {unit}/s, step {a['step_time_s']:.3g} s, "
             f"{a['peak_memory_gib']:.1f} GiB",
             f"#2 {b['plan']}: {num(b['samples_per_s'])} {unit}/s, step {b['step_time_s']:.3g} s, "
             f"{b['peak_memory_gib']:.1f} GiB",
             f"#1 is {100 * (a['samples_per_s'] / b['samples_per_s'] - 1):.1f}% faster. Per step (s), #1 vs #2:"]
    for name, k in EXPLAIN_PARTS:
        lines.append(f"  {name:<24} {a[k]:8.3f} vs {b[k]:8.3f}")
    gain, why = diffs[0]
    if gain > 0:
        lines.append(f"The main gain is {why} ({gain:.3f} s less per step).")
    lines.append(f"Memory: states {a['mem_states_gib']:.1f} vs {b['mem_states_gib']:.1f}, activations "
                 f"{a['mem_activations_gib']:.1f} vs {b['mem_activations_gib']:.1f}, logits {a['mem_logits_gib']:.1f} vs "
                 f"{b['mem_logits_gib']:.1f}, reference {a['mem_reference_gib']:.1f} vs {b['mem_reference_gib']:.1f}, "
                 f"gathered parameters {a['mem_other_gib']:.1f} vs {b['mem_other_gib']:.1f} GiB (the peak rank's parts; "
                 "they add up to its peak).")
    return "\n".join(lines)


def misses_line(ranking: Ranking, n: int = 3) -> str:
    """The closest plans that do not fit, and by how much."""
    miss = ranking.misses.head(n)
    return (f"closest misses (a plan fits when its predicted peak x {1 + ranking.oom_margin:.2f}, the margin "
            "calibrated on held-out OOM outcomes, stays within GPU memory): "
            + "; ".join(f"{m['plan']} needs {m['peak_memory_gib']:.1f} GiB of {m['g_memory_gib']:.0f}"
                        for m in miss.iter_rows(named=True)))
