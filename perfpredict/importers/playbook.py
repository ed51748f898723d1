"""Ultra-Scale Playbook (Hugging Face nanotron team): measured nanotron runs of 1B and 8B Llama-style models on
1..64 nodes of 8x H100, with crashed/OOM attempts, and inter-node collective bus bandwidth at 256 MB."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.schema import FAILED_UNKNOWN, LARGER_MICRO_BATCH_RAN, SIBLINGS_OVER_GPU
from perfpredict.core.workload import Workload
from perfpredict.importers.common import (
    Upstream,
    probes_frame,
    run_id,
    runs_frame,
    scenario_row,
    write_outputs,
    write_source_md,
)

MODULE = "playbook"
UPSTREAM = Upstream(folder="ultrascale_playbook", repo="vinjn/nanotron-ultrascale-playbook (mirror of the HF Space "
                    "nanotron/ultrascale-playbook)", commit="924e4d0b88e065a9a5198d75b113da1cf3bd4473",
                    # The mirror commit's date is not recorded in SOURCE.md; this is the playbook's publication date.
                    date="2025-02-19", license="Apache-2.0",
                    software={"framework": "nanotron", "tp_mode": "REDUCE_SCATTER", "pp_engine": "1f1b",
                              "grad_accum_dtype": "fp32"})
BENCH_FILE = "benchmarks_1B_8B.csv"
PLOTS_FILE = "measured_scaling_plots.csv"
NCCL_FILE = "nccl_busbw_vs_nodes_256MB.csv"
GPU = "h100-sxm-80gb"
SEQ = 4096
GPUS_PER_NODE = 8
# The playbook's "GB" read as decimal gigabytes (see SECTION for the evidence); stored in GiB.
GB_TO_GIB = 1e9 / 2**30
NCCL_BYTES = 256 * 2**20

MODELS = {
    "1B": ModelSpec(name="playbook-llama-1b", layers=16, hidden=2048, heads=32, kv_heads=32, ffn=8192, vocab=131072,
                    tied_embeddings=False, gated_mlp=True),
    "8B": ModelSpec(name="playbook-llama-8b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=14336,
                    vocab=131072, tied_embeddings=False, gated_mlp=True),
}

NO_METRICS = "no metrics published: crashed or out of memory, cause not given upstream"
# A run without metrics is `failed_unknown`, not `oom`: the source's figure files them under one category,
# "crashed/oom" (assets/data/benchmarks/benchmarks_interactive.html, the benchmark heatmap's legend), and its text
# ("Lessons learned on benchmarking", index.html) names failures that are not memory at all: processes that failed to
# clean up, jobs Slurm terminated with their nodes, jobs that hung. No log or per-run cause is published.


def _num(x: str) -> float | None:
    x = x.strip()
    if x == "" or x.lower() == "nan":
        return None
    return float(x)


def _fingerprint(nodes: int) -> dict[str, Any]:
    return {"gpu": "NVIDIA H100 80GB", "gpus_per_node": GPUS_PER_NODE, "nodes": nodes,
            "inter_node": "AWS EFA (per playbook text)"}


def read_bench(src: Path) -> list[tuple[int, dict[str, str]]]:
    with open(src / BENCH_FILE, newline="", encoding="utf-8-sig") as f:
        return [(line, r) for line, r in enumerate(csv.DictReader(f), start=2)]


def _config(r: dict[str, str]) -> tuple:
    """A run's identity: model, nodes and the plan as published (grad_acc included, see SECTION)."""
    return tuple(r[k] for k in ("model", "nodes", "mbs", "grad_acc", "dp", "pp", "tp", "zero"))


def published_twice(src: Path) -> dict[int, list[int]]:
    """line -> the other lines publishing the same configuration (only lines that have a twin)."""
    by: dict[tuple, list[int]] = {}
    for line, r in read_bench(src):
        by.setdefault(_config(r), []).append(line)
    return {ln: [o for o in lines if o != ln] for lines in by.values() if len(lines) > 1 for ln in lines}


