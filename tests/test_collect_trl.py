"""`collect trl`: the config grid (balanced, valid, under its cost cap), the row schema, resumability by key and the
command's bad-input errors need no TRL run; one `slow` smoke test runs one tiny DPO config for real."""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pytest
from typer.testing import CliRunner

from perfpredict.collect.trl.grid import COMBOS, SHAPES, TrlConfig, chunks, estimated_step_s, sample_grid
from perfpredict.core.errors import PerfPredictError

TINY = TrlConfig(trainer="dpo", loss_type="sigmoid", reference="live", backend="single", shape="t1-2k",
                 per_device_batch=1, grad_accum=1, checkpointing=False, padding_free=False, prompt_len=16,
                 completion_len=16)


def test_grid_is_balanced_valid_and_deterministic():
    g = sample_grid(112, seed=3, backends=("single", "ddp"), max_step_s=0.8)
    assert g == sample_grid(112, seed=3, backends=("single", "ddp"), max_step_s=0.8)
    assert len(g) >= 100 and len(set(g)) == len(g)
    assert set(Counter(c.shape for c in g)) == set(SHAPES)
    assert {(c.trainer, c.loss_type, c.reference) for c in g} == set(COMBOS)
    assert {c.backend for c in g} == {"single", "ddp"}
    # A prefix is balanced too: the first 56 configs cover every shape and every objective combo.
    assert {c.shape for c in g[:56]} == set(SHAPES) and len({c.trainer for c in g[:56]}) == 4
    assert all(estimated_step_s(c) <= 3 * 0.8 for c in g)
    assert all(c.per_device_batch >= 2 for c in g if c.trainer == "kto")
    assert not any(c.padding_free for c in g if c.trainer != "dpo")
    assert any(c.grad_accum == 4 for c in g) and any(c.per_device_batch >= 4 for c in g)


@pytest.mark.parametrize("kw", [dict(trainer="cpo", reference="live"), dict(backend="tpu"),
                                dict(backend="deepspeed", zero_stage=4), dict(backend="deepspeed", ds_world=3),
                                dict(zero_stage=2), dict(backend="ddp", ds_world=2),
                                dict(shape="llama-70b"), dict(per_device_batch=0),
                                dict(trainer="kto", loss_type="kto", per_device_batch=1), dict(len_jitter=1.0)])
def test_bad_config_is_a_domain_error(kw):
    d = TINY.to_dict() | kw
    with pytest.raises(PerfPredictError):
        TrlConfig(**d)


def test_key_is_stable_and_distinguishes_what_changes_the_measurement():
    k = TINY.key(warmup=1, steps=4, hardware="cpu-x")
    assert k == TrlConfig(**TINY.to_dict()).key(warmup=1, steps=4, hardware="cpu-x") and len(k) == 16
    assert k != TINY.key(warmup=2, steps=4, hardware="cpu-x")
    assert k != TrlConfig(**(TINY.to_dict() | {"grad_accum": 4})).key(warmup=1, steps=4, hardware="cpu-x")


def test_chunks_keep_order_and_backend():
    g = sample_grid(30, seed=1, backends=("single", "ddp"))
    out = chunks(g, 4)
    assert all(len(cs) <= 4 and {c.backend for c in cs} == {b} for b, cs in out)
    assert sum(len(cs) for _, cs in out) == len(g)
    for b in ("single", "ddp"):
        assert [c for bb, cs in out if bb == b for c in cs] == [c for c in g if c.backend == b]


def _fake_result(cfg: TrlConfig) -> dict:
    rank = {"times_s": [0.5, 0.4, 0.6], "peak_bytes": 3 * 2**20, "base_bytes": 2**20, "rss_bytes": 2**28,
            "construct_s": 0.3, "ref_in_memory": True, "distributed_type": "NO", "params_measured": 1_574_016,
            "grad_bytes": 6_296_064, "train_loss": 0.69, "padding_free_effective": False, "batch_rows": 2.0,
            "padded_len_mean": 33.0, "padded_len_max": 33, "padded_len_min": 33, "padded_tokens_mean": 66.0,
            "real_tokens_mean": 66.0, "completion_tokens_mean": 34.0, "batches_seen": 4,
            "batch_shapes": [[2, 33]]}
    return {"outcome": "ok", "error": None, "ranks": [rank], "attempts": 1, "calib_before_s": 0.1,
            "calib_after_s": 0.11, "calib_baseline_s": 0.1, "other_load_cores": 1.2, "competing_load_cores": 0.2,
            "steal_cores": 0.0, "wall_s": 4.0}


