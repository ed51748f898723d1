"""One online-DPO iteration (generate k responses per prompt with vLLM, hand the weights over, train DPO on one pair
per prompt), ranked over the ways users run it.

Modes (what we model, and whose code it follows):
- colocated (time-shared): all G devices generate, the trainer's weights are loaded into the engine, all G train.
  TRL's `vllm_mode="colocate"` (trl 1.16 trl/generation/vllm_generation.py:311-368 and
  trl/experimental/online_dpo/online_dpo_trainer.py:490-515: one engine per rank group of
  `vllm_tensor_parallel_size`, `gpu_memory_utilization` = vllm_gpu_memory_utilization, 0.55 by default for online
  DPO and 0.3 for GRPO), verl's and OpenRLHF's hybrid engine do the same. The memory hand-over:
  * sleep off: the engine keeps gpu_memory_utilization x the device for the whole run, so the trainer has only the
    rest (and the KV cache only that fraction);
  * sleep level 2 (TRL's choice, vllm_generation.py:365-366 and 750-752): weights and KV cache are discarded after
    generating; the weights come back through the weight sync that runs anyway, the KV pool is re-mapped;
  * sleep level 1: weights are offloaded to host memory and copied back (two PCIe copies per iteration).
  The CUDA-graph pool stays either way (features.generate.CUDAGRAPH_ESTIMATE_GIB). While the engine generates, the
  trainer's resident memory (weights, optimizer states, reference) stays on the device: vLLM refuses to start when
  free memory is below its utilisation (vllm/v1/worker/utils.py request_memory, 0.19.0:403-420).
- split: g devices run vLLM, G - g train, one after the other (TRL `vllm_mode="server"` with `trl vllm-serve`: the
  trainer waits for the completions, the server idles while it trains). The weights go from trainer rank 0 to the
  server over NCCL (vllm_generation.py:497-506, update_named_params).
- split-async: the same devices, generation of iteration i + 1 overlapping training of iteration i, one step
  off-policy (verl's one-step-off-policy async trainer, OpenRLHF's --async_train): iteration = the slower side +
  the weight sync, which neither side overlaps.

Weight sync (per iteration): a trainer that shards parameters (ZeRO-3 / FSDP, or TP / PP) all-gathers every
parameter before handing it over (trl `_iter_named_params` gathers per parameter), then the engine's load_weights
copies its shard (read the full tensor, write the shard, at HBM bandwidth); split modes add the broadcast to the
server over NVLink (one node) or the inter-node network. Engine start-up is paid once per run and not counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from perfpredict.core.errors import PerfPredictError, require
from perfpredict.core.formatting import num, pct, seconds
from perfpredict.core.generate import GenWorkload
from perfpredict.core.hardware import Cluster, node_shape
from perfpredict.core.model import ModelSpec
from perfpredict.features.generate import (
    CUDAGRAPH_ESTIMATE_GIB,
    DTYPE_BYTES,
    GIB,
    activation_dtype,
    cuda_visible_bytes,
)
from perfpredict.predictor.ties import Tie, tied_top

MODES = ("colocated", "split", "split-async")
SLEEP_LEVELS = (0, 1, 2)
# Colocated engines' gpu_memory_utilization candidates: TRL GRPO's default 0.3, online DPO's 0.55, and more where
# sleep mode hands the memory back to the trainer (vLLM's own default 0.9).
COLOCATED_UTILS = (0.3, 0.55, 0.7, 0.9)
# Per tensor handed over: trl gathers and loads one parameter at a time (a GatheredParameters context or FSDP unshard,
# then vLLM's Python weight_loader). An estimate, not measured here: 1 ms each.
PER_TENSOR_S = 1e-3
TENSORS_PER_LAYER = 9   # q, k, v, o, gate, up, down, two norms


@dataclass(frozen=True)
class WeightSync:
    """Seconds per iteration to hand the trainer's weights to the engine."""

    gather_s: float      # trainer-side all-gather of sharded parameters
    transfer_s: float    # split: trainer rank 0 -> the engine's ranks
    load_s: float        # the engine's load_weights (read the full tensor, write the shard)
    sleep_s: float       # level 1: weights to host after generating and back before the next sync

    @property
    def total_s(self) -> float:
        return self.gather_s + self.transfer_s + self.load_s + self.sleep_s


