"""Public-data importers (perfpredict.importers) and the committed datasets/public files they produce.

The importer tests read the upstream copies under shared/data/public (skipped where that folder is absent); the
checks of the committed parquet files run everywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from perfpredict.core.dataset import PROVENANCE, SCHEMA_VERSION, probe_schema
from perfpredict.importers import IMPORTERS, TRANSCRIBED, aiconfigurator, azure, import_public, playbook, vidur, vtrain
from perfpredict.importers.__main__ import main
from perfpredict.importers.common import COMMAND_PREFIX, log_spaced, run_id, runs_schema

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "datasets" / "public"
SHARED = Path(os.environ.get("PERFPREDICT_SHARED_PUBLIC", REPO.parent / "shared" / "data" / "public"))
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (upstream copies) not present")


def _row(df: pl.DataFrame, ref: str) -> dict:
    hit = df.filter(pl.col("upstream_ref") == ref)
    assert hit.height >= 1, ref
    return hit.row(0, named=True)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    out = tmp_path_factory.mktemp("public")
    return out, import_public(shared_root=SHARED, out_root=out)


# --- helpers -----------------------------------------------------------------------------------------------------
def test_log_spaced_keeps_ends_and_count():
    vals = list(range(1, 1025))
    kept = log_spaced(vals, 64)
    assert len(kept) == 64 and kept[0] == 1 and kept[-1] == 1024
    assert log_spaced([3, 1, 2], 10) == [1, 2, 3]


def test_run_id_is_stable_and_distinct():
    assert run_id("vtrain", "a.csv", 2) == run_id("vtrain", "a.csv", 2)
    assert run_id("vtrain", "a.csv", 2) != run_id("vtrain", "a.csv", 3)
    assert run_id("vidur", "a.csv", 2, "add") != run_id("vidur", "a.csv", 2, "mlp_act")


# --- vtrain ------------------------------------------------------------------------------------------------------
@needs_shared
def test_vtrain_runs_match_csv():
    df = vtrain.import_runs(SHARED / "vtrain")
    assert df.height == 1440
    assert df["run_id"].n_unique() == 1440
    # ground_truth_single.csv line 2: 2,16,8,1024,16,24,1024,1,1,2,372.160408
    r = _row(df, "ground_truth_single.csv:2")
    assert (r["c_gpus"], r["w_global_batch"], r["p_micro_batch"], r["m_hidden"], r["m_heads"], r["m_layers"]) == \
        (2, 16, 8, 1024, 16, 24)
    assert (r["w_seq_len"], r["p_tp"], r["p_dp"], r["p_pp"], r["p_grad_accum"]) == (1024, 1, 1, 2, 2)
    assert r["step_time_s"] == pytest.approx(0.372160408)
    assert r["m_name"] == "gpt-h1024-l24" and r["m_vocab"] == 51200 and r["m_ffn"] == 4096 and not r["m_gated"]
    assert (r["p_recompute"], r["p_framework"], r["p_schedule"], r["p_zero"]) == ("full", "megatron", "1f1b", 0)
    assert r["g_name"] == "a100-sxm-80gb" and r["w_precision"] == "fp16" and r["outcome"] == "ok"
    assert r["peak_memory_gib"] is None
    # line 5: 8,8,2,2048,16,20,1024,4,1,2,160.6027
    r = _row(df, "ground_truth_single.csv:5")
    assert (r["p_tp"], r["p_dp"], r["p_pp"], r["p_grad_accum"], r["m_name"]) == (4, 1, 2, 4, "gpt-h2048-l20")
    assert r["step_time_s"] == pytest.approx(0.1606027)


@needs_shared
def test_vtrain_allreduce_probes():
    df = vtrain.import_probes(SHARED / "vtrain")
    assert df.height == 14 * 64
    assert set(df["hardware"]) == {"a100-sxm-80gb", "v100-sxm-32gb"}
    # trace/a100/AR_GPU2_1M_1024M_LUT.csv line 2: 1048576,262144,float,44210,23.72,45100,23.25 (in-place 45100 ns)
    r = _row(df, "trace/a100/AR_GPU2_1M_1024M_LUT.csv:2")
    assert (r["op"], r["bytes"], r["world_size"], r["ranks_per_node"], r["dtype"]) == \
        ("all_reduce", 1048576, 2, 2, "fp32")
    assert r["time_s"] == pytest.approx(45100e-9)
    assert r["busbw_gbps"] == pytest.approx(23.25)
    # largest size (1024 MiB) is always kept
    assert df.filter(pl.col("world_size") == 8)["bytes"].max() == 1024 * 2**20


# --- ultrascale playbook -----------------------------------------------------------------------------------------
@needs_shared
def test_playbook_runs_match_csv():
    df = playbook.import_runs(SHARED / "ultrascale_playbook")
    assert df.height == 1641
    counts = dict(df.group_by("outcome").len().iter_rows())
    assert counts == {"ok": 1027, "failed_unknown": 547, "error": 67}
    # benchmarks_1B_8B.csv line 2: 1B,1,8,2,16,256,8,1,1,0,39.2,40150,321200,50.2
    r = _row(df, "benchmarks_1B_8B.csv:2")
    assert (r["m_layers"], r["m_hidden"], r["m_ffn"], r["m_vocab"], r["m_tied"]) == (16, 2048, 8192, 131072, False)
    assert (r["p_dp"], r["p_tp"], r["p_pp"], r["p_micro_batch"], r["p_grad_accum"], r["p_zero"]) == (8, 1, 1, 2, 16, 0)
    assert r["tokens_per_s"] == 321200 and r["step_time_s"] == pytest.approx(256 * 4096 / 321200)
    assert r["peak_memory_gib"] == pytest.approx(50.2e9 / 2**30) and r["memory_kind"] == "reported"
    assert (r["p_framework"], r["w_precision"], r["w_seq_len"], r["g_name"]) == \
        ("nanotron", "bf16", 4096, "h100-sxm-80gb")
    # line 27: 1B,1,8,2,4,256,2,4,1,1,24.7,21650,173197,29.0: grad_acc 4 ran (the batch it implies is 2*4*2 = 16,
    # not the published gbs 256): its MFU against line 11 (the same plan at grad_acc 64, 42.3) is the 1F1B bubble
    # ratio (4/7) / (64/67) = 0.60 (24.7 / 42.3 = 0.58)
    r = _row(df, "benchmarks_1B_8B.csv:27")
    assert (r["p_grad_accum"], r["w_global_batch"], r["gbs_published"]) == (4, 16, 256)
    assert r["step_time_s"] == pytest.approx(16 * 4096 / 173197) and "implies" in r["note"]
    r11 = _row(df, "benchmarks_1B_8B.csv:11")
    assert r["mfu_pct"] / r11["mfu_pct"] == pytest.approx((4 / 7) / (64 / 67), rel=0.03)
    # tp>1 gets sequence parallelism (nanotron REDUCE_SCATTER); line 820 is 8B tp8 dp1 zero0 mbs1, 24.4 GB
    r = _row(df, "benchmarks_1B_8B.csv:820")
    assert r["m_layers"] == 32 and r["p_tp"] == 8 and r["p_sp"] and r["gpu_mem_gb"] == 24.4
    # line 61 (1B, dp8, mbs2, zero0) has nan metrics, but line 2 is the same configuration and ran at 50.2 GB
    r = _row(df, "benchmarks_1B_8B.csv:61")
    assert r["outcome"] == "error" and r["step_time_s"] is None and "benchmarks_1B_8B.csv:2 (50.2 GB)" in r["error"]
    # nan, no twin that ran: the source files it as "crashed/oom" without a cause, so not an OOM label
    r = _row(df, "benchmarks_1B_8B.csv:141")
    assert r["outcome"] == "failed_unknown" and "cause not given" in r["error"]
    evidence = dict(df.filter(pl.col("outcome") == "failed_unknown").group_by("oom_evidence").len().iter_rows())
    assert evidence == {"siblings_over_gpu": 208, "larger_micro_batch_ran": 12, None: 327}
    assert df.filter(pl.col("outcome") != "failed_unknown")["oom_evidence"].null_count() == 1641 - 547
    bad = df.filter(pl.col("outcome") == "error")
    assert bad.height == 67 and (bad["p_pp"] > bad["m_layers"]).sum() == 58
    # Identity = the published plan: 10 configurations published twice, only one of them with metrics on both lines.
    assert len(playbook.published_twice(SHARED / "ultrascale_playbook")) == 20
    assert [(a, b, round(x, 2)) for a, b, x in playbook.twin_spread(SHARED / "ultrascale_playbook")] == \
        [(895, 902, 4.68)]


@needs_shared
def test_playbook_dp_scaling_rows_are_benchmark_rows():
    matches = playbook.match_dp_scaling(SHARED / "ultrascale_playbook")
    assert [b for _, b in matches] == [2, 69, 189, 314, 465, 627]


@needs_shared
def test_playbook_collective_probes():
    df = playbook.import_probes(SHARED / "ultrascale_playbook")
    assert df.height == 21 and set(df["op"]) == {"all_reduce", "all_gather", "reduce_scatter"}
    # nccl_busbw_vs_nodes_256MB.csv line 2: AllReduce,1,8,256MB,435.9668,...
    r = _row(df, "nccl_busbw_vs_nodes_256MB.csv:2")
    assert (r["bytes"], r["world_size"], r["ranks_per_node"]) == (2**28, 8, 8)
    assert r["time_s"] == pytest.approx(2**28 * 2 * 7 / 8 / 435.9668e9)
    # line 9: AllGather,1,8,256MB,249.8488: factor (n-1)/n
    r = _row(df, "nccl_busbw_vs_nodes_256MB.csv:9")
    assert r["op"] == "all_gather" and r["time_s"] == pytest.approx(2**28 * 7 / 8 / 249.8488e9)


# --- vidur -------------------------------------------------------------------------------------------------------
@needs_shared
def test_vidur_compute_probes():
    df = vidur.import_compute(SHARED / "vidur")
    ref = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv:2"
    rows = {r["upstream_op"]: r for r in df.filter(pl.col("upstream_ref") == ref).iter_rows(named=True)}
    # line 2: num_tokens 4096, tp 1; attn_pre_proj median 1.911 ms, mlp_up_proj 3.3655, add 0.055
    qkv = rows["attn_pre_proj"]
    assert (qkv["op"], qkv["m"], qkv["k"], qkv["n"], qkv["dtype"], qkv["pass_"]) == \
        ("gemm", 4096, 4096, 3 * 4096, "fp16", "fwd")
    assert qkv["time_s"] == pytest.approx(1.911e-3)
    up = rows["mlp_up_proj"]
    assert (up["k"], up["n"]) == (4096, 2 * 11008) and up["time_s"] == pytest.approx(3.3655e-3)
    assert (rows["mlp_down_proj"]["k"], rows["mlp_down_proj"]["n"]) == (11008, 4096)
    assert rows["mlp_act"]["op"] == "swiglu" and rows["mlp_act"]["numel"] == 4096 * 11008
    assert rows["add"]["op"] == "add" and rows["add"]["time_s"] == pytest.approx(0.055e-3)
    assert rows["input_layernorm"]["op"] == "rmsnorm"
    # GQA and TP: Llama-3-70B (64 heads, 8 kv heads, 8192) at tp 8: QKV n = (64 + 16) * 128 / 8
    l3 = df.filter((pl.col("model") == "meta-llama/Meta-Llama-3-70B") & (pl.col("tp") == 8)
                   & (pl.col("upstream_op") == "attn_pre_proj"))
    assert set(l3["n"]) == {1280} and set(l3["k"]) == {8192}
    phi = df.filter(pl.col("model") == "microsoft/phi-2")
    assert {"layernorm", "gelu"} <= set(phi["op"])
    per_file = df.filter(pl.col("op") == "gemm").group_by("hardware", "model", "tp").agg(pl.col("m").n_unique())
    assert per_file["m"].min() >= 40 and per_file["m"].max() <= 45


@needs_shared
def test_vidur_network_probes():
    df = vidur.import_network(SHARED / "vidur")
    # a100_dgx/all_reduce.csv line 2: median 0.043 ms, rank 0, 2 workers, 2048 bytes, 1 device per node
    r = _row(df, "data/profiling/network/a100_dgx/all_reduce.csv:2")
    assert (r["op"], r["bytes"], r["world_size"], r["ranks_per_node"], r["hardware"]) == \
        ("all_reduce", 2048, 2, 1, "a100-sxm-80gb")
    assert r["time_s"] == pytest.approx(0.043e-3)
    ar = df.filter((pl.col("op") == "all_reduce") & (pl.col("node_type") == "a100_dgx"))
    assert ar.height == 7 * 993  # every size kept for all_reduce
    assert set(df.filter(pl.col("node_type") == "a100_pairwise_nvlink")["hardware"]) == {"a100-pcie-80gb"}


# --- azure -------------------------------------------------------------------------------------------------------
@needs_shared
def test_azure_probes():
    df = azure.import_probes(SHARED / "azure_ai_benchmarking")
    counts = dict(df.group_by("op").len().iter_rows())
    assert counts == {"gemm": 26, "all_reduce": 72, "attention": 6, "copy": 3}
    # gemm_cublaslt.csv line 2: ND_A100_v4,1024,1024,1024,119.4,GEMM CuBLASLt,fp16
    r = _row(df, "gemm_cublaslt.csv:2")
    assert r["hardware"] == "a100-sxm-80gb" and r["dtype"] == "fp16"
    assert r["time_s"] == pytest.approx(2 * 1024**3 / 119.4e12)
    # nccl_allreduce_busbw_1node.csv line 8: ND_A100_v4,65K,66560,2.70 -> 2^16 bytes
    r = _row(df, "nccl_allreduce_busbw_1node.csv:8")
    assert r["bytes"] == 65536 and r["time_s"] == pytest.approx(65536 * 2 * 7 / 8 / 2.70e9)
    # attention_tflops.csv line 3: ND_A100_v4,Flash Attention 2.0,179.5,64,2,8192 -> 32 heads
    r = _row(df, "attention_tflops.csv:3")
    assert (r["heads"], r["head_dim"], r["attn_impl"], r["causal"]) == (32, 64, "flash2", False)
    assert r["time_s"] == pytest.approx(4 * 2 * 8192**2 * 2048 / 179.5e12)  # non-causal: no halving
    att = df.filter(pl.col("op") == "attention")
    assert dict(att.group_by("attn_impl").len().iter_rows()) == {"flash2": 3, "math": 3}
    assert att["causal"].to_list() == [False] * 6
    assert df.filter(pl.col("op") != "attention").select("causal", "attn_impl").null_count().row(0) == (101, 101)
    sw = json.loads(_row(df, "gemm_cublaslt.csv:10")["software"])
    assert sw["nccl"] == "2.18.5" and sw["cuda"] == "12.6"


# --- aiconfigurator ----------------------------------------------------------------------------------------------
AIC_COMMITTED = COMMITTED / "aiconfigurator"


def _aic(table: str) -> pl.DataFrame:
    return pl.read_parquet(AIC_COMMITTED / f"probes_{table}.parquet")


def test_aiconfigurator_nccl_units_match_the_h100_allreduce_check():
    """SOURCE.md's check: the H100 8-GPU NCCL half all-reduce at message_size 268,435,456 takes 2.11 ms. That size
    is an element count (upstream collector/network/collect_nccl.py logs `size // bytes_per_element`), so the row
    moves 512 MiB: bus bandwidth 2 x 7/8 x 512 MiB / 2.11 ms = 445 GB/s, under the 450 GB/s NVLink figure."""
    df = _aic("nccl").filter((pl.col("hardware") == "h100-sxm-80gb") & (pl.col("op") == "all_reduce")
                             & (pl.col("world_size") == 8) & (pl.col("dtype") == "fp16")
                             & (pl.col("message_size") == 268435456))
    assert df.height == 1
    r = df.row(0, named=True)
    assert r["time_s"] == pytest.approx(2.11106e-3) and r["latency"] == pytest.approx(2.11106)
    assert r["bytes"] == 512 * 2**20 and r["ranks_per_node"] == 8
    busbw = r["bytes"] * 2 * 7 / 8 / r["time_s"] / 1e9
    assert 400 < busbw < 450
    # int8 elements are bytes: the same bytes at int8 (no NVLS reduction) run at ring speed, slower than half.
    i8 = _aic("nccl").filter((pl.col("hardware") == "h100-sxm-80gb") & (pl.col("op") == "all_reduce")
                             & (pl.col("world_size") == 8) & (pl.col("dtype") == "int8")
                             & (pl.col("bytes") == 512 * 2**20)).row(0, named=True)
    assert i8["message_size"] == 512 * 2**20 and i8["time_s"] > r["time_s"]


def test_aiconfigurator_tables_cover_every_gpu_and_family():
    gpus = set(aiconfigurator.GPUS.values())
    for table in aiconfigurator.TABLES:
        df = _aic(table)
        assert set(df["hardware"]) == gpus, table
        assert df["source"].unique().to_list() == ["aiconfigurator"]
        assert (df["time_s"] == df["latency"] / 1000).all()
        assert df["runtime"].null_count() == 0 and df["runtime_version"].null_count() == 0
    g = _aic("gemm")
    assert set(g["dtype"]) == {"bf16", "fp8"} and set(range(1, 17)) <= set(g["m"])
    assert (g["flops"] == 2.0 * g["m"] * g["n"] * g["k"]).all()
    dec = _aic("generation_attention")
    assert set(dec["op"]) == {"decode_attention"} and (dec["seq_len"] == dec["step"]).all()
    ctx = _aic("context_attention")
    assert set(ctx["op"]) == {"attention"} and ctx["causal"].all() and (ctx["step"] == 0).all()
    assert set(_aic("nccl")["op"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert set(_aic("custom_allreduce")["op"]) == {"custom_all_reduce", "custom_all_reduce_eager"}
    # runtime and version come from collection_meta.yaml: vLLM 0.24.0 on the H100, NCCL 2.29.2 on its comm
    assert set(g.filter(pl.col("hardware") == "h100-sxm-80gb")["runtime_version"]) == {"0.24.0"}
    assert set(_aic("nccl").filter(pl.col("hardware") == "h100-sxm-80gb")["runtime_version"]) == {"2.29.2"}


@needs_shared
def test_aiconfigurator_rows_match_upstream():
    """A row of each imported table equals its upstream parquet row (upstream_ref = file:row)."""
    for table in aiconfigurator.TABLES:
        df = _aic(table)
        r = df.row(df.height // 2, named=True)
        path, row = r["upstream_ref"].rsplit(":", 1)
        up = pl.read_parquet(SHARED / "aiconfigurator" / path).row(int(row), named=True)
        assert up["latency"] == r["latency"] and r["time_s"] == pytest.approx(up["latency"] / 1000)
        for key in ("m", "n", "k", "num_gpus", "message_size", "batch_size", "num_tokens", "step"):
            if key in up:
                assert up[key] == r[key], (table, key)


def test_aiconfigurator_block_fp8_tables_sit_outside_the_probes():
    """fp8_block experts ship in a file of their own (train reads probes*.parquet, whose dtypes have no block-FP8
    peak), with the probes' columns and dtype `fp8_block`."""
    for table in aiconfigurator.BLOCK_FP8_TABLES:
        df = pl.read_parquet(AIC_COMMITTED / f"fp8_block_{table}.parquet")
        assert set(df["dtype"]) == {"fp8_block"} and {"h100-sxm-80gb", "h200-sxm-141gb", "b200"} <= set(df["hardware"])
        assert set(_aic(table)["dtype"]) == {"bf16", "fp8"}
        assert (df["time_s"] == df["latency"] / 1000).all()


