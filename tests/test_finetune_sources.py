"""Published GPU fine-tuning sources transcribed by hand (issue 19 item 2): ms-swift's example headers and NeMo
AutoModel's performance summary, their importer (perfpredict.importers.transcribed) and their held-out scoring
(`perfpredict evaluate --held-out-source`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from perfpredict.cli import app
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.scenario import Scenario
from perfpredict.importers import (
    TRANSCRIBED,
    alignment_handbook,
    hf_blog_ds_fsdp,
    import_public,
    liger_examples,
    msswift,
    nemo_automodel,
)
from perfpredict.importers.transcribed import CSV_NAME, read_rows, scenario_of
from perfpredict.train.evaluate import held_out_sources

COMMITTED = Path(__file__).resolve().parents[1] / "datasets" / "public"
SOURCES = tuple(TRANSCRIBED)


@pytest.fixture(scope="module")
def reimported(tmp_path_factory):
    out = tmp_path_factory.mktemp("public")
    counts = import_public(shared_root=out, out_root=out, only=list(SOURCES))
    return out, counts


def _row(folder: str, row_id: str) -> dict:
    df = pl.read_parquet(COMMITTED / folder / "runs.parquet").filter(pl.col("transcribed_row") == row_id)
    assert df.height == 1, row_id
    return df.row(0, named=True)


def test_reimport_reproduces_the_committed_files(reimported):
    out, counts = reimported
    assert counts == {"msswift_examples/runs.parquet": 9, "nemo_automodel/runs.parquet": 1,
                      "liger_hf_examples/runs.parquet": 10, "alignment_handbook/runs.parquet": 4,
                      "hf_blog_ds_fsdp/runs.parquet": 2, "oom_reports/runs.parquet": 15}
    for folder in SOURCES:
        fresh = pl.read_parquet(out / folder / "runs.parquet")
        assert fresh.equals(pl.read_parquet(COMMITTED / folder / "runs.parquet")), f"{folder}: rerun the importer"
        assert (out / folder / "SOURCE.md").read_text() == (COMMITTED / folder / "SOURCE.md").read_text()


@pytest.mark.parametrize("folder", SOURCES)
def test_source_md_names_upstream_license_and_every_row(folder):
    text = (COMMITTED / folder / "SOURCE.md").read_text()
    mod = TRANSCRIBED[folder]
    assert mod.UPSTREAM.repo in text and mod.UPSTREAM.commit in text and mod.UPSTREAM.license in text
    for _, r in read_rows(COMMITTED / folder):
        assert f"`{r['row_id']}`" in text
        if r["status"] == "skip":
            assert r["skip_reason"] in text.replace("\\|", "|")


@pytest.mark.parametrize("folder", SOURCES)
def test_every_imported_row_is_a_valid_scenario_with_provenance(folder):
    df = pl.read_parquet(COMMITTED / folder / "runs.parquet")
    commits = {r["upstream_commit"][:12] for _, r in read_rows(COMMITTED / folder)}
    # A fit-outcome source (oom_reports) holds out-of-memory rows and rows whose only measurement is that they ran.
    outcomes_only = TRANSCRIBED[folder].SPEC.fit_outcomes
    for r in df.iter_rows(named=True):
        assert r["source"] == folder and r["outcome"] in (("ok", "oom") if outcomes_only else ("ok",))
        assert r["upstream_ref"].rsplit("@", 1)[1] in commits and r["upstream_ref"].split(":")[0]
        assert outcomes_only or r["step_time_s"] is not None or r["peak_memory_gib"] is not None
    for _, r in read_rows(COMMITTED / folder):
        if r["status"] == "ok":
            Scenario(*scenario_of(r))  # raises if the plan does not fit the model and cluster


# Reference numbers, quoted from the upstream text (tolerance: the published rounding).
def test_msswift_reference_numbers():
    # examples/train/packing/liger_kernel.sh:1-4 "# Env: 4 * A100 ... GPU Memory: 4 * 42GB, Training Speed 10s/it",
    # --per_device_train_batch_size 1 --gradient_accumulation_steps 2 --packing true --max_length 16384 --deepspeed zero3
    r = _row("msswift_examples", "packing-liger-16k")
    assert (r["p_framework"], r["p_zero"], r["p_dp"], r["p_micro_batch"], r["p_grad_accum"]) == ("deepspeed", 3, 4, 1, 2)
    assert (r["w_seq_len"], r["w_global_batch"], r["p_recompute"]) == (16384, 8, "full")
    assert r["step_time_s"] == pytest.approx(10.0) and r["peak_memory_gib"] == pytest.approx(42.0)
    assert r["tokens_per_s"] == pytest.approx(8 * 16384 / 10.0)
    # examples/megatron/long_text.sh:1-3 "# GPU Memory: 4 * 50GB, Training Speed 23s/it": tp 4, gbs 8, mbs 1, 32K
    m = _row("msswift_examples", "megatron-long-32k")
    assert (m["p_framework"], m["p_tp"], m["p_dp"], m["p_grad_accum"], m["w_seq_len"]) == ("megatron", 4, 1, 8, 32768)
    assert m["step_time_s"] == pytest.approx(23.0) and m["peak_memory_gib"] == pytest.approx(50.0)
    # examples/train/liger/sft.sh:2-3: the same plan with and without Liger, memory only (42 vs 54 GB)
    a, b = _row("msswift_examples", "liger-sft-8k-liger"), _row("msswift_examples", "liger-sft-8k-noliger")
    assert a["step_time_s"] is None and b["step_time_s"] is None
    assert (a["peak_memory_gib"], b["peak_memory_gib"]) == (42.0, 54.0)


def test_msswift_benchmark_reference_numbers():
    # 9d297f99a docs/source_en/Instruction/Megatron-SWIFT-Training.md:108-111: "| Training Speed | 9.04s/it |
    # 10.32s/it | 10.56s/it |" and "| GPU Memory Usage | 8*64GB | 8*80GB | 8*58GB |" (Megatron-LM, ZeRO2, ZeRO3);
    # the same 16 packed 8K sequences per step; "eight-GPU A800" (Quick-start.md:250): A100 silicon, NVLink 200 GB/s
    # per direction.
    rows = {k: _row("msswift_examples", f"bench-dense-{k}") for k in ("megatron", "zero2", "zero3")}
    assert [rows[k]["step_time_s"] for k in ("megatron", "zero2", "zero3")] == [9.04, 10.32, 10.56]
    assert (rows["megatron"]["peak_memory_gib"], rows["zero3"]["peak_memory_gib"]) == (64.0, 58.0)
    assert rows["zero2"]["peak_memory_gib"] is None  # "8*80GB": the cache filled the card, bounds nothing
    for r in rows.values():
        assert r["w_global_batch"] * r["w_seq_len"] == 16 * 8192 and r["c_intra_bw_gb_per_s"] == 200.0
        assert r["m_name"] == "qwen2.5-14b" and r["c_gpus"] == 8
    assert (rows["megatron"]["p_tp"], rows["megatron"]["p_dp"], rows["megatron"]["p_recompute"]) == (4, 2, "selective")
    assert (rows["zero2"]["p_zero"], rows["zero3"]["p_zero"], rows["zero3"]["p_dp"]) == (2, 3, 8)


def test_msswift_moe_reference_numbers():
    # ad907793e9 examples/train/megatron/qwen3_moe.sh:2 "# Megatron-LM: 9.6s/it; 16 * 60GiB" with
    # --tensor_model_parallel_size 2 --expert_model_parallel_size 8 --micro_batch_size 1 --global_batch_size 16
    r = _row("msswift_examples", "bench-moe-megatron")
    assert (r["m_name"], r["c_gpus"], r["c_nodes"], r["p_tp"], r["p_dp"], r["p_ep"]) == ("qwen3-30b-a3b", 16, 2, 2, 8, 8)
    assert (r["p_grad_accum"], r["w_global_batch"], r["step_time_s"], r["peak_memory_gib"]) == (2, 16, 9.6, 60.0)


def test_nemo_automodel_reference_numbers():
    # docs/performance-summary.mdx:25 "| Llama3 70B | 64 | 128 | 1 | 1 | 4 | 8192 | 1 | 1 | 2 | - | - | 32 | ... |
    # 18.90 | 389 | 866.77 |": the step time and the published tokens/s/GPU agree within the rounding.
    r = _row("nemo_automodel", "llama3-70b-pretrain-64")
    assert (r["c_gpus"], r["p_dp"], r["p_cp"], r["p_zero"], r["w_global_batch"], r["w_seq_len"]) == (64, 32, 2, 3, 128, 8192)
    assert r["p_framework"] == "fsdp2"  # NeMo AutoModel's FSDP2 manager: fully_shard per block, DTensor
    assert r["step_time_s"] == pytest.approx(18.90)
    assert r["tokens_per_s"] / 64 == pytest.approx(866.77, rel=1e-3)
    assert "context parallelism" in r["note"]  # the capability table's refusal is kept beside the fact


def test_a_malformed_transcription_is_one_clear_error(tmp_path):
    src = (COMMITTED / "msswift_examples" / CSV_NAME).read_text().splitlines()
    (tmp_path / "msswift_examples").mkdir()
    bad = src[:2] + [src[1].replace(",ok,", ",maybe,", 1)]
    (tmp_path / "msswift_examples" / CSV_NAME).write_text("\n".join(bad) + "\n")
    with pytest.raises(ValueError, match=r"transcribed.csv:3: status 'maybe'"):
        msswift.run(tmp_path, tmp_path)


def _shipped_trained_on(sources) -> bool:
    from perfpredict.models.bundle import default_bundle

    trained = set(default_bundle().metadata.get("sources") or ())
    return bool(trained & set(sources))


def test_held_out_sources_scores_the_shipped_predictor():
    """Scores the shipped predictor on these sources while it has not seen them. Once a retrained bundle holds them
    (the shipped one does since the issue-21 retrain), they are refused like any training source and only --refit
    scores them held out (test_refit_fits_without_the_held_out_sources)."""
    if _shipped_trained_on(SOURCES):
        with pytest.raises(PerfPredictError, match="not held out.*--refit"):
            held_out_sources(data="datasets", sources=SOURCES)
        return
    res = held_out_sources(data="datasets", sources=SOURCES)
    m = res["metrics"]
    assert set(m["split"].to_list()) == {"source", "source:model"}
    by_source = {r["source"]: r for r in m.filter(pl.col("split") == "source").iter_rows(named=True)}
    assert by_source["msswift_examples"]["time_n"] == 7 and by_source["msswift_examples"]["mem_n"] == 8
    assert by_source["nemo_automodel"]["time_n"] == 1
    for r in by_source.values():
        assert r["time_composed_mape"] == r["time_composed_mape"]  # the composition is scored beside it (not NaN)
        assert r["false_oom"] == 0.0  # every published run here ran; none may be predicted out of memory


def test_held_out_sources_refuses_a_training_source():
    with pytest.raises(PerfPredictError, match="not held out.*--refit"):
        held_out_sources(data="datasets", sources=("vtrain",))
    with pytest.raises(PerfPredictError, match="no runs of source"):
        held_out_sources(data="datasets", sources=("no-such-source",))


def test_cli_held_out_source():
    res = CliRunner().invoke(app, ["evaluate", "--held-out-source", "nemo_automodel"])
    if _shipped_trained_on(("nemo_automodel",)):
        assert res.exit_code != 0 and "--refit" in res.output and "Traceback" not in res.output
    else:
        assert res.exit_code == 0, res.output
        assert "nemo_automo" in res.output
    res = CliRunner().invoke(app, ["evaluate", "--held-out-source", "vtrain"])
    assert res.exit_code != 0 and "not held out" in res.output and "Traceback" not in res.output


def test_module_specs_point_at_their_folders():
    assert msswift.UPSTREAM.folder == "msswift_examples" and nemo_automodel.UPSTREAM.folder == "nemo_automodel"
    assert liger_examples.UPSTREAM.folder == "liger_hf_examples"
    assert alignment_handbook.UPSTREAM.folder == "alignment_handbook" and hf_blog_ds_fsdp.UPSTREAM.folder == "hf_blog_ds_fsdp"


def test_refit_fits_without_the_held_out_sources(monkeypatch):
    """--refit: kernels on every probe, the bundle on every other source's runs (stubbed here: a real fit takes
    minutes), then the same per-source and per-model scoring."""
    import perfpredict.train.evaluate as ev
    from perfpredict.models.bundle import default_bundle

    seen = {}

    class Kernels:
        def __init__(self, seed=0):
            pass

        def fit(self, probes):
            seen["probes"] = probes.height
            return self

    def fit_bundle(runs, kernels, *, seed=0, **kw):
        seen["sources"] = set(runs["source"].unique().to_list())
        b = default_bundle()
        return type(b)(**{**b.__dict__, "metadata": dict(b.metadata)}), None

    monkeypatch.setattr(ev, "KernelModel", Kernels)
    monkeypatch.setattr(ev, "fit_bundle", fit_bundle)
    res = held_out_sources(data="datasets", sources=("vtrain", "nemo_automodel"), refit=True)
    assert seen["probes"] > 0 and not seen["sources"] & {"vtrain", "nemo_automodel"}
    assert "msswift_examples" in seen["sources"]
    assert {"vtrain", "nemo_automodel"} <= set(res["metrics"]["source"].to_list())


def test_cli_refit_needs_held_out_source():
    res = CliRunner().invoke(app, ["evaluate", "--refit"])
    assert res.exit_code == 2 and "--refit goes with --held-out-source" in res.output


def test_import_public_names_a_missing_transcription(tmp_path):
    with pytest.raises(FileNotFoundError, match="transcription is committed"):
        import_public(shared_root=tmp_path, out_root=tmp_path, only=["nemo_automodel"], transcribed_root=tmp_path)


def test_msswift_h20_reference_numbers():
    # examples/train/flash_attention_3/transformers.sh:1-2 "# test_env: 4 * H20 / # fa2: 4 * 43GiB; 35.5s/it" with
    # --deepspeed zero3 --per_device_train_batch_size 1 --gradient_accumulation_steps 4 --packing true
    # --max_length 16384 --use_liger_kernel true; catalog h20: 96 GiB, 148 dense BF16 TFLOPS (perfpredict/catalog/gpus/h20.json)
    r = _row("msswift_examples", "fa3-transformers-fa2")
    assert (r["g_name"], r["c_gpus"], r["p_framework"], r["p_zero"], r["p_dp"], r["p_grad_accum"]) == ("h20", 4, "deepspeed", 3, 4, 4)
    assert (r["w_seq_len"], r["w_global_batch"], r["step_time_s"], r["peak_memory_gib"]) == (16384, 16, 35.5, 43.0)
    assert r["memory_kind"] == "reported" and "liger" in r["kernels"]


# Liger-Kernel examples/huggingface/results/*.log (EfficiencyCallback, transformers 4.44.2, FSDP1 full_shard with
# activation checkpointing on 4 A100): the last logged step's avg_step_time_sec and total_peak_memory_allocated_MB.
LIGER_REFERENCE = [
    # row, model, per-device batch, 'avg_step_time_sec', 'total_peak_memory_allocated_MB', tokens after step 1 and N, steps
    ("llama-liger-False-None", "llama-3.1-8b", 32, 3.08, 43280.77, 28672, 309248, 9),
    ("llama-liger-True-pre-init", "llama-3.1-8b", 32, 2.82, 38307.87, 45568, 353280, 9),
    ("mistral-liger-False-None", "mistral-7b", 32, 3.6, 34547.91, 40960, 396800, 9),
    ("qwen2-liger-False-None", "qwen2.5-7b", 24, 2.04, 41293.44, 39168, 127104, 4),
    ("phi3-liger-True-pre-init", "phi-3-mini", 128, 10.56, 42812.34, 217088, 2154496, 9),
    ("gemma2-liger-False-None", "gemma-2-2b", 32, 3.1, 66926.17, 38912, 760832, 19),
]


@pytest.mark.parametrize("row_id,model,batch,step_s,alloc_mib,tok_first,tok_last,steps", LIGER_REFERENCE)
def test_liger_reference_numbers(row_id, model, batch, step_s, alloc_mib, tok_first, tok_last, steps):
    r = _row("liger_hf_examples", row_id)
    assert (r["m_name"], r["g_name"], r["c_gpus"], r["p_framework"], r["p_zero"], r["p_dp"]) == \
        (model, "a100-sxm-80gb", 4, "fsdp", 3, 4)
    assert (r["p_micro_batch"], r["p_grad_accum"], r["p_recompute"], r["w_objective"]) == (batch, 1, "full", "sft")
    # seq_len: the mean padded length over the averaged steps (num_input_tokens_seen counts padding, all 4 ranks)
    assert r["w_seq_len"] == round((tok_last - tok_first) / steps / (4 * batch))
    assert r["step_time_s"] == pytest.approx(step_s)
    assert r["peak_memory_gib"] == pytest.approx(alloc_mib / 1024, abs=1e-4)
    assert r["memory_kind"] == "cuda_max_allocated" and r["peak_reserved_gib"] is None


def test_liger_skips_diverged_and_duplicate_runs():
    rows = {r["row_id"]: r for _, r in read_rows(COMMITTED / "liger_hf_examples")}
    assert rows["gemma2-liger-True-pre-init"]["status"] == "skip" and "diverged" in rows["gemma2-liger-True-pre-init"]["skip_reason"]
    assert rows["llama-liger-True-post-init-class"]["status"] == "skip"  # a twin of the imported pre-init row
    assert sum(r["status"] == "ok" for r in rows.values()) == 10


# The fused head (plan fused_head: Liger's fused linear cross entropy) on the rows that ran it.
FUSED_ROWS = {("msswift_examples", "packing-liger-16k"), ("msswift_examples", "liger-sft-8k-liger"),
              ("msswift_examples", "fa3-transformers-fa2"), ("liger_hf_examples", "llama-liger-True-pre-init"),
              ("liger_hf_examples", "mistral-liger-True-pre-init"), ("liger_hf_examples", "qwen2-liger-True-pre-init"),
              ("liger_hf_examples", "phi3-liger-True-pre-init"), ("oom_reports", "open-r1-506-1.5b-config-demo-mb2")}


@pytest.mark.parametrize("folder", SOURCES)
def test_fused_head_marks_the_liger_runs(folder):
    df = pl.read_parquet(COMMITTED / folder / "runs.parquet")
    fused = set(df.filter(pl.col("p_fused_head").fill_null(False))["transcribed_row"].to_list()) \
        if "p_fused_head" in df.columns else set()
    assert fused == {r for f, r in FUSED_ROWS if f == folder}
    for r in df.filter(pl.col("transcribed_row").is_in(list(fused))).iter_rows(named=True):
        assert "liger" in r["kernels"]
    # Gemma 2's Liger patch at 1dce7fd4 applies Liger's cross entropy only (monkey_patch.py:322-350): not fused
    if folder == "liger_hf_examples":
        assert "gemma2-liger-True-post-init-class" not in fused


def test_fused_head_bytes_follow_liger_chunking():
    """liger_kernel/ops/fused_linear_cross_entropy.py:68-69: chunk = next_power_of_2(ceil(BT / ceil(V / H))). Qwen2.5-7B
    (V 152,064, H 3,584) on a 16,384-token pack: ceil(V/H) = 43, ceil(16384 / 43) = 382 -> 512 rows; the head then
    holds 512 x V x 6 B + BT x H x 2 B (grad_input) + V x H x 2 B (grad_weight) instead of BT x V x 10 B of logits."""
    from perfpredict.features.memory import fused_head_bytes, liger_chunk_rows

    df = pl.DataFrame({"bt": [16384.0, 7808.0, 1.0], "v": [152064.0, 128256.0, 152064.0], "h": [3584.0, 4096.0, 3584.0]})
    out = df.select(rows=liger_chunk_rows(pl.col("bt"), pl.col("v"), pl.col("h")),
                    b=fused_head_bytes(pl.col("bt"), pl.col("v"), pl.col("h")))
    assert out["rows"].to_list() == [512.0, 256.0, 1.0]  # 7808 / ceil(128256/4096 = 31.3) = 244 -> 256; never > BT
    assert out["b"][0] == 512 * 152064 * 6 + 16384 * 3584 * 2 + 152064 * 3584 * 2
    assert out["b"][0] / 2**30 == pytest.approx(1.56, abs=0.01) and 16384 * 152064 * 10 / 2**30 == pytest.approx(23.2, abs=0.05)


def test_composition_drops_the_logits_under_a_fused_head():
    """The same run with and without fused_head: only the head term changes (27.8 -> 1.6 GiB for the 16K row:
    transformers' logits path holds HF_LOGIT_BYTES = 12 B per logit at its peak)."""
    from perfpredict.features.descriptors import describe
    from perfpredict.models.bundle import default_bundle

    runs = pl.read_parquet(COMMITTED / "msswift_examples" / "runs.parquet").filter(
        pl.col("transcribed_row") == "packing-liger-16k")
    assert runs.height == 1 and runs["p_fused_head"][0]
    comp = default_bundle().compose(describe(pl.concat([runs, runs.with_columns(p_fused_head=pl.lit(False))])))
    fused, plain = comp.row(0, named=True), comp.row(1, named=True)
    assert fused["d_peak_logits_gib"] == pytest.approx(1.56, abs=0.01)
    logits = 16384 * 152064 * 12 / 2**30
    assert plain["d_peak_logits_gib"] == pytest.approx(logits, abs=0.05)
    assert plain["d_mem_gib"] - fused["d_mem_gib"] == pytest.approx(logits - 1.56, abs=0.05)
    assert fused["d_peak_states_gib"] == plain["d_peak_states_gib"]
    # measured 42 GiB (reserved): the composition moved from +42 % to -12 % (37.9 GiB, then 37.1 with DeepSpeed's
    # reuse-distance rule for the gathered parameters); the rest is named in docs/finetune-memory.md
    assert fused["d_mem_gib"] == pytest.approx(37.1, abs=0.1)


def test_liger_speedup_per_token_follows_the_paired_logs():
    """Liger's example logs run each model with and without Liger's kernels (datasets/public/liger_hf_examples,
    transcribed.csv): per token (padded lengths differ between the twins) Liger's run takes 0.84 (llama), 0.89
    (mistral), 0.82 (phi-3) and 0.90 (qwen2) of the plain one. The composition charged both twins transformers'
    eager norms, rotary and MLP (ratio 0.99-1.00); with Liger's kernels replacing them (core.frameworks
    LIGER_LAYER) it gives 0.86-0.91. Gemma-2's Liger run has no fused head (cross entropy only) and stays out."""
    from perfpredict.features.descriptors import describe
    from perfpredict.models.bundle import default_bundle

    # the twins' own length spreads (w_seq_len_cv) set aside: this compares the kernels alone
    runs = pl.read_parquet(COMMITTED / "liger_hf_examples" / "runs.parquet").filter(
        ~pl.col("m_name").str.starts_with("gemma")).with_columns(w_seq_len_cv=pl.lit(0.0))
    comp = default_bundle().compose(describe(runs)).with_columns(
        per_token=pl.col("k_step_s") / pl.col("w_seq_len"), measured=pl.col("step_time_s") / pl.col("w_seq_len"))
    pairs = comp.group_by("m_name").agg(
        composed=pl.col("per_token").filter(pl.col("p_fused_head")).first()
        / pl.col("per_token").filter(~pl.col("p_fused_head")).first(),
        measured=pl.col("measured").filter(pl.col("p_fused_head")).first()
        / pl.col("measured").filter(~pl.col("p_fused_head")).first())
    assert pairs.height == 4
    for r in pairs.iter_rows(named=True):
        assert 0.80 < r["measured"] < 0.91
        assert r["composed"] < 0.92 and abs(r["composed"] - r["measured"]) < 0.07, r


def test_fused_head_is_refused_where_the_head_is_modelled_otherwise():
    from perfpredict.core.frameworks import why_not
    from perfpredict.core.plan import Plan

    assert "vocab-parallel fused cross entropy" in why_not(Plan(framework="megatron", fused_head=True))
    assert "TRL path" in why_not(Plan(framework="trl", fused_head=True))
    assert why_not(Plan(framework="deepspeed", dp=4, zero=3, fused_head=True)) is None
    assert Plan(framework="deepspeed").to_dict() == {k: v for k, v in Plan(framework="deepspeed").to_dict().items()
                                                     if k != "fused_head"}  # run ids of older rows stay the same
    with pytest.raises(PerfPredictError, match="fused_head must be true or false"):
        Plan(framework="deepspeed", fused_head="yes")


def test_emit_writes_use_liger_kernel_for_a_fused_head():
    from dataclasses import replace

    from perfpredict.core.catalog import get_gpu, get_model
    from perfpredict.core.hardware import Cluster
    from perfpredict.core.plan import Plan
    from perfpredict.core.workload import Workload
    from perfpredict.predictor.emit import emit

    kw = dict(model=get_model("qwen2.5-7b"), cluster=Cluster(gpu=get_gpu("a100-sxm-80gb"), gpus_per_node=4, nodes=1),
              workload=Workload(objective="dpo", seq_len=4096, global_batch=8, precision="bf16"))
    plan = Plan(framework="deepspeed", dp=4, zero=3, micro_batch=1, grad_accum=2, recompute="full", fused_head=True)
    assert '"use_liger_kernel": true' in emit("deepspeed", plan=plan, **kw)["trl_dpo_args.json"]
    assert "use_liger_kernel" not in emit("deepspeed", plan=replace(plan, fused_head=False), **kw)["trl_dpo_args.json"]


# The alignment handbook's Hub metrics (Trainer train_results.json / all_results.json) with the recipes' plans.
HANDBOOK_REFERENCE = [
    # row, objective, micro-batch, grad accum, seq_len, train_runtime (s), optimizer steps
    # zephyr-7b-dpo-full@b227adb: "train_runtime": 5328.4749, "train_samples": 61135 (ceil(61135 / 128) = 478 steps)
    ("zephyr-7b-dpo-full", "dpo", 8, 2, 1024, 5328.4749, 478),
    # zephyr-7b-sft-full@8104d49: "train_runtime": 5608.2856, "train_steps_per_second": 0.194 (1,088 steps)
    ("zephyr-7b-sft-full", "sft", 16, 1, 2048, 5608.2856, 1088),
    # mistral-7b-grok all_results.json: "train_runtime": 5277.8235; model card: 545 steps, total_train_batch_size 256
    ("mistral-7b-grok", "sft", 8, 4, 2048, 5277.8235, 545),
]


@pytest.mark.parametrize("row_id,objective,mb,ga,seq,runtime_s,steps", HANDBOOK_REFERENCE)
def test_alignment_handbook_reference_numbers(row_id, objective, mb, ga, seq, runtime_s, steps):
    r = _row("alignment_handbook", row_id)
    assert (r["m_name"], r["g_name"], r["c_gpus"], r["p_framework"], r["p_zero"], r["p_dp"]) == \
        ("mistral-7b", "h100-sxm-80gb", 8, "deepspeed", 3, 8)
    assert (r["w_objective"], r["p_micro_batch"], r["p_grad_accum"], r["w_seq_len"], r["p_recompute"]) == \
        (objective, mb, ga, seq, "full")
    assert r["step_time_s"] == pytest.approx(runtime_s / steps, abs=1e-4)
    assert r["peak_memory_gib"] is None  # the Hub metrics hold no memory
    # the DPO run keeps TRL's live reference (run_dpo.py passes ref_model = model; a ZeRO-3 inference engine)
    assert r["w_reference"] == ("live" if objective == "dpo" else "none")


def test_alignment_handbook_dpo_and_sft_move_the_same_tokens():
    """128 pairs x 2 x 1,024 (the cap) = 128 packed x 2,048 tokens per step: one model, node and engine, so the
    measured 2.16x between the two steps is the DPO trainer's, not the batch's."""
    dpo, sft = _row("alignment_handbook", "zephyr-7b-dpo-full"), _row("alignment_handbook", "zephyr-7b-sft-full")
    assert dpo["w_global_batch"] * dpo["w_seqs_per_sample"] * dpo["w_seq_len"] == \
        sft["w_global_batch"] * sft["w_seqs_per_sample"] * sft["w_seq_len"] == 262144
    assert dpo["step_time_s"] / sft["step_time_s"] == pytest.approx(2.16, abs=0.01)


def test_alignment_handbook_skips_foreign_pushes():
    rows = {r["row_id"]: r for _, r in read_rows(COMMITTED / "alignment_handbook")}
    assert rows["zephyr-7b-dpo-full-edda139"]["status"] == "skip"  # 780 s, loss 0.080: not the recipe's run
    assert rows["community-reruns"]["status"] == "skip" and "hardware is not stated" in rows["community-reruns"]["skip_reason"]
    assert rows["mistral-7b-anthropic"]["status"] == "skip" and "half evaluation" in rows["mistral-7b-anthropic"]["skip_reason"]
    assert sum(r["status"] == "ok" for r in rows.values()) == 4


def test_alignment_handbook_orpo_141b_on_four_nodes():
    """zephyr-orpo-141b-A35b-v0.1 all_results.json: "train_runtime": 4771.9621, 3 epochs of "train_samples": 6932 at 32
    pairs per step (1 per GPU, 4 nodes of 8 H100, FSDP FULL_SHARD): 3 x ceil(6932 / 32) = 651 steps; the card's "1.3
    hours" is 4,772 s. Mixtral-8x22B: 140.6B parameters (config.json), 141B published."""
    r = _row("alignment_handbook", "zephyr-orpo-141b-A35b")
    assert (r["m_name"], r["c_gpus"], r["c_nodes"], r["p_framework"], r["p_zero"], r["p_dp"]) == \
        ("mixtral-8x22b", 32, 4, "fsdp", 3, 32)
    assert (r["w_objective"], r["w_reference"], r["w_global_batch"], r["w_seq_len"]) == ("orpo", "none", 32, 2048)
    assert r["step_time_s"] == pytest.approx(4771.9621 / 651, abs=1e-4)
    assert 4771.9621 / 3600 == pytest.approx(1.3, abs=0.05)


def test_hf_blog_ds_fsdp_reference_numbers():
    """deepspeed-to-fsdp-and-back.md Table 3: "FSDP (aligned mode) | 3158.7 | 10.4 | 0.41" and "DeepSpeed | 3094.5 |
    10.6 | 0.40" (tokens/s/device, step s, MFU) for Granite 7B (Llama 2 shapes), batch 8 per device, 4 A100."""
    for row_id, framework, tok_s, step_s in (("granite-7b-fsdp-aligned", "fsdp", 3158.7, 10.4),
                                              ("granite-7b-deepspeed-zero3", "deepspeed", 3094.5, 10.6)):
        r = _row("hf_blog_ds_fsdp", row_id)
        assert (r["m_name"], r["g_name"], r["c_gpus"], r["p_framework"], r["p_zero"], r["p_micro_batch"]) == \
            ("llama-2-7b", "a100-sxm-80gb", 4, framework, 3, 8)
        assert r["step_time_s"] == step_s
        # the published tokens/s per device and step time agree with batch 8 x 4,096 tokens within their rounding
        assert tok_s * step_s / (8 * r["w_seq_len"]) == pytest.approx(1.0, abs=0.003)
        assert r["tokens_per_s"] / 4 == pytest.approx(tok_s, rel=0.003)


# Liger-Kernel examples/huggingface/results/gemma2_use_liger_False_patching_type_None.log lines 5-24 @ 4581599f
# (batch 32 on 4 ranks): num_input_tokens_seen after each of the 20 steps; the memory is logged from step 2 on.
GEMMA2_TOKENS = [38912, 77824, 119808, 153600, 185856, 231424, 274944, 318464, 347136, 379904, 427520, 466944, 500224,
                 537088, 569856, 613888, 646656, 684544, 720896, 760832]


def test_liger_peak_seq_len_is_rank0s_longest_batch_from_the_token_counts():
    """transcribe.py's peak_seq_len, recomputed independently: the 19 logged steps' 4-rank mean padded lengths
    (mean 296.8, sd 41.8), the ranks' spread 2 x 41.8, rank 0's longest of 19 at mean + spread x E[max of 19 standard
    normals] (1.844) = 451.1 -> 464 (the next multiple of 16, under the 512 cap)."""
    import numpy as np
    from scipy import integrate, stats

    per = np.diff(GEMMA2_TOKENS) / (4 * 32)
    n = len(per)
    emax = integrate.quad(lambda x: x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1), -10, 10)[0]
    assert emax == pytest.approx(1.844, abs=1e-3)
    est = per.mean() + 2 * per.std(ddof=1) * emax
    assert est == pytest.approx(451.1, abs=0.1)
    r = _row("liger_hf_examples", "gemma2-liger-False-None")
    assert r["w_peak_seq_len"] == min(512, 16 * int(np.ceil(est / 16))) == 464
    assert r["w_seq_len"] == 297  # the mean, which the step time follows
    # every imported row: at least its mean length, at most the 512 truncation, a multiple of the collator's 16
    for _, row in read_rows(COMMITTED / "liger_hf_examples"):
        if row["status"] == "ok":
            peak = int(row["peak_seq_len"])
            assert int(row["seq_len"]) <= peak <= 512 and peak % 16 == 0, row["row_id"]