def weight_sync(m: ModelSpec, cluster: Cluster, *, precision: str = "bf16", train_gpus: int,
                trainer_shards: bool, gen_tp: int, mode: str, sleep_level: int = 0) -> WeightSync:
    """The weight hand-over's time (see the module docstring). Grows with the model, falls with bandwidth."""
    require(mode in MODES, f"unknown mode {mode!r}; accepted: {', '.join(MODES)}")
    require(sleep_level in SLEEP_LEVELS, f"sleep level must be one of {SLEEP_LEVELS}, got {sleep_level}")
    gpu = cluster.gpu
    wbytes = m.param_count * DTYPE_BYTES[activation_dtype(precision)]  # the trainer hands over model-dtype weights
    tensors = m.layers * TENSORS_PER_LAYER + 3
    intra, inter = gpu.intra_node_bw_gb_per_s * 1e9, gpu.inter_node_bw_gb_per_s * 1e9
    gather = 0.0
    if trainer_shards and train_gpus > 1:
        bw = intra if train_gpus <= cluster.gpus_per_node else inter
        gather = wbytes * (train_gpus - 1) / train_gpus / bw + tensors * PER_TENSOR_S
    transfer = 0.0
    if mode != "colocated":
        bw = intra if cluster.gpus <= cluster.gpus_per_node else inter
        transfer = wbytes / bw + tensors * PER_TENSOR_S
    load = (wbytes + wbytes / gen_tp) / (gpu.hbm_tb_per_s * 1e12) + tensors * PER_TENSOR_S
    sleep = 0.0
    if mode == "colocated" and sleep_level == 1:
        pcie = (gpu.pcie_gb_per_s or 32.0) * 1e9  # PCIe 4 x16 when the catalog does not say
        sleep = 2 * wbytes / gen_tp / pcie
    return WeightSync(gather_s=gather, transfer_s=transfer, load_s=load, sleep_s=sleep)


def _shards_params(plan: dict[str, Any]) -> bool:
    return plan["p_zero"] == 3 or plan["p_framework"] in ("fsdp", "trl+fsdp") or plan["p_tp"] > 1 or plan["p_pp"] > 1


@dataclass
class IterationRanking:
    model: ModelSpec
    cluster: Cluster
    workload: GenWorkload
    seq_len: int
    global_batch: int
    table: pl.DataFrame  # one row per (mode, split or memory hand-over), fastest iteration first
    rejections: dict[str, int]

    @property
    def tie(self) -> Tie:
        return tied_top(self.table, value="iteration_s", lo="iteration_lo_s", hi="iteration_hi_s", label="option",
                        higher_is_better=False, knobs=("mode", "gen_devices", "train_devices", "sleep_level",
                                                        "gen_memory_utilization"))


def _train_table(model: ModelSpec, cluster: Cluster, w, bundle) -> pl.DataFrame:
    from perfpredict.features.plans import PlanSpace
    from perfpredict.predictor.rank import rank_plans

    r = rank_plans(model=model, cluster=cluster, workload=w, space=PlanSpace(), bundle=bundle)
    return r.table.filter(pl.col("fits"))  # each plan carries its own oom_margin and r_usable_gib (models.oom)


def _best_gen(model: ModelSpec, cluster: Cluster, workload: GenWorkload, util: float, gen_model) -> dict | None:
    from perfpredict.predictor.generate.rank import rank_generate

    try:
        f = rank_generate(model=model, cluster=cluster, workload=workload, gpu_memory_utilization=util,
                          gen_model=gen_model).fitting
    except PerfPredictError:
        return None
    return f.row(0, named=True) if f.height else None


def _row(mode: str, g: int, t: int, gen: dict, plan: dict, sync: WeightSync, prompts: int, global_batch: int, *,
         util: float, sleep: int, trainer_budget_gib: float) -> dict[str, Any]:
    steps = prompts / global_batch
    train_s = prompts / plan["samples_per_s"]
    tr_lo = train_s * plan["step_time_lo_s"] / plan["step_time_s"]
    tr_hi = train_s * plan["step_time_hi_s"] / plan["step_time_s"]
    gen_s = gen["time_to_generate_s"]
    g_lo, g_hi = gen["time_to_generate_s_interval"]
    s = sync.total_s
    if mode == "split-async":
        it, lo, hi = max(gen_s, train_s) + s, max(g_lo, tr_lo) + s, max(g_hi, tr_hi) + s
    else:
        it, lo, hi = gen_s + s + train_s, g_lo + s + tr_lo, g_hi + s + tr_hi
    # Colocated: every device generates, then every device trains (the sync keeps them all busy too). Split: a
    # device works only while its side does.
    idle = 0.0 if mode == "colocated" else max(0.0, 1 - (g * gen_s + t * train_s) / ((g + t) * it))
    where = (f"colocated on {g}, util {util:g}, sleep {'off' if sleep == 0 else f'L{sleep}'}" if mode == "colocated"
             else f"{mode} {g} gen + {t} train")
    return {"option": where, "mode": mode, "gen_devices": g, "train_devices": t, "gen_layout": gen["layout"],
            "gen_memory_utilization": util, "sleep_level": sleep, "kv_capacity_tokens": gen["kv_capacity_tokens"],
            "train_plan": plan["plan"], "train_peak_gib": plan["peak_memory_gib"],
            "trainer_budget_gib": trainer_budget_gib, "generate_s": gen_s, "sync_s": s,
            "sync_gather_s": sync.gather_s, "sync_transfer_s": sync.transfer_s, "sync_load_s": sync.load_s,
            "sync_sleep_s": sync.sleep_s, "train_s": train_s, "train_steps": steps, "iteration_s": it,
            "iteration_lo_s": lo, "iteration_hi_s": hi, "pairs_per_s": prompts / it, "idle_gpu_share": idle}


