"""vTrain (VIA-Research/vTrain): 1440 measured Megatron-DeepSpeed iteration times on one A100 node, and
nccl-tests style all-reduce tables (2..8 GPUs) on A100 and V100 nodes."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload
from perfpredict.importers.common import (
    Upstream,
    log_spaced,
    probes_frame,
    run_id,
    runs_frame,
    scenario_row,
    write_outputs,
    write_source_md,
)

MODULE = "vtrain"
UPSTREAM = Upstream(folder="vtrain", repo="VIA-Research/vTrain", commit="f8dda8473a48b373b1d25f51f52d685bff5150c5",
                    date="2024-09-26", license="MIT",
                    software={"framework": "Megatron-DeepSpeed"})
RUNS_FILE = "ground_truth_single.csv"
GPU_NAMES = {"a100": "a100-sxm-80gb", "v100": "v100-sxm-32gb"}
# GPT-2 BPE has 50257 tokens; Megatron pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by
# 128), which gives 50304 at tp=1 and 51200 at tp=8; we use 51200 for every row so the model is one shape per
# (hidden, layers) whatever the plan.
VOCAB = 51200
LUT_SIZES = 64

COLUMNS = ["gpus", "global_batch", "micro_batch", "hidden", "heads", "layers", "seq_len", "tp", "dp", "pp",
           "iteration_ms"]


def _model(hidden: int, layers: int, heads: int) -> ModelSpec:
    # Megatron-DeepSpeed GPT: LayerNorm + GELU MLP (4h), biases on QKV and MLP, input embedding shared with the
    # output layer (its default; untie is opt-in). Learned position embeddings (seq x hidden) are not modelled.
    return ModelSpec(name=f"gpt-h{hidden}-l{layers}", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn=4 * hidden, vocab=VOCAB, tied_embeddings=True, gated_mlp=False, mlp_bias=True,
                     qkv_bias=True)


def import_runs(src: Path) -> pl.DataFrame:
    gpu = get_gpu(GPU_NAMES["a100"])
    rows: list[dict[str, Any]] = []
    # utf-8-sig strips the byte-order mark upstream put before the first header cell.
    with open(src / RUNS_FILE, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader)
        if len(header) != len(COLUMNS) or not header[0].startswith("# GPUs"):
            raise ValueError(f"{RUNS_FILE}: unexpected header {header}")
        for line, rec in enumerate(reader, start=2):
            if not rec:
                continue
            v = dict(zip(COLUMNS, rec, strict=True))
            gpus, gb, mb, h, a, layers, s, tp, dp, pp = (int(v[c]) for c in COLUMNS[:-1])
            step = float(v["iteration_ms"]) / 1000.0
            if gb % (dp * mb):
                raise ValueError(f"{RUNS_FILE}:{line}: global batch {gb} is not a multiple of dp*micro_batch")
            model = _model(h, layers, a)
            cluster = Cluster(gpu=gpu, gpus_per_node=gpus, nodes=1)
            workload = Workload(objective="pretrain", seq_len=s, global_batch=gb, precision="fp16")
            plan = Plan(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=gb // (dp * mb), recompute="full",
                        framework="megatron", schedule="1f1b", zero=0)
            flat, problem = scenario_row(model, cluster, workload, plan)
            rows.append({
                **flat,
                "run_id": run_id(UPSTREAM.folder, RUNS_FILE, line),
                "outcome": "ok", "error": None,
                "step_time_s": step,
                "tokens_per_s": gb * s / step, "samples_per_s": gb / step,
                "peak_memory_gib": None,
                **UPSTREAM.provenance(MODULE, RUNS_FILE, gpu.name,
                                      {"gpu": "NVIDIA A100 (catalog a100-sxm-80gb assumed)", "gpus": gpus,
                                       "nodes": 1}),
                "note": problem or None,
                "upstream_ref": f"{RUNS_FILE}:{line}",
                "iteration_time_ms": float(v["iteration_ms"]),
            })
    return runs_frame(rows)


_LUT = re.compile(r"AR_GPU(\d+)_1M_1024M_LUT\.csv")


def import_probes(src: Path, sizes_per_file: int = LUT_SIZES) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for gpu_dir in sorted((src / "trace").iterdir()):
        hw = GPU_NAMES.get(gpu_dir.name)
        if hw is None or not gpu_dir.is_dir():
            continue
        get_gpu(hw)  # fail loudly if the catalog lacks it
        for path in sorted(gpu_dir.glob("AR_GPU*_LUT.csv")):
            m = _LUT.fullmatch(path.name)
            if not m:
                continue
            n = int(m.group(1))
            rel = f"trace/{gpu_dir.name}/{path.name}"
            with open(path, newline="", encoding="utf-8-sig") as f:
                recs = [(line, r) for line, r in enumerate(csv.reader(f), start=1) if r and line > 1]
            keep = set(log_spaced((int(r[0]) for _, r in recs), sizes_per_file))
            for line, r in recs:
                size = int(r[0])
                if size not in keep:
                    continue
                # size(B), count, type, time(ns), busbw(GB/s) out-of-place, time(ns), busbw(GB/s) in-place
                dtype = {"float": "fp32", "half": "fp16", "bfloat16": "bf16"}.get(r[2], r[2])
                rows.append({
                    "op": "all_reduce", "pass_": "comm", "dtype": dtype, "bytes": size,
                    "world_size": n, "ranks_per_node": n, "flops": 0.0,
                    "time_s": float(r[5]) * 1e-9, "outcome": "ok",
                    **UPSTREAM.provenance(MODULE, rel, hw, {"gpu": gpu_dir.name.upper(), "gpus": n, "nodes": 1,
                                                            "catalog_assumed": hw},
                                          {"framework": None, "benchmark": "nccl-tests style all-reduce LUT"}),
                    "run_id": run_id(UPSTREAM.folder, rel, line),
                    "upstream_ref": f"{rel}:{line}",
                    "busbw_gbps": float(r[6]),
                    "time_out_of_place_s": float(r[3]) * 1e-9,
                })
    return probes_frame(rows)


SECTION = """\
## Imported into perfpredict (perfpredict.importers.vtrain)

