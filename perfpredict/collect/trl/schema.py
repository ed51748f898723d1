"""The `trl` table's columns and how a worker result becomes a row (the columns are described in
datasets/ours/README.md, section `trl.parquet`). The runs table's label, provenance and extra columns, the flat
scenario columns (core.scenario: m_*, g_*/c_*, w_*, p_*), then the TRL columns below."""

from __future__ import annotations

import json
import statistics
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from perfpredict.collect.trl.grid import TrlConfig
from perfpredict.core.scenario import cluster_columns, model_columns

# The table this module fills: core.schema.TRL_COLUMNS / trl_schema, imported where a row is built (polars), so
# that the workers on a machine without polars (collect.device) can import failed_result.

GiB = float(2**30)
TRL_PACKAGES = ("trl", "transformers", "accelerate", "datasets", "tokenizers")



def trl_versions(*, deepspeed: bool = False) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for p in TRL_PACKAGES + (("deepspeed",) if deepspeed else ()):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def scenario_columns(cfg: TrlConfig, *, hardware: str | None = None) -> dict[str, Any]:
    """Flat scenario columns written by hand: `trl` and `kto` are not (yet) Plan/Workload values in core. hardware:
    the catalog name of the machine that measured (rows imported from a lent GPU, collect.device); default this
    machine."""
    from perfpredict.collect.host import cluster_for
    from perfpredict.core.catalog import get_gpu
    from perfpredict.core.hardware import Cluster

    m = cfg.spec
    cluster = cluster_for(cfg.world) if hardware is None else Cluster(gpu=get_gpu(hardware), gpus_per_node=cfg.world,
                                                                      nodes=1)
    return {**model_columns(m), **cluster_columns(cluster),
            "w_objective": cfg.objective, "w_seq_len": cfg.seq_len,
            "w_global_batch": cfg.per_device_batch * cfg.grad_accum * cfg.world, "w_dataset_size": 0,
            "w_epochs": 1.0, "w_precision": cfg.precision, "w_master_fp32": True, "w_reference": cfg.reference,
            "w_seqs_per_sample": 1 if cfg.trainer == "kto" else 2,
            "p_tp": 1, "p_pp": 1, "p_dp": cfg.world, "p_cp": 1, "p_sp": False,
            "p_zero": 3 if cfg.backend == "fsdp" else cfg.zero_stage, "p_recompute": "full" if cfg.checkpointing else "none",
            "p_micro_batch": cfg.per_device_batch, "p_grad_accum": cfg.grad_accum, "p_offload": False,
            "p_framework": "trl+deepspeed" if cfg.backend == "deepspeed" else "trl", "p_schedule": "1f1b",
            "p_vstages": 1}


def config_columns(cfg: TrlConfig) -> dict[str, Any]:
    return {"trainer": cfg.trainer, "loss_type": cfg.loss_type, "reference": cfg.reference, "backend": cfg.backend,
            "per_device_batch": cfg.per_device_batch, "grad_accum": cfg.grad_accum,
            "gradient_checkpointing": cfg.checkpointing, "padding_free": cfg.padding_free,
            "prompt_len": cfg.prompt_len, "completion_len": cfg.completion_len, "len_jitter": cfg.len_jitter,
            "max_length": cfg.seq_len + 8, "dtype": cfg.precision, "config_json": json.dumps(cfg.to_dict(), sort_keys=True),
            "model_shape": cfg.shape, "world_size": cfg.world}


def failed_result(outcome: str, error: str) -> dict[str, Any]:
    """A config the parent had to give up on (timeout, crashed launch), in a worker result's form."""
    return {"outcome": outcome, "error": error, "ranks": [], "attempts": 1}


def trl_row(cfg: TrlConfig, res: dict[str, Any], *, key: str, warmup: int, steps: int,
            provenance: dict[str, Any], cores: int, hardware: str | None = None) -> dict[str, Any]:
    """A worker's result (trl.worker.measure) -> one row of the trl table (hardware: see scenario_columns)."""
    from perfpredict.core.schema import trl_schema

    row: dict[str, Any] = {k: None for k in trl_schema()}
    row.update(scenario_columns(cfg, hardware=hardware))
    row.update(config_columns(cfg))
    row.update(provenance)
    sw = json.loads(row["software"]) if row.get("software") else {}
    # Versions the provenance already names win: rows imported from a lent machine carry that machine's, recorded
    # there (collect.device), not the importing machine's.
    row["software"] = json.dumps({**trl_versions(deepspeed=cfg.backend == "deepspeed"), **sw}, sort_keys=True)
    baseline = res.get("calib_baseline_s")
    before, after = res.get("calib_before_s"), res.get("calib_after_s")
    row.update(run_id=key, outcome=res["outcome"], error=res.get("error"), trace=res.get("trace"),
               attempts=res.get("attempts"), calib_before_s=before, calib_after_s=after, calib_baseline_s=baseline,
               calib_ratio=max(before, after) / baseline if baseline and before and after else None,
               other_load_cores=res.get("other_load_cores"),
               competing_load_cores=res.get("competing_load_cores"), steal_cores=res.get("steal_cores"),
               run_wall_s=res.get("wall_s"), warmup_steps=warmup, threads_per_rank=1,
               oversubscribed=cfg.device == "cpu" and cfg.world > cores,
               memory_kind="cuda_max_allocated" if cfg.device == "cuda" else "live_tensor_peak")
    ranks = res.get("ranks") or []
    if res["outcome"] != "ok" or not ranks:
        return row
    r0 = ranks[0]
    times = r0["times_s"]
    peaks = [r["peak_bytes"] / GiB for r in ranks]
    median = statistics.median(times)
    mean = statistics.fmean(times)
    cv = statistics.pstdev(times) / mean if len(times) > 1 and mean > 0 else 0.0
    per_step = cfg.grad_accum * cfg.world
    row.update(step_time_s=median, step_time_cv=cv, steps_timed=len(times),
               peak_memory_gib=max(peaks), peak_memory_min_gib=min(peaks),
               memory_by_rank=json.dumps([round(p, 6) for p in peaks]),
               tokens_per_s=r0.get("real_tokens_mean", 0.0) * per_step / median,
               samples_per_s=cfg.per_device_batch * per_step / median,
               step_times_s=json.dumps([round(t, 6) for t in times]), losses=json.dumps([r0.get("train_loss")]),
               rss_gib=max((r.get("rss_bytes") or 0) for r in ranks) / GiB,
               base_memory_gib=(r0.get("base_bytes") or 0) / GiB,
               end_memory_gib=(r0.get("end_bytes") or 0) / GiB if r0.get("end_bytes") is not None else None,
               net_memory_gib=(r0.get("net_bytes") or 0) / GiB if r0.get("net_bytes") is not None else None,
               ddp_bucket_bytes=int(r0.get("grad_bytes") or 0) if r0.get("distributed_type") == "MULTI_CPU" else 0)
    if r0.get("reserved_bytes") is not None:
        row["peak_reserved_gib"] = max(r.get("reserved_bytes") or 0 for r in ranks) / GiB
    for k in ("distributed_type", "padding_free_effective", "batch_rows", "padded_len_mean", "padded_len_max",
              "padded_len_min", "padded_tokens_mean", "real_tokens_mean", "completion_tokens_mean", "batches_seen",
              "ref_in_memory", "construct_s", "params_measured"):
        row[k] = r0.get(k)
    row["batch_shapes"] = json.dumps(r0.get("batch_shapes"))
    return row