def rank_iteration(*, model: ModelSpec, cluster: Cluster, workload: GenWorkload, global_batch: int = 64,
                   seq_len: int | None = None, modes: tuple[str, ...] = MODES, gen_model=None,
                   predictor=None) -> IterationRanking:
    """Every mode's best option for one online-DPO iteration, fastest first (see the module docstring).

    seq_len: the DPO trainer's tokens per sequence (prompt + response); default input_len + output_len."""
    from perfpredict.core.workload import Workload
    from perfpredict.predictor.predict import load_predictor

    for mode in modes:
        require(mode in MODES, f"unknown iteration mode {mode!r}; accepted: {', '.join(MODES)}")
    require(len(modes) > 0, "give at least one iteration mode")
    G = cluster.gpus
    seq = seq_len or (workload.input_len + workload.output_len)
    require(isinstance(seq, int) and seq > 0, f"seq_len must be a positive integer, got {seq!r}")
    gb = min(global_batch, workload.prompts)
    bundle = load_predictor(predictor)
    w = Workload(objective="dpo", seq_len=seq, global_batch=gb, dataset_size=workload.prompts,
                 precision=workload.precision, reference="live")
    rows: list[dict[str, Any]] = []
    rej: dict[str, int] = {}

    def miss(why: str) -> None:
        rej[why] = rej.get(why, 0) + 1

    if "colocated" in modes:
        try:
            train = _train_table(model, cluster, w, bundle)
        except PerfPredictError as e:
            train = pl.DataFrame()
            miss(f"colocated: {e}")
        mem = cluster.gpu.memory_gib
        visible = cuda_visible_bytes(cluster.gpu) / GIB
        for util in COLOCATED_UTILS if train.height else ():
            gen = _best_gen(model, cluster, workload, util, gen_model)
            if gen is None:
                miss(f"colocated: no vLLM layout fits at utilisation {util:g}")
                continue
            for sleep in SLEEP_LEVELS:
                held = util * visible if sleep == 0 else CUDAGRAPH_ESTIMATE_GIB
                budget = mem - held
                resident = (pl.col("mem_states_gib") + pl.col("mem_reference_gib") + pl.col("mem_other_gib"))
                # The plan's own margin against what the allocator can use beside the engine's share.
                ok = train.filter((pl.col("peak_memory_gib") * (1 + pl.col("oom_margin"))
                                   <= pl.col("r_usable_gib") - (mem - budget))
                                  & (resident + util * visible <= mem))
                if ok.height == 0:
                    miss(f"colocated sleep {sleep}: no training plan fits beside the engine at utilisation {util:g}")
                    continue
                plan = ok.row(0, named=True)
                sync = weight_sync(model, cluster, precision=workload.precision, train_gpus=G,
                                   trainer_shards=_shards_params(plan), gen_tp=gen["tp"], mode="colocated",
                                   sleep_level=sleep)
                rows.append(_row("colocated", G, G, gen, plan, sync, workload.prompts, gb, util=util, sleep=sleep,
                                 trainer_budget_gib=budget))
    split_modes = [m for m in modes if m != "colocated"]
    if split_modes:
        if G < 2:
            miss("split: needs at least 2 devices")
        for g in range(1, G):
            t = G - g
            try:  # each side is a cluster of its own under the one GPU-count rule
                gc = Cluster(cluster.gpu, *node_shape(g, cluster.gpus_per_node))
                tc = Cluster(cluster.gpu, *node_shape(t, cluster.gpus_per_node))
            except PerfPredictError:
                miss("split: a side would need a partial node")
                continue
            gen = _best_gen(model, gc, workload, 0.9, gen_model)
            if gen is None:
                miss(f"split: no vLLM layout fits {g} device(s)")
                continue
            try:
                tr = _train_table(model, tc, w, bundle)
            except PerfPredictError:
                tr = pl.DataFrame()
            if tr.height == 0:
                miss(f"split: no training plan fits {t} device(s)")
                continue
            plan = tr.row(0, named=True)
            for mode in split_modes:
                sync = weight_sync(model, cluster, precision=workload.precision, train_gpus=t,
                                   trainer_shards=_shards_params(plan), gen_tp=gen["tp"], mode=mode)
                rows.append(_row(mode, g, t, gen, plan, sync, workload.prompts, gb, util=0.9, sleep=0,
                                 trainer_budget_gib=cluster.gpu.memory_gib))
    if not rows:
        raise PerfPredictError("no iteration option fits: " + "; ".join(f"{k} ({n})" for k, n in rej.items()))
    df = pl.DataFrame(rows).sort(["iteration_s", "option"]).with_row_index("rank", offset=1)
    return IterationRanking(model=model, cluster=cluster, workload=workload, seq_len=seq, global_batch=gb,
                            table=df, rejections=rej)