def test_memory_is_composed_at_the_peak_seq_len_and_time_at_the_mean():
    """A padded batch's activations and logits grow with its own length: Workload.peak_seq_len moves the peak memory
    (features.memory.memory_seq_len) and nothing that the step time reads."""
    from dataclasses import replace

    from perfpredict.api import describe_scenarios

    sc = next(s for s in _scenarios("liger_hf_examples") if s.workload.peak_seq_len == 464)
    mean_only = replace(sc, workload=replace(sc.workload, peak_seq_len=0))
    a, b = describe_scenarios(scenarios=[mean_only]), describe_scenarios(scenarios=[sc])
    assert b["d_mem_gib"][0] > a["d_mem_gib"][0] * 1.3  # gemma2: 256K-vocabulary logits, 297 -> 464 tokens
    assert b["d_act_gib"][0] > a["d_act_gib"][0]
    for col in ("d_flops_per_step", "d_tokens_per_step"):
        assert a[col][0] == b[col][0], col
    with pytest.raises(PerfPredictError, match="peak_seq_len"):
        replace(sc.workload, peak_seq_len=sc.workload.seq_len - 1)
    assert "peak_seq_len" not in mean_only.workload.to_dict()  # a default workload's dict (and its run id) unchanged


def _scenarios(folder: str) -> list[Scenario]:
    out = []
    for _, r in read_rows(COMMITTED / folder):
        if r["status"] == "ok":
            model, cluster, workload, plan = scenario_of(r)
            out.append(Scenario(model=model, cluster=cluster, workload=workload, plan=plan))
    return out