def test_row_schema_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from perfpredict.collect.trl import collect as trl_collect
    from perfpredict.collect.trl.schema import failed_result, trl_row
    from perfpredict.core.dataset import append_rows
    from perfpredict.core.schema import trl_schema

    monkeypatch.setattr(trl_collect.fpr, "short_hash", lambda: "cpu-test")
    prov = {"source": "ours-cpu", "hardware": "cpu", "hardware_fingerprint": "{}", "software": "{}",
            "collected_at": "2026-12-01T00:00:00+00:00", "command": "test", "license": "Apache-2.0",
            "schema_version": 1}
    other = TrlConfig(**(TINY.to_dict() | {"grad_accum": 4}))
    k1, k2 = (c.key(warmup=1, steps=3, hardware="cpu-test") for c in (TINY, other))
    ok = trl_row(TINY, _fake_result(TINY), key=k1, warmup=1, steps=3, provenance=prov, cores=2)
    bad = trl_row(other, failed_result("timeout", "no result"), key=k2, warmup=1, steps=3, provenance=prov, cores=2)
    path = tmp_path / "trl.parquet"
    append_rows(path, [ok], trl_schema())
    append_rows(path, [bad], trl_schema())
    df = pl.read_parquet(path)
    assert set(trl_schema()) <= set(df.columns) and df.height == 2
    r = df.row(0, named=True)
    assert r["step_time_s"] == 0.5 and r["peak_memory_gib"] == pytest.approx(3 / 1024)
    assert r["p_framework"] == "trl" and r["w_objective"] == "dpo" and r["w_reference"] == "live"
    assert r["m_vocab"] == 2048 and r["trainer"] == "dpo" and r["backend"] == "single"
    assert r["calib_ratio"] == pytest.approx(1.1) and json.loads(r["batch_shapes"]) == [[2, 33]]
    assert {"trl", "transformers", "accelerate"} <= set(json.loads(r["software"]))
    b = df.row(1, named=True)
    assert b["outcome"] == "timeout" and b["step_time_s"] is None and b["peak_memory_gib"] is None
    left = trl_collect.pending([TINY, other, TrlConfig(**(TINY.to_dict() | {"seed": 9}))], path, warmup=1, steps=3)
    assert [c for _, c in left] == [TrlConfig(**(TINY.to_dict() | {"seed": 9}))]


@pytest.mark.parametrize("args,needle", [(["--backends", "tpu"], "--backends"), (["--configs", "0"], "--configs"),
                                         (["--shapes", "nope", "--configs", "1"], "unknown shape")])