def import_runs(src: Path) -> pl.DataFrame:
    gpu = get_gpu(GPU)
    bench = read_bench(src)
    by_line = dict(bench)
    twins = published_twice(src)
    rows: list[dict[str, Any]] = []
    for line, r in bench:
        model = MODELS[r["model"]]
        nodes, gpus = int(r["nodes"]), int(r["gpus"])
        mbs, ga, gbs_pub = int(r["mbs"]), int(r["grad_acc"]), int(r["gbs"])
        dp, pp, tp, zero = int(r["dp"]), int(r["pp"]), int(r["tp"]), int(r["zero"])
        if gpus != nodes * GPUS_PER_NODE or tp * pp * dp != gpus:
            raise ValueError(f"{BENCH_FILE}:{line}: gpus {gpus} != nodes x 8 or tp*pp*dp")
        notes = []
        # nanotron's global batch is micro_batch_size x batch_accumulation_per_replica x dp, and its tokens/s and
        # MFU are that batch's tokens over the iteration time (huggingface/nanotron src/nanotron/trainer.py:
        # DistributedTrainer.__init__ global_batch_size, train_step_logs tokens_per_sec), so the published grad_acc
        # is what ran and the global batch is the one it implies; the gbs column is a constant 256 (SECTION).
        gbs = mbs * ga * dp
        if gbs != gbs_pub:
            notes.append(f"published gbs={gbs_pub} but mbs*grad_acc*dp={gbs}: the plan is the published grad_acc "
                         f"and global_batch the {gbs} samples it implies (gbs_published keeps {gbs_pub})")
        cluster = Cluster(gpu=gpu, gpus_per_node=GPUS_PER_NODE, nodes=nodes)
        workload = Workload(objective="pretrain", seq_len=SEQ, global_batch=gbs, precision="bf16")
        plan = Plan(tp=tp, pp=pp, dp=dp, sequence_parallel=tp > 1, zero=zero, recompute="none", micro_batch=mbs,
                    grad_accum=ga, framework="nanotron", schedule="1f1b")
        flat, problem = scenario_row(model, cluster, workload, plan)
        tok_s, mem = _num(r["tok_s"]), _num(r["gpu_mem_gb"])
        ran = [t for t in twins.get(line, []) if _num(by_line[t]["tok_s"]) is not None]
        labels: dict[str, Any]
        if tok_s is None:
            if pp > model.layers:
                # nanotron cannot build more pipeline stages than layers: a configuration error, not a memory one.
                labels = {"outcome": "error",
                          "error": f"no metrics published; pp={pp} exceeds the model's {model.layers} layers, so "
                                   "the configuration cannot run (classified error rather than oom)"}
            elif ran:
                t = ran[0]
                labels = {"outcome": "error",
                          "error": f"no metrics published, but the same configuration ran at {BENCH_FILE}:{t} "
                                   f"({by_line[t]['gpu_mem_gb']} GB): not a deterministic out-of-memory, cause "
                                   "not given upstream"}
            else:
                labels = {"outcome": FAILED_UNKNOWN, "error": NO_METRICS}
        else:
            step = gbs * SEQ / tok_s
            labels = {"outcome": "ok", "error": None, "step_time_s": step, "tokens_per_s": tok_s,
                      "samples_per_s": tok_s / SEQ,
                      "peak_memory_gib": None if mem is None else mem * GB_TO_GIB,
                      "memory_kind": None if mem is None else "reported"}
        if twins.get(line):
            notes.append("configuration published twice: also " + ", ".join(f"{BENCH_FILE}:{t}" for t in twins[line]))
        if problem:
            notes.append(f"scenario check: {problem}")
        rows.append({
            **flat,
            "run_id": run_id(UPSTREAM.folder, BENCH_FILE, line),
            **labels,
            **UPSTREAM.provenance(MODULE, BENCH_FILE, GPU, _fingerprint(nodes)),
            "note": "; ".join(notes) or None,
            "upstream_ref": f"{BENCH_FILE}:{line}",
            "gbs_published": gbs_pub,
            "mfu_pct": _num(r["mfu_pct"]),
            "tok_s_gpu": _num(r["tok_s_gpu"]),
            "gpu_mem_gb": mem,
        })
    oom_evidence(rows, gpu.memory_gib)
    return runs_frame(rows)


