"""Rank vLLM layouts for the generation phase and emit what runs the best (online DPO iterations: iteration.py).

Layouts of G devices: TP t (dividing the attention heads, within a node), PP p (at most the layers), replicas
G // (t x p) (every device used: an idle device never helps generation), max_num_seqs from the engine default and
a few common values. Each is predicted by predictor.generate; a layout whose weights + activations leave no KV space
or whose KV pool cannot hold one request of max_model_len is dropped with that reason, as vLLM refuses to start."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.formatting import merge_counts, num
from perfpredict.core.generate import GenLayout, GenScenario, GenWorkload
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.features.generate import default_max_num_seqs
from perfpredict.features.plans import powers_of_two
from perfpredict.predictor.ties import Tie, comparison, tied_top

MNS_CANDIDATES = (64, 256, 1024)
CPU_KV_SPACE_DEFAULT_GIB = 4  # vLLM's VLLM_CPU_KVCACHE_SPACE default, what features.generate sizes the pool with


@dataclass
class GenRanking:
    model: ModelSpec
    cluster: Cluster
    workload: GenWorkload
    table: pl.DataFrame                       # every candidate, fitting or not, best first
    rejections: Counter = field(default_factory=Counter)
    # The engine settings every layout was ranked with: --emit vllm writes these, not defaults.
    gpu_memory_utilization: float = 0.9
    kv_space_gib: float | None = None
    kv_cache_dtype: str = "auto"
    engine: str = "vllm"
    engine_version: str | None = None

    @property
    def fitting(self) -> pl.DataFrame:
        return self.table.filter(pl.col("fits"))


def enumerate_layouts(m: ModelSpec, cluster: Cluster, *, max_num_seqs: list[int] | None = None,
                      gpu_memory_utilization: float = 0.9, kv_space_gib: float | None = None,
                      max_model_len: int | None = None, prefix_caching: bool = True, kv_cache_dtype: str = "auto",
                      rej: Counter | None = None, engine: str = "vllm",
                      engine_version: str | None = None) -> list[GenLayout]:
    rej = rej if rej is not None else Counter()
    G = cluster.gpus
    out = []
    for tp in powers_of_two(min(G, cluster.gpus_per_node)):
        if m.heads % tp:
            rej[f"tp {tp} does not divide the {m.heads} attention heads"] += 1
            continue
        for pp in powers_of_two(G // tp):
            if pp > m.layers:
                rej["pp exceeds the layers"] += 1
                continue
            reps = G // (tp * pp)
            default = default_max_num_seqs(cluster.gpu, tp * pp)
            # MoE on GPUs: experts split by TP (vLLM's default) or whole experts per rank (--enable-expert-parallel).
            eps = (False, True) if m.is_moe and tp > 1 and not cluster.gpu.is_cpu else (False,)
            for mns in sorted(set(max_num_seqs or [*MNS_CANDIDATES, default])):
                for ep in eps:
                    out.append(GenLayout(tp=tp, pp=pp, replicas=reps, max_num_seqs=mns,
                                         gpu_memory_utilization=gpu_memory_utilization,
                                         kv_space_gib=kv_space_gib if cluster.gpu.is_cpu else None,
                                         max_model_len=max_model_len, prefix_caching=prefix_caching,
                                         kv_cache_dtype=kv_cache_dtype, engine=engine, engine_version=engine_version,
                                         expert_parallel=ep))
    return out


def rank_generate(*, model: ModelSpec, cluster: Cluster, workload: GenWorkload, max_num_seqs: list[int] | None = None,
                  gpu_memory_utilization: float = 0.9, kv_space_gib: float | None = None,
                  max_model_len: int | None = None, prefix_caching: bool = True, kv_cache_dtype: str = "auto",
                  gen_model=None, engine: str = "vllm", engine_version: str | None = None) -> GenRanking:
    from perfpredict.predictor.generate.predict import predict_generation

    rej: Counter = Counter()
    lays = enumerate_layouts(model, cluster, max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
                             kv_space_gib=kv_space_gib, max_model_len=max_model_len, prefix_caching=prefix_caching,
                             kv_cache_dtype=kv_cache_dtype, rej=rej, engine=engine, engine_version=engine_version)
    if not lays:
        raise PerfPredictError(f"no layout of {cluster.gpus} devices is legal for {model.name}: "
                               + "; ".join(rej))
    scs = [GenScenario(model=model, cluster=cluster, workload=workload, layout=lay) for lay in lays]
    df = predict_generation(scs, model=gen_model)
    # One line per layout and cause: the max_num_seqs variants of a layout differ only in their numbers.
    first: dict[str, str] = {}
    for r in df.filter(~pl.col("fits")).iter_rows(named=True):
        where, why = r["layout"].split(" mns")[0], r["reason"] or "does not fit"
        rej[first.setdefault(f"{where}: {_NUMBER.sub('#', why)}", f"{where}: {why}")] += 1
    df = df.sort(["fits", "output_tokens_per_s"], descending=[True, True], nulls_last=True)
    df = df.with_columns(rank=pl.int_range(1, df.height + 1))
    return GenRanking(model=model, cluster=cluster, workload=workload, table=df, rejections=rej,
                      gpu_memory_utilization=gpu_memory_utilization, kv_space_gib=kv_space_gib,
                      kv_cache_dtype=kv_cache_dtype, engine=engine, engine_version=engine_version)


# Numbers in a cause (activation GiB per max_num_seqs) do not make a rejection cause of their own.
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def headline(r: GenRanking) -> str:
    """What `generate rank` prints above its table: the workload, and how many layouts fit or why not."""
    w, f = r.workload, r.fitting
    rejected = merge_counts(r.rejections.most_common(4))
    basis = ""
    if "engine" in r.table.columns and r.table.height:
        row = (f if f.height else r.table).row(0, named=True)
        basis = f"\n{row['engine']} {row['engine_version']}: {row['basis']}"
    return (f"{r.model.name} generating on {r.cluster.gpus} x {r.cluster.gpu.name}: {w.prompts:,} prompts x "
            f"{w.samples_per_prompt} samples, {w.input_len} in / {w.output_len} out ({w.output_tokens:,} output "
            f"tokens)\n{r.table.height} layouts considered, {f.height} fit"
            + ("; rejected: " + "; ".join(rejected) if rejected else "") + basis)


def explain(r: GenRanking) -> str:
    f = r.fitting
    if f.height == 0:
        return "no layout fits: " + "; ".join(merge_counts(r.rejections.most_common(3)))
    a = f.row(0, named=True)
    tie = top_tie(r)
    lines = [f"#1 {a['layout']}: {num(a['output_tokens_per_s'])} output tok/s "
             f"({num(a['output_tokens_per_s_per_gpu'])} per device), KV {a['kv_capacity_tokens']:,} tokens per replica, "
             f"weights {a['weights_gib_per_rank']:.1f} GiB per device, decode batch ~{a['decode_batch']:.0f}"]
    bd = a.get("breakdown")
    if bd:
        lines.append(f"  its decode step: {_step_text(a)}; {a['decode_batch']:.0f} requests run at once, capped by "
                     f"{a['limited_by']}")
    # The same max_num_seqs at other TP / PP degrees: what they buy or cost.
    same = f.filter((pl.col("max_num_seqs") == a["max_num_seqs"]) & (pl.col("layout") != a["layout"]))
    for b in same.head(3).iter_rows(named=True):
        gain = 100 * (a['output_tokens_per_s'] / b['output_tokens_per_s'] - 1)
        if b.get("breakdown") and bd:
            why = _why_silicon(a, b)
        elif b["decode_batch"] > a["decode_batch"] * 1.05:
            why = "its KV cache holds more concurrent requests, yet its devices do less each"
        elif b["decode_batch"] < a["decode_batch"] * 0.95:
            why = (f"a replica's KV space starves its decode batch ({b['decode_batch']:.0f} vs "
                   f"{a['decode_batch']:.0f})")
        elif b["tp"] > a["tp"]:
            why = "per-device throughput falls as TP rises (two all-reduces per layer, smaller GEMMs)"
        elif b["pp"] != a["pp"]:
            why = "fewer sequences per pipeline micro-batch or more stage sends per token"
        else:
            why = "smaller GEMMs per device at the same batch"
        lines.append(f"vs {b['layout']}: {num(b['output_tokens_per_s'])} tok/s "
                     f"({comparison(tie, b['layout'], gain)}); "
                     f"KV {b['kv_capacity_tokens']:,} per replica, batch ~{b['decode_batch']:.0f}: {why}")
    lines.append(tie.sentence("output tok/s"))
    if r.rejections:
        lines.append("not run: " + "; ".join(merge_counts(r.rejections.most_common(4))))
    return "\n".join(lines)


def _step_text(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    parts = [("GEMMs", b["gemm"]), ("attention", b["attention"]), ("MoE", b["moe"]),
             (f"all-reduce (2 per layer, TP{r['tp']})", b["all_reduce"]), ("LM head", b["lm_head"]),
             (f"PP sends + host round trip ({r['pp']} stages)", b["pp_send"]), ("prefill chunks mixed in", b["prefill_mixed_in"])]
    body = ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in parts if v > 5e-5)
    return f"{1e3 * r['tpot_s']:.1f} ms per output token ({body})"


def _why_silicon(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What the composed steps say separates b from #1: the pipeline's serial stages, a KV-limited batch, or the
    per-layer all-reduces."""
    ba, bb = a["breakdown"], b["breakdown"]
    per_gpu = f"{num(b['output_tokens_per_s_per_gpu'])} vs {num(a['output_tokens_per_s_per_gpu'])} tok/s per device"
    if b["pp"] > a["pp"]:
        return (f"PP{b['pp']} bubble: a token crosses {b['pp']} stages one after another (micro-batches of "
                f"~{b['decode_batch'] / b['pp']:.0f}, the slowest stage with the LM head sets the pace), "
                f"{1e3 * b['tpot_s']:.1f} ms per token at batch {b['decode_batch']:.0f}: {per_gpu}")
    if b["decode_batch"] < a["decode_batch"] * 0.95 and b["limited_by"] == "KV cache":
        return (f"KV-limited batch: its KV cache holds ~{b['decode_batch']:.0f} running requests per replica "
                f"(#1 runs {a['decode_batch']:.0f}): {per_gpu}")
    if b["tp"] > a["tp"]:
        return (f"two all-reduces per layer over TP{b['tp']}: {1e3 * bb['all_reduce']:.1f} ms of its "
                f"{1e3 * b['tpot_s']:.1f} ms step (#1: {1e3 * ba['all_reduce']:.1f} ms): {per_gpu}")
    if b["pp"] < a["pp"]:
        return (f"without #1's {a['pp']} stages a replica holds less KV per GPU or pays TP's all-reduces: "
                f"{1e3 * b['tpot_s']:.1f} ms per token at batch {b['decode_batch']:.0f}")
    return f"{1e3 * b['tpot_s']:.1f} ms per token at batch {b['decode_batch']:.0f}: {per_gpu}"