def test_bad_command_line_is_one_line(args, needle, tmp_path):
    from perfpredict.cli import app

    r = CliRunner().invoke(app, ["collect", "trl", "--out", str(tmp_path), *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_one_tiny_dpo_config_runs_for_real(tmp_path):
    pytest.importorskip("trl")
    from perfpredict.collect.trl.collect import collect_trl

    path = collect_trl(n=1, out_dir=tmp_path, configs=[TINY], warmup=1, steps=2, max_retries=0, timeout_s=120,
                       log=lambda s: None)
    r = pl.read_parquet(path).row(0, named=True)
    assert r["outcome"] == "ok", r["error"]
    assert r["steps_timed"] == 2 and r["step_time_s"] > 0
    assert r["peak_memory_gib"] > r["base_memory_gib"] > 0  # the step allocates on top of params + optimizer
    # Two models of t1-2k (policy + live reference) in fp32 are alive at least.
    assert r["base_memory_gib"] * 2**30 >= 2 * 4 * r["params_measured"]
    # DPO concatenates chosen and rejected: 2 rows per pair; prompt 16 + completion 16 + EOS = 33 tokens.
    assert r["batch_rows"] == 2 and r["padded_len_max"] == 33 and r["ref_in_memory"]


def test_forwards_of_reads_each_trainers_batch():
    torch = pytest.importorskip("torch")
    from perfpredict.collect.trl.trainers import forwards_of

    ids = torch.ones(4, 10, dtype=torch.long)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[3, 7:] = 0
    comp = torch.zeros(4, 10, dtype=torch.long)
    comp[:, 5:] = 1
    # DPO: one forward of [chosen; rejected] (2 pairs -> 4 rows)
    assert forwards_of({"input_ids": ids, "attention_mask": mask, "completion_mask": comp}) == [(4, 10, 37, 20)]
    # KTO: the batch and its KL batch
    kto = {"input_ids": ids[:2], "attention_mask": mask[:2], "completion_mask": comp[:2],
           "KL_input_ids": ids[:2, :8], "KL_attention_mask": mask[:2, :8], "KL_completion_mask": comp[:2, :8]}
    assert forwards_of(kto) == [(2, 10, 20, 10), (2, 8, 16, 6)]
    # CPO/ORPO: chosen and rejected padded to the longer and concatenated; scored where labels != -100
    labels = torch.full((2, 6), -100)
    labels[:, 3:] = 1
    cpo = {"chosen_input_ids": ids[:2, :6], "rejected_input_ids": ids[:2, :9],
           "chosen_attention_mask": mask[:2, :6], "rejected_attention_mask": mask[:2, :9],
           "chosen_labels": labels, "rejected_labels": torch.cat([labels, labels[:, :3]], 1),
           "prompt_input_ids": ids[:2, :3]}
    assert forwards_of(cpo) == [(4, 9, 30, 12)]


def test_long_sequence_supplement_keeps_its_floor():
    g = sample_grid(20, seed=7, backends=("single", "ddp"), max_step_s=2.5, min_seq=512)
    assert g and all(c.seq_len >= 512 for c in g)
    with pytest.raises(PerfPredictError):
        sample_grid(5, min_seq=300)


DS = TrlConfig(**(TINY.to_dict() | {"backend": "deepspeed", "zero_stage": 2}))


def test_keys_of_configs_before_deepspeed_are_unchanged():
    """zero_stage / ds_world stay out of every other backend's key: rows collected before they existed resume.
    Reference: the key of TINY computed by the collector before the DeepSpeed backend (main at a7639eb)."""
    assert "zero_stage" not in TINY.to_dict() and "ds_world" not in TINY.to_dict()
    assert TINY.key(warmup=1, steps=4, hardware="cpu-x") == "70b332c62f7af998"
    assert DS.to_dict()["zero_stage"] == 2 and DS.world == 1
    keys = {TrlConfig(**(DS.to_dict() | kw)).key(warmup=1, steps=4, hardware="cpu-x")
            for kw in ({}, {"zero_stage": 3}, {"ds_world": 2})}
    assert len(keys) == 3
    assert TrlConfig(**(DS.to_dict() | {"ds_world": 2})).world == 2


def test_deepspeed_grid_rotates_stages_and_worlds_and_leaves_other_backends_alone():
    g = sample_grid(60, seed=2, backends=("deepspeed",), max_step_s=0.8, zero_stages=(0, 1, 2, 3), ds_worlds=(1, 2))
    assert {c.zero_stage for c in g} == {0, 1, 2, 3} and {c.ds_world for c in g} == {1, 2}
    assert {c.trainer for c in g} == {"dpo", "cpo", "orpo", "kto"}
    assert sample_grid(40, seed=2, backends=("single", "ddp")) == [
        c for c in sample_grid(40, seed=2, backends=("single", "ddp"), zero_stages=(3,))]
    mixed = sample_grid(40, seed=2, backends=("single", "deepspeed"))
    assert all(c.zero_stage == 0 and c.ds_world == 1 for c in mixed if c.backend != "deepspeed")
    assert {c.zero_stage for c in mixed if c.backend == "deepspeed"} <= {1, 2, 3}
    with pytest.raises(PerfPredictError):
        sample_grid(4, backends=("deepspeed",), zero_stages=(5,))


def test_deepspeed_configs_launch_one_at_a_time():
    """A DeepSpeed launch measures one config: the engines of earlier configs stay alive in the process (measured:
    +16 B/param of live tensors per earlier config)."""
    g = sample_grid(24, seed=1, backends=("single", "deepspeed"), zero_stages=(1, 2), ds_worlds=(1, 2))
    out = chunks(g, 4)
    assert sum(len(cs) for _, cs in out) == len(g)
    for group, cs in out:
        assert {c.launch_group for c in cs} == {group}
        if group.startswith("deepspeed"):
            assert len(cs) == 1 and group == f"deepspeed-z{cs[0].zero_stage}-w{cs[0].ds_world}"


def test_deepspeed_trainer_args_launch_and_row_columns(tmp_path):
    pytest.importorskip("torch")
    from perfpredict.collect.trl.collect import _env, worker_command
    from perfpredict.collect.trl.schema import trl_row
    from perfpredict.collect.trl.trainers import common_args, deepspeed_config
    from perfpredict.train.data import trl_rows

    args = common_args(DS, steps=3, out_dir=str(tmp_path))
    zero = args["deepspeed"]["zero_optimization"]
    assert zero["stage"] == 2 and zero["reduce_bucket_size"] == "auto" and args["use_cpu"] and not args["bf16"]
    assert "fsdp" not in args and "deepspeed" not in common_args(TINY, steps=3, out_dir=str(tmp_path))
    assert deepspeed_config(0)["zero_optimization"] == {"stage": 0}
    assert deepspeed_config(3)["zero_optimization"]["stage3_param_persistence_threshold"] == "auto"
    assert "--use_deepspeed" in worker_command(2, tmp_path / "job.json", deepspeed=True)
    assert "--multi_gpu" in worker_command(2, tmp_path / "job.json")
    env = _env(deepspeed=True, world=1)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["WORLD_SIZE"] == "1" and int(env["MASTER_PORT"]) > 0
    prov = {"source": "ours-cpu", "hardware": "cpu", "hardware_fingerprint": "{}", "software": "{}",
            "collected_at": "2026-12-01T00:00:00+00:00", "command": "test", "license": "Apache-2.0",
            "schema_version": 1}
    res = _fake_result(DS)
    res["ranks"][0]["distributed_type"] = "DEEPSPEED"
    row = trl_row(DS, res, key="k", warmup=1, steps=3, provenance=prov, cores=2)
    assert row["p_zero"] == 2 and row["p_framework"] == "trl+deepspeed" and row["backend"] == "deepspeed"
    assert row["world_size"] == 1 and row["ddp_bucket_bytes"] == 0 and "deepspeed" in json.loads(row["software"])
    assert "deepspeed" not in json.loads(trl_row(TINY, _fake_result(TINY), key="k", warmup=1, steps=3,
                                                 provenance=prov, cores=2)["software"])
    norm = trl_rows(pl.DataFrame([row]).with_columns(source=pl.lit("ours-cpu")))
    assert norm["p_framework"].to_list() == ["trl+deepspeed"] and norm["p_zero"].to_list() == [2]


def test_deepspeed_backend_without_deepspeed_is_one_line(tmp_path):
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    from perfpredict.cli import app

    r = CliRunner().invoke(app, ["collect", "trl", "--out", str(tmp_path), "--backends", "deepspeed"])
    assert r.exit_code == 2 and "deepspeed package" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_one_tiny_deepspeed_config_runs_for_real(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("deepspeed")
    from perfpredict.collect.trl.collect import collect_trl

    path = collect_trl(n=1, out_dir=tmp_path, configs=[DS], warmup=1, steps=2, max_retries=0, timeout_s=180,
                       log=lambda s: None)
    r = pl.read_parquet(path).row(0, named=True)
    assert r["outcome"] == "ok", r["error"]
    assert r["distributed_type"] == "DEEPSPEED" and r["p_zero"] == 2
    # ZeRO-2 fp32 at world 1 (stage_1_and_2.py): weights 4 + fp32 partition 4 + Adam 8, + the live reference's 4.
    assert r["base_memory_gib"] * 2**30 >= 20 * r["params_measured"]