- `runs.parquet`: every row of ground_truth_single.csv (1440), one `runs` row each, built through ModelSpec, Cluster,
  Workload, Plan and flat_row. run_id = hash of `vtrain/ground_truth_single.csv:<line>`; `upstream_ref` names the line.
  - Model: `gpt-h<hidden>-l<layers>`, GPT-style as Megatron-DeepSpeed builds it: heads = kv_heads = attention heads,
    ffn = 4 x hidden, ungated GELU MLP, biases on QKV and MLP, input embedding tied to the output layer (Megatron's
    default). vocab = 51200: the GPT-2 vocabulary (50257) padded as Megatron pads it (a multiple of 128 x tp; 51200 is
    the tp=8 value, used for every row so one (hidden, layers) is one model). Learned position embeddings are not
    modelled.
  - Hardware: catalog `a100-sxm-80gb`. Assumption: upstream says "A100" only (40 vs 80 GB not stated); memory does not
    enter these rows' labels. One node, gpus_per_node = # GPUs of the row.
  - Workload: pretrain, fp16 (Megatron-DeepSpeed's usual --fp16 mixed precision; the CSV does not state the
    precision), seq_len and global batch as published. Plan: tp/pp/dp as published, micro_batch, grad_accum = global_batch / (dp x micro_batch) (integral on
    every row), recompute full, framework megatron, schedule 1f1b, ZeRO 0, no sequence parallelism.
  - Labels: step_time_s = iteration time (ms) / 1000, outcome ok, tokens_per_s = global_batch x seq_len / step_time_s,
    samples_per_s = global_batch / step_time_s. No memory was published: peak_memory_gib is null.
    `iteration_time_ms` keeps the published value.
- `probes.parquet`: the all-reduce tables trace/{a100,v100}/AR_GPU{n}_1M_1024M_LUT.csv, subsampled from 1024 sizes
  to about 64 log-spaced sizes per file (smallest and largest kept). op all_reduce, pass_ comm, dtype from the
  `type` column (float -> fp32), bytes = size(B), world_size = ranks_per_node = n (one node), time_s = in-place
  time (ns) x 1e-9; the in-place busbw and the out-of-place time are kept as `busbw_gbps` and `time_out_of_place_s`.
  Hardware: a100 -> catalog `a100-sxm-80gb`, v100 -> catalog `v100-sxm-32gb` (upstream does not state the variants;
  the fingerprint records `catalog_assumed`). Repeats and spread were not published (null).
- Provenance: source `vtrain`, collected_at = upstream commit date 2024-09-26, license MIT, software names
  Megatron-DeepSpeed and the upstream commit.
"""


def run(shared_root: Path, out_root: Path) -> dict[str, int]:
    src = Path(shared_root) / UPSTREAM.folder
    out = Path(out_root) / UPSTREAM.folder
    counts = write_outputs(out, {"runs": import_runs(src), "probes": import_probes(src)})
    write_source_md(src, out, SECTION)
    return counts