def top_tie(r: GenRanking) -> Tie:
    """The layouts tied with #1 within their 90 % throughput intervals, and the knobs that differ among them."""
    return tied_top(r.fitting, value="output_tokens_per_s", lo="output_tokens_per_s_interval", label="layout",
                    knobs=("tp", "pp", "replicas", "max_num_seqs"))


# --- emit ---------------------------------------------------------------------------------------------------------
def emit_vllm(r: GenRanking, *, model_id: str | None = None, out_dir: Path | str, rank_no: int = 1) -> list[Path]:
    """`vllm serve` arguments, an offline `LLM(...)` script splitting the prompts over replicas, and a launch
    script starting one server per replica on disjoint devices, with the engine settings the layout was ranked
    with (gpu_memory_utilization, or the CPU KV space).

    model_id: what vLLM loads. None or the model's catalog name becomes the catalog entry's Hugging Face id, since
    vLLM cannot load a perfpredict catalog name; anything else (a config path, a user's id) is written as given."""
    from perfpredict.core.catalog import hf_id

    if model_id is None or model_id == r.model.name:
        model_id = hf_id(r.model) or model_id or r.model.name
    f = r.fitting
    if f.height < rank_no:
        raise PerfPredictError("nothing fits, so there is no layout to emit")
    row = f.row(rank_no - 1, named=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = r.workload
    cpu = r.cluster.gpu.is_cpu
    per = row["tp"] * row["pp"]
    mml = w.input_len + w.output_len
    args = {"tensor_parallel_size": row["tp"], "pipeline_parallel_size": row["pp"],
            "max_num_seqs": row["max_num_seqs"], "max_model_len": mml, "enable_prefix_caching": True,
            "dtype": "bfloat16" if w.precision == "bf16" else w.precision}
    if not cpu:
        args["gpu_memory_utilization"] = r.gpu_memory_utilization
    if r.kv_cache_dtype != "auto":
        args["kv_cache_dtype"] = r.kv_cache_dtype
    if row.get("expert_parallel"):
        args["enable_expert_parallel"] = True
    cli = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in args.items() if not isinstance(v, bool))
    if row.get("expert_parallel"):
        cli += " --enable-expert-parallel"
    lines = ["#!/usr/bin/env bash", f"# perfpredict: {row['layout']} for {r.model.name} on {r.cluster.gpus} x "
             f"{r.cluster.gpu.name}; predicted {num(row['output_tokens_per_s'])} output tok/s in all", "set -euo pipefail",
             'MODEL="${MODEL:-' + model_id + '}"']
    for i in range(row["replicas"]):
        devs = list(range(i * per, (i + 1) * per))
        kv = r.kv_space_gib or CPU_KV_SPACE_DEFAULT_GIB
        env = (f'VLLM_CPU_OMP_THREADS_BIND="{"|".join(map(str, devs))}" VLLM_CPU_KVCACHE_SPACE={kv:g}'
               if cpu else f"CUDA_VISIBLE_DEVICES={','.join(map(str, devs))}")
        lines.append(f'{env} vllm serve "$MODEL" {cli} --port {8000 + i} > replica{i}.log 2>&1 &')
    lines += ["wait"]
    launch = out / "launch_replicas.sh"
    launch.write_text("\n".join(lines) + "\n")
    launch.chmod(0o755)
    script = out / "generate_offline.py"
    script.write_text(_OFFLINE.format(args=json.dumps(args), replicas=row["replicas"], per=per, model=model_id,
                                      n=w.samples_per_prompt, out=w.output_len, cpu=cpu))
    spec = out / "vllm_layout.json"
    spec.write_text(json.dumps({"layout": row["layout"], "replicas": row["replicas"], "llm_args": args,
                                "serve_args": cli, "prediction": {k: row[k] for k in (
                                    "output_tokens_per_s", "total_tokens_per_s", "time_to_generate_s",
                                    "kv_capacity_tokens")}}, indent=1))
    return [launch, script, spec]