def oom_evidence(rows: list[dict[str, Any]], gpu_memory_gib: float) -> None:
    """Set `oom_evidence` on every failed_unknown row from the published peaks of the same layout (model, nodes,
    tp, pp, dp, zero) at other micro-batches: LARGER_MICRO_BATCH_RAN when one at this micro-batch or larger ran
    (memory grows with the micro-batch, so the failure was not its peak); SIBLINGS_OVER_GPU when the line through
    the two largest smaller micro-batches' peaks passes the GPU's memory at this one (consistent with out of
    memory); null otherwise (fewer than two measured smaller siblings, or the line stays under). A diagnostic beside
    the outcome, not a relabel: the extrapolation is an estimate, and estimates are never labels."""
    def layout(r: dict[str, Any]) -> tuple:
        return r["m_name"], r["c_nodes"], r["p_tp"], r["p_pp"], r["p_dp"], r["p_zero"]

    peaks: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["outcome"] == "ok" and r.get("peak_memory_gib"):
            by_mb = peaks.setdefault(layout(r), {})
            by_mb[r["p_micro_batch"]] = max(by_mb.get(r["p_micro_batch"], 0.0), r["peak_memory_gib"])
    for r in rows:
        r["oom_evidence"] = None
        if r["outcome"] != FAILED_UNKNOWN:
            continue
        mb, by_mb = r["p_micro_batch"], peaks.get(layout(r), {})
        if any(m >= mb for m in by_mb):
            r["oom_evidence"] = LARGER_MICRO_BATCH_RAN
            continue
        smaller = sorted(m for m in by_mb if m < mb)
        if len(smaller) >= 2:
            (m1, m2) = smaller[-2:]
            p1, p2 = by_mb[m1], by_mb[m2]
            if p2 + (p2 - p1) / (m2 - m1) * (mb - m2) > gpu_memory_gib:
                r["oom_evidence"] = SIBLINGS_OVER_GPU


def twin_spread(src: Path) -> list[tuple[int, int, float]]:
    """(line, line, max/min tok_s) of every configuration published twice with metrics on both lines."""
    by_line = dict(read_bench(src))
    out = []
    for line, others in sorted(published_twice(src).items()):
        for o in others:
            a, b = _num(by_line[line]["tok_s"]), _num(by_line[o]["tok_s"])
            if o > line and a is not None and b is not None:
                out.append((line, o, max(a, b) / min(a, b)))
    return out


def match_dp_scaling(src: Path) -> list[tuple[int, int | None]]:
    """(line in measured_scaling_plots.csv, matching line in benchmarks_1B_8B.csv or None) for each DP-scaling
    row: the 1B run on dp GPUs (tp=pp=1) whose tok_s_gpu rounds to the plotted value."""
    bench = read_bench(src)
    out = []
    with open(src / PLOTS_FILE, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            if not r["plot"].startswith("dp_scaling"):
                continue
            dp, tok = int(float(r["sweep_value"])), float(r["tok_s_gpu"])
            hit = [bl for bl, b in bench
                   if b["model"] == r["model"] and int(b["dp"]) == dp and b["tp"] == "1" and b["pp"] == "1"
                   and _num(b["tok_s_gpu"]) is not None and abs(float(b["tok_s_gpu"]) - tok) <= 0.5]
            out.append((line, hit[0] if hit else None))
    return out


# nccl-tests bus-bandwidth factors: busbw = algbw x factor, algbw = size / time.
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n}
OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}