@needs_shared
def test_aiconfigurator_block_fp8_rows_match_upstream():
    for table in aiconfigurator.BLOCK_FP8_TABLES:
        df = pl.read_parquet(AIC_COMMITTED / f"fp8_block_{table}.parquet")
        r = df.row(df.height // 3, named=True)
        path, row = r["upstream_ref"].rsplit(":", 1)
        up = pl.read_parquet(SHARED / "aiconfigurator" / path).row(int(row), named=True)
        assert up["latency"] == r["latency"] and up["moe_dtype"] == "fp8_block"
        for key in ("num_tokens", "hidden_size", "inter_size", "num_experts", "moe_tp_size", "moe_ep_size"):
            if key in up:
                assert up[key] == r[key], (table, key)


# --- the whole run and the committed files -----------------------------------------------------------------------
@needs_shared
def test_import_public_counts_and_committed_files_are_current(imported):
    out, counts = imported
    assert counts["vtrain/runs.parquet"] == 1440
    assert counts["ultrascale_playbook/runs.parquet"] == 1641
    assert set(counts) == {p.relative_to(out).as_posix() for p in out.rglob("*.parquet")}
    for name, n in counts.items():
        committed = COMMITTED / name
        assert committed.exists(), f"{committed} missing: rerun python -m perfpredict.importers"
        fresh, old = pl.read_parquet(out / name), pl.read_parquet(committed)
        assert old.height == n and fresh.equals(old), f"{committed} is stale: rerun the importers"
    for folder in IMPORTERS:
        assert (out / folder / "SOURCE.md").read_text() == (COMMITTED / folder / "SOURCE.md").read_text()


@needs_shared
def test_cli_writes_one_source(tmp_path, capsys):
    assert main(["--shared", str(SHARED), "--out", str(tmp_path), "--only", "azure_ai_benchmarking"]) == 0
    assert (tmp_path / "azure_ai_benchmarking" / "probes.parquet").exists()
    assert (tmp_path / "azure_ai_benchmarking" / "LICENSE").exists()
    assert "107" in capsys.readouterr().out


COMMITTED_FILES = sorted(COMMITTED.rglob("*.parquet")) if COMMITTED.is_dir() else []


def test_committed_files_exist_and_are_small():
    # transcribed sources (tests/test_finetune_sources.py) are committed with their transcription, not a LICENSE copy
    assert {p.parent.name for p in COMMITTED_FILES} == set(IMPORTERS) | set(TRANSCRIBED)
    total = sum(p.stat().st_size for p in COMMITTED.rglob("*") if p.is_file())
    assert total < 8 * 2**20
    for folder in IMPORTERS:
        assert (COMMITTED / folder / "SOURCE.md").read_text().count("## Imported into perfpredict") == 1
        assert (COMMITTED / folder / "LICENSE").exists()


def _fit_outcomes(path) -> bool:
    """A transcribed source of ran / out-of-memory outcomes without timings (importers.oom_reports)."""
    mod = TRANSCRIBED.get(path.parent.name)
    return bool(mod and mod.SPEC.fit_outcomes)


@pytest.mark.parametrize("path", COMMITTED_FILES, ids=lambda p: p.relative_to(COMMITTED).as_posix())
def test_committed_parquet_schema_and_provenance(path):
    df = pl.read_parquet(path)
    assert df.height > 0
    schema = runs_schema() if path.name.startswith("runs") else probe_schema()
    for col, dtype in schema.items():
        assert col in df.columns, f"{path.name} lacks {col}"
        assert df.schema[col] == dtype, f"{path.name}: {col} is {df.schema[col]}, schema says {dtype}"
    assert list(df.columns[:len(schema)]) == list(schema)
    for col in PROVENANCE:
        assert df[col].null_count() == 0, f"{path.name}: null {col}"
    assert set(df["source"]) == {path.parent.name}
    assert set(df["schema_version"]) == {SCHEMA_VERSION}
    assert df["command"].str.starts_with(f"{COMMAND_PREFIX}.").all()
    assert df["run_id"].n_unique() == df.height
    timed = df.filter(pl.col("outcome") == "ok")["time_s" if "time_s" in schema else "step_time_s"].drop_nulls()
    assert (timed.is_empty() and _fit_outcomes(path)) or timed.min() > 0
    for fp in df["hardware_fingerprint"].unique():
        json.loads(fp)


@pytest.mark.parametrize("path", [p for p in COMMITTED_FILES if p.name.startswith("runs")],
                         ids=lambda p: p.relative_to(COMMITTED).as_posix())
def test_committed_runs_throughput_identity(path):
    df = pl.read_parquet(path)
    ok = df.filter(pl.col("outcome") == "ok")
    # a source may publish a memory without a speed (ms-swift's liger/sft.sh): such ok rows carry a memory label;
    # a fit-outcome source (oom_reports) has rows whose only measurement is that they ran
    if _fit_outcomes(path):
        return
    assert ok.filter(pl.col("step_time_s").is_null() & pl.col("peak_memory_gib").is_null()).height == 0
    ok = ok.filter(pl.col("step_time_s").is_not_null())
    assert ok.height > 0
    expect = ok["w_global_batch"] * ok["w_seqs_per_sample"] * ok["w_seq_len"] / ok["step_time_s"]
    assert ((ok["tokens_per_s"] - expect).abs() / expect).max() < 1e-9
    assert (ok["samples_per_s"] * ok["step_time_s"] - ok["w_global_batch"]).abs().max() < 1e-6
    failed = df.filter(pl.col("outcome") != "ok")
    assert failed["step_time_s"].null_count() == failed.height and failed["error"].null_count() == 0