def test_msswift_deepspeed_rows_step_the_trainers_torch_adamw():
    """ms-swift's DeepSpeed configs name no optimizer (swift/config/zero3.json at 3602360a), so transformers builds its
    default `adamw_torch` and ZeRO-3 steps it per fp32 sub-group (sub_group_size 1e9): at the step, the sub-group's fp32
    gradient (4 B) and foreach's exp_avg_sq_sqrt (4 B) per parameter, plus the ZeRO-3 reduce bucket (hidden^2 x 2 B)."""
    from perfpredict.train.data import load_runs

    runs = load_runs(COMMITTED / "msswift_examples")
    ds = runs.filter(pl.col("p_framework") == "deepspeed")
    assert ds.height == 6 and (ds["w_optimizer"] == "adamw_torch").all()  # bench-dense-zero2: step time only
    assert (runs.filter(pl.col("p_framework") == "megatron")["w_optimizer"].fill_null("") == "").all()
    r = runs.filter(pl.col("transcribed_row") == "liger-sft-8k-liger").row(0, named=True)
    assert r["d_peak_moment"] == "step"
    assert r["d_peak_other_gib"] == pytest.approx((1e9 * 8.0 + 3584**2 * 2.0) / 2**30, rel=1e-4)  # 7.47 GiB