_OFFLINE = '''"""Offline generation with {replicas} vLLM replica(s) ({per} device(s) each), written by perfpredict.

python generate_offline.py prompts.jsonl out.jsonl   (one {{"prompt": ...}} per line)"""
import json
import multiprocessing as mp
import os
import sys

LLM_ARGS = {args}
REPLICAS, PER, CPU = {replicas}, {per}, {cpu}


def worker(i, prompts, out_path):
    devs = ",".join(str(d) for d in range(i * PER, (i + 1) * PER))
    if CPU:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = devs.replace(",", "|")
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = devs
    from vllm import LLM, SamplingParams

    llm = LLM(model=os.environ.get("MODEL", "{model}"), **LLM_ARGS)
    outs = llm.generate(prompts, SamplingParams(n={n}, max_tokens={out}, temperature=1.0))
    with open(f"{{out_path}}.{{i}}", "w") as f:
        for p, o in zip(prompts, outs):
            f.write(json.dumps({{"prompt": p, "responses": [c.text for c in o.outputs]}}) + "\\n")


if __name__ == "__main__":
    prompts = [json.loads(line)["prompt"] for line in open(sys.argv[1])]
    procs = [mp.get_context("spawn").Process(target=worker, args=(i, prompts[i::REPLICAS], sys.argv[2]))
             for i in range(REPLICAS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
'''


def to_jsonable(df: pl.DataFrame) -> list[dict[str, Any]]:
    return json.loads(json.dumps(df.to_dicts(), default=str))