def import_probes(src: Path) -> pl.DataFrame:
    get_gpu(GPU)
    rows: list[dict[str, Any]] = []
    with open(src / NCCL_FILE, newline="", encoding="utf-8-sig") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            op = OPS[r["collective"]]
            nodes, n = int(r["nodes"]), int(r["gpus"])
            if r["msg_size"].strip() != "256MB" or n != nodes * GPUS_PER_NODE:
                raise ValueError(f"{NCCL_FILE}:{line}: unexpected row {r}")
            busbw = float(r["busbw_median_GBps"])
            time_s = NCCL_BYTES * BUSBW_FACTOR[op](n) / (busbw * 1e9)
            rows.append({
                "op": op, "pass_": "comm", "dtype": None, "bytes": NCCL_BYTES, "world_size": n,
                "ranks_per_node": GPUS_PER_NODE, "flops": 0.0, "time_s": time_s, "outcome": "ok",
                **UPSTREAM.provenance(MODULE, NCCL_FILE, GPU, _fingerprint(nodes),
                                      {"framework": None, "benchmark": "collective bus bandwidth (playbook figure)"}),
                "run_id": run_id(UPSTREAM.folder, NCCL_FILE, line),
                "upstream_ref": f"{NCCL_FILE}:{line}",
                "busbw_gbps": busbw,
                "busbw_p5_gbps": float(r["busbw_p5_GBps"]),
                "busbw_p95_gbps": float(r["busbw_p95_GBps"]),
            })
    return probes_frame(rows)


