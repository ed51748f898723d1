"""The KV capacity (features.generate.kv_capacity) against every vLLM-logged figure in
datasets/public/vllm_logged_kv/kv.csv: one row per engine start someone published, with the settings and the line
the engine logged (SOURCE.md cites each). These are labels: the engine measured and printed them.

Label kinds: `gpu_blocks` (V0's "# GPU blocks: N"), `kv_tokens` ("GPU KV cache size: N tokens"), `available_gib`
("Available KV cache memory: X GiB", or the sum of the parts the engine logged), `stage0_available_gib` (the first
pipeline stage's), `kv_tokens_from_available` (the tokens the logged available memory holds: the arithmetic only,
where the GPU or the engine settings were not published), `started` (whether the engine started: 1 or 0, every
row)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec
from perfpredict.features.generate import GIB, KVCapacity, kv_capacity

LOGGED_KV = Path("public") / "vllm_logged_kv" / "kv.csv"
LABEL_KINDS = ("gpu_blocks", "kv_tokens", "available_gib", "stage0_available_gib", "kv_tokens_from_available")
# Engine settings that kv.csv carries per row and kv_capacity takes as they are (blank = the engine's default).
_INT = ("tp", "pp", "max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens")


def load_logged_kv(root: Path | str = "datasets") -> list[dict[str, Any]]:
    path = Path(root) / LOGGED_KV
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise PerfPredictError(f"no vLLM-logged KV rows at {path}: {e}") from None


def _model(r: dict[str, Any]) -> ModelSpec:
    num = {k: int(r[k]) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "experts",
                                  "experts_per_token", "expert_ffn")}
    return ModelSpec(name=r["model"], tied_embeddings=r["tied"] == "True", qkv_bias=r["qkv_bias"] == "True", **num)


def capacity_of(r: dict[str, Any], *, from_available: bool = False) -> KVCapacity:
    """kv_capacity with the row's settings; from_available: with the row's logged available memory instead of the
    engine's budget (checks bytes -> blocks -> tokens alone)."""
    kw: dict[str, Any] = {k: int(r[k]) for k in _INT if r.get(k)}
    gpu = get_gpu(r["gpu"] or "h100-sxm-80gb")  # no GPU given: only the arithmetic (from_available) is checked
    if from_available:
        kw["kv_cache_memory_bytes"] = int(float(r["kv_cache_memory_gib"]) * GIB)
    return kv_capacity(_model(r), gpu, gpu_memory_utilization=float(r["gpu_memory_utilization"]),
                       kv_cache_dtype=r["kv_cache_dtype"], dtype=r["dtype"], fp8_scales=r["fp8_scales"],
                       vllm_version=r["vllm_version"], entrypoint=r["entrypoint"],
                       rope_max_position=int(r["rope_max_position"]),
                       total_gib=float(r["total_gib"]) if r["total_gib"] else None, **kw)


def predicted(r: dict[str, Any], cap: KVCapacity) -> float:
    kind = r["label_kind"]
    if kind == "gpu_blocks":
        return float(cap.num_blocks)
    if kind in ("kv_tokens", "kv_tokens_from_available"):
        return float(cap.logged_tokens)
    if kind == "available_gib":
        return cap.available_gib
    if kind == "stage0_available_gib":
        return cap.stage_available_bytes[0] / GIB
    raise PerfPredictError(f"kv.csv row {r['row_id']}: unknown label_kind {kind!r}; accepted: {', '.join(LABEL_KINDS)}")


def check_logged_kv(root: Path | str = "datasets") -> pl.DataFrame:
    """One row per logged figure: predicted, logged, relative error; `started` against the prediction's fits; and
    for rows that also log the available memory, the tokens that memory holds (`arith_rel_err`)."""
    out = []
    for r in load_logged_kv(root):
        kind = r["label_kind"]
        from_avail = kind == "kv_tokens_from_available"
        cap = capacity_of(r, from_available=from_avail)
        pred = predicted(r, cap) if kind != "started" else float(cap.fits)
        logged = float(r["label_value"])
        arith = None
        if r["kv_cache_memory_gib"] and kind == "kv_tokens":
            arith = capacity_of(r, from_available=True).logged_tokens / logged - 1
        out.append({"row_id": r["row_id"], "vllm_version": r["vllm_version"], "gpu": r["gpu"] or "-",
                    "model": r["model"], "tp": int(r["tp"]), "pp": int(r["pp"]), "label_kind": kind,
                    "logged": logged, "predicted": pred,
                    "rel_err": (pred / logged - 1) if kind != "started" else float(pred != logged),
                    "started": r["started"] == "1", "predicted_fits": cap.fits, "arith_rel_err": arith,
                    "calibrates": r.get("calibrates", ""),
                    "source_url": r["source_url"]})
    return pl.DataFrame(out, infer_schema_length=None)