def headline(r: IterationRanking) -> str:
    w = r.workload
    modes = sorted(set(r.table["mode"].to_list()))
    return (f"online DPO on {r.cluster.gpus} x {r.cluster.gpu.name}: {w.prompts:,} prompts x {w.samples_per_prompt} "
            f"samples, {w.input_len} in / {w.output_len} out, then DPO on one pair per prompt at seq_len {r.seq_len} "
            f"(global batch {r.global_batch}, live reference)\n{r.table.height} options ({', '.join(modes)})"
            + ("; not run: " + "; ".join(f"{k} ({n})" for k, n in list(r.rejections.items())[:4])
               if r.rejections else ""))


def explain(r: IterationRanking) -> str:
    """Why #1 wins, term by term, against the best option of every other mode; and whether it is a tie."""
    t = r.table
    a = t.row(0, named=True)

    def parts(x: dict) -> str:
        return (f"generate {seconds(x['generate_s'])} ({x['gen_layout']}, KV {x['kv_capacity_tokens']:,} tokens per "
                f"replica) + weight sync {seconds(x['sync_s'])} + train {seconds(x['train_s'])} ({x['train_plan']}, "
                f"peak {x['train_peak_gib']:.1f} of {x['trainer_budget_gib']:.1f} GiB)")

    lines = [f"#1 {a['option']}: {seconds(a['iteration_s'])} per iteration, {num(a['pairs_per_s'])} pairs/s; "
             + parts(a) + (", the two sides overlapped" if a["mode"] == "split-async" else "")]
    if a["mode"] == "colocated":
        lines.append(_handover(a))
    else:
        lines.append(f"{pct(a['idle_gpu_share'], 0)} of the GPU time idles (a side waits for the other)")
    others = [t.filter(pl.col("mode") == mode) for mode in MODES if mode != a["mode"]]
    if a["mode"] == "colocated" and a["sleep_level"] > 0:  # what the memory hand-over buys
        others.insert(0, t.filter((pl.col("mode") == "colocated") & (pl.col("sleep_level") == 0)))
    for other in others:
        if other.height == 0:
            continue
        b = other.row(0, named=True)
        lines.append(f"vs {b['option']}: {seconds(b['iteration_s'])} ({100 * (b['iteration_s'] / a['iteration_s'] - 1):+.0f}%"
                     f" for it); " + parts(b) + (f"; {pct(b['idle_gpu_share'], 0)} of GPU time idle"
                                                 if b["mode"] != "colocated" else ""))
    lines.append(r.tie.sentence("iteration time"))
    return "\n".join(lines)


def _handover(a: dict) -> str:
    if a["sleep_level"] == 0:
        return (f"memory hand-over: sleep off, so the engine keeps {a['gen_memory_utilization']:g} of the device "
                f"through training; the trainer has {a['trainer_budget_gib']:.1f} GiB")
    how = ("weights and KV cache discarded, weights re-pushed by the sync" if a["sleep_level"] == 2
           else f"weights offloaded to host and back ({seconds(a['sync_sleep_s'])} per iteration)")
    return (f"memory hand-over: sleep level {a['sleep_level']} ({how}); the trainer has "
            f"{a['trainer_budget_gib']:.1f} GiB, the engine's KV cache {a['gen_memory_utilization']:g} of the device "
            "while generating")