SECTION = """\
## Imported into perfpredict (perfpredict.importers.playbook)

- `runs.parquet`: every row of benchmarks_1B_8B.csv (1641), one `runs` row each, built through ModelSpec, Cluster,
  Workload, Plan and flat_row. run_id = hash of `ultrascale_playbook/benchmarks_1B_8B.csv:<line>`; `upstream_ref`
  names the line; `mfu_pct`, `tok_s_gpu`, `gpu_mem_gb` and `gbs_published` keep the published values.
  - Models: `playbook-llama-1b` (16 layers, hidden 2048, 32 heads, ffn 8192) and `playbook-llama-8b` (32, 4096, 32,
    14336); kv_heads = heads, vocab 131072, untied embeddings, SwiGLU (gated) MLP, as in this SOURCE.md.
  - Hardware: catalog `h100-sxm-80gb`, nodes of 8 (gpus = nodes x 8 on every row). Plan: tp/pp/dp/zero (0 or 1),
    micro_batch and grad_accum as published, sequence_parallel = tp > 1 (TP mode REDUCE_SCATTER), recompute none,
    framework nanotron, schedule 1f1b. Workload: pretrain, bf16, seq_len 4096, global_batch = micro_batch x
    grad_accum x dp, the batch that ran; `gbs_published` keeps the published gbs (256 on every row).
  - grad_accum is the published grad_acc on every row. On 20 rows mbs x grad_acc x dp != gbs (PP rows and a few
    tp>1 rows at 32 nodes; implied global batches 16 to 4096 samples); each such row's `note` says so. Until this
    revision the importer rewrote grad_accum there as gbs / (dp x mbs); that was wrong:
    - nanotron's global batch is micro_batch_size x batch_accumulation_per_replica x dp and its tokens/s and MFU
      are that batch's tokens over the iteration time (huggingface/nanotron src/nanotron/trainer.py:
      DistributedTrainer.__init__ and train_step_logs), so the throughput is measured on the batch the published
      grad_acc implies, whatever the gbs column says.
    - The pipeline rows that differ only in grad_acc show the 1F1B bubble, which only the real number of
      micro-batches m sets (efficiency m / (m + pp - 1)): line 27 (pp4, grad_acc 4, MFU 24.7) vs line 11 (grad_acc
      64, 42.3): bubble ratio (4/7)/(64/67) = 0.60, MFU ratio 0.58; line 350 (pp2, 1) vs 329 (2): 0.75 vs 0.73;
      line 674 (pp2, 8) vs 665 (128): 0.90 vs 0.80. Under the rewrite each pair would be one configuration.
    - Not explained by either reading: the four pp=1 pairs at 32 nodes (lines 636/661, 652/685, 1434/1459,
      1452/1486) where grad_acc 64 or 128 runs 2-5x slower than grad_acc 4 or 8 with the same plan otherwise;
      without a bubble a larger batch should be at least as fast per token. They are kept as published.
  - Configurations published twice (same model, nodes and plan, grad_acc included): 10. In 9 of them one line has
    metrics and the other none (lines 2/61, 9/60, 17/59, 67/168, 70/167, 187/284, 192/283, 315/416, 317/415; the
    measured twin peaks at 34.8-68.3 GB of 80); one has metrics on both lines, 8B on 2 nodes, tp8 dp2 zero1 mbs1
    grad_acc 128 (lines 895 and 902): 55,189 vs 11,792 tok/s (4.68x), 19.2 vs 17.8 GB. (With the former rewrite
    the count was 8 pairs with metrics on both lines, 1.25x-5.0x apart, median 2.3x: 7 of those 8 were pairs of
    different grad_acc.) Every twin's `note` names the other line.
  - Labels (ok rows): tokens_per_s = tok_s, step_time_s = global_batch x 4096 / tok_s (the implied batch, not
    the published gbs; of the 20 rows whose grad_accum changed in this revision 9 have metrics, and their step
    times moved by the batch ratio, x1/16 to x16), samples_per_s = tok_s / 4096,
    peak_memory_gib = gpu_mem_gb x 1e9 / 2^30, memory_kind `reported`.
  - Memory unit decision: the playbook prints "GPU memory: 50.2 GB" and nanotron's per-step log reports
    cuda_max_memory_reserved through its human_format, which divides by 1000 (decimal G). We therefore read the
    values as GB = 1e9 bytes and store GiB. Analytic cross-check (bf16 weights + fp32 master + fp32 grad
    accumulator + Adam = 18 B/param, activations ~48 x s x h bytes per layer per sequence with FlashAttention,
    bf16 logits): 8B tp8 dp1 zero0 mbs1 (line 820, 24.4) estimates 23.6e9 B allocated -> 1.04x as GB, 1.11x as GiB;
    1B tp8 dp1 zero0 mbs1 (line 32, 5.4) estimates 4.8e9 B -> 1.12x as GB, 1.20x as GiB; 1B tp1 dp8 zero0 mbs1 (line 3, 36.7)
    estimates 36.5e9 B (38.7e9 B if the fp32 logits are resident at the peak) -> 1.00x (0.95x) as GB, 1.08x (1.02x)
    as GiB. Both readings fit within allocator overhead; the evidence is not decisive, so the decimal label was
    followed. If the values were GiB, every peak_memory_gib here is 7.4% low; `gpu_mem_gb` keeps the raw figure.
    Probably peak *reserved* memory (nanotron's logged figure), not peak allocated: hence memory_kind `reported`.
  - Rows without metrics (nan upstream): outcome `failed_unknown`, error "no metrics published: crashed or out of
    memory, cause not given upstream" - except (a) the 58 rows with pp larger than the model's layer count (1B pp
    32/64/128, 8B pp 64/128), which cannot run at all: outcome `error` with that reason in `error` (they also fail
    the scenario check, pp must divide layers, recorded in `note`); and (b) the 9 rows whose identical configuration
    ran on another line (listed above): outcome `error`, "not a deterministic out-of-memory", since the same plan
    measured a peak well under 80 GB. Totals: 1027 ok, 547 failed_unknown, 67 error.
  - Why `failed_unknown` and not `oom` (until this revision they were `oom`): upstream files every run without
    metrics under one category, "crashed/oom" (the benchmark heatmap's legend in
    assets/data/benchmarks/benchmarks_interactive.html), with no log or per-run cause, and the playbook's text
    ("Lessons learned on benchmarking", index.html) lists failures that are not memory: "PyTorch processes would
    sometimes fail to clean up properly", "The Slurm job manager would forcefully terminate jobs, leading to node
    failures", "Some jobs would hang indefinitely". The 9 twins above show such failures on plans that fit.
    Scored as OOM, these rows counted crashes as missed OOMs (the scale fold's 51.1 % missed OOM was 49.5 points of
    runs predicted under half the usable memory). Evaluation reports them apart (count, share called "fits",
    predicted share of usable memory); they are neither OOM labels nor runs that fitted.
  - `oom_evidence` (a diagnostic, never a label), from this source's own measured peaks of the same layout (model,
    nodes, tp, pp, dp, zero) at other micro-batches: `siblings_over_gpu` on 208 failed rows (the line through the
    two largest smaller micro-batches' peaks passes 80 GiB at the failed one: consistent with out of memory);
    `larger_micro_batch_ran` on 12 (the same layout at this or a larger micro-batch published a peak, so memory did
    not cause the failure); null on the other 327 (fewer than two measured smaller siblings, or the line stays
    under 80 GiB).
- measured_scaling_plots.csv: not imported (0 rows).
  - dp_scaling (1B, 6 rows): each plotted tok/s/GPU is a benchmarks_1B_8B.csv row already imported (matching lines
    listed below), mixing micro-batch 1 and 2 runs, and its memory column is one constant (36.66) for every dp: they
    add no measurement and would double-count runs.
  - tp_scaling / tp_sp_scaling (3B, 10 rows): the playbook only says "a 3B parameter model with a sequence length of
    4,096"; its layers/hidden/heads/ffn/vocab are not published, and neither are the micro-batch behind the
    throughput, dp, nodes or batch size (max_mbs is the largest batch that fitted, not the one timed). The rows cannot
    be described as scenarios.
- `probes.parquet`: nccl_busbw_vs_nodes_256MB.csv (21 rows): op all_reduce / all_gather / reduce_scatter, pass_
  comm, bytes = 256 MiB (268435456; the label says 256MB, taken as the nccl-tests power-of-two size), world_size =
  nodes x 8, ranks_per_node 8, time_s = bytes x F(n) / (busbw_median x 1e9) with the nccl-tests bus-bandwidth factors
  F = 2(n-1)/n for all_reduce and (n-1)/n for all_gather and reduce_scatter (nccl-tests' size is the whole buffer).
  busbw median / p5 / p95 kept as `busbw_gbps`, `busbw_p5_gbps`, `busbw_p95_gbps`; dtype not published (null).
- Provenance: source `ultrascale_playbook`, hardware `h100-sxm-80gb`, collected_at 2025-02-19 (the playbook's
  publication date; the mirror commit's own date is not recorded), license Apache-2.0 (from the Space's front
  matter; the shared folder has no LICENSE file, so LICENSE here is a note saying so), software = nanotron with the
  settings listed above.
"""


def run(shared_root: Path, out_root: Path) -> dict[str, int]:
    src = Path(shared_root) / UPSTREAM.folder
    out = Path(out_root) / UPSTREAM.folder
    counts = write_outputs(out, {"runs": import_runs(src), "probes": import_probes(src)})
    matches = match_dp_scaling(src)
    listing = "\n".join(f"  - {PLOTS_FILE}:{pl_line} = {BENCH_FILE}:{bl}" if bl else
                        f"  - {PLOTS_FILE}:{pl_line}: no matching benchmark row" for pl_line, bl in matches)
    write_source_md(src, out, SECTION + "\nDP-scaling rows and the benchmark rows they repeat:\n" + listing + "\n")
    if not (src / "LICENSE").exists():
        (out / "LICENSE").write_text(
            "No LICENSE file is published with the Ultra-Scale Playbook. Its Hugging Face Space front matter declares\n"
            "license: apache-2.0; the Apache License 2.0 text is at https://www.apache.org/licenses/LICENSE-2.0\n")
    return counts