def test_rank_takes_the_longest_padded_batch():
    """`rank --peak-seq-len`: the same plans, each composed at the longest batch's length for memory and at seq_len
    for time; one clear line for a peak below the mean."""
    from perfpredict.api import rank_report

    kw = dict(model="llama-3.2-1b", gpu="h100-sxm-80gb", gpus=8, objective="sft", seq_len=1024, global_batch=64,
              frameworks=["fsdp"])
    a, b = rank_report(**kw).ranking.table, rank_report(**kw, peak_seq_len=2048).ranking.table
    key = [k for k in a.columns if k.startswith("p_")]
    j = a.join(b, on=key, suffix="_peak")
    assert j.height == a.height == b.height
    assert (j["mem_activations_gib_peak"] > j["mem_activations_gib"]).all()
    assert (j["mem_logits_gib_peak"] > j["mem_logits_gib"]).all()
    assert (j["stall_free_time_s_peak"] == j["stall_free_time_s"]).all()
    bad = CliRunner().invoke(app, ["rank", "--model", "llama-3.2-1b", "--gpu", "h100-sxm-80gb", "--seq-len", "1024",
                                   "--peak-seq-len", "512"])
    assert bad.exit_code != 0 and "peak_seq_len (512)" in bad.output and "Traceback" not in bad.output
