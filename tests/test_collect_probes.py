"""`collect probes --quick` writes rows that match the probe schema (its 2-minute budget: benchmarks/probe_budget.py)."""

from __future__ import annotations

import polars as pl
import pytest

from perfpredict.core.catalog import cpu_names

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from perfpredict.cli import app  # noqa: E402
from perfpredict.core.dataset import PROBE_COLUMNS, PROVENANCE, conform, probe_schema  # noqa: E402


@pytest.mark.slow
def test_quick_probes_match_schema(tmp_path):
    res = CliRunner().invoke(app, ["collect", "probes", "--quick", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "probes.parquet")
    schema = probe_schema()
    for name, dtype in schema.items():
        assert name in df.columns, name
        assert df.schema[name] == dtype, (name, df.schema[name], dtype)
    assert conform(df, schema).columns[: len(schema)] == list(schema)
    assert set(df["op"]) >= {"gemm", "attention", "rmsnorm", "swiglu", "softmax", "cross_entropy", "add", "adam",
                             "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"}
    assert set(df["pass_"]) <= {"fwd", "bwd_input", "bwd_weight", "fwd_bwd", "bwd", "step", "comm"}
    assert set(df["dtype"]) == {"fp32", "bf16"}
    ok = df.filter(pl.col("outcome") == "ok")
    assert ok.height >= 0.9 * df.height
    assert (ok["time_s"] > 0).all() and ok["repeats"].min() >= 3
    for c in PROVENANCE:
        assert df[c].null_count() == 0, c
    assert set(df["source"]) == {"ours-cpu"} and set(df["hardware"]) <= cpu_names()
    gemm = ok.filter(pl.col("op") == "gemm")
    assert (gemm["flops"] == 2.0 * gemm["m"] * gemm["n"] * gemm["k"]).all()
    comm = ok.filter(pl.col("pass_") == "comm")
    assert (comm["world_size"] == 2).all() and (comm["bytes"] >= 4096).all()
    assert set(PROBE_COLUMNS) <= set(df.columns)
    att = ok.filter(pl.col("op") == "attention")
    assert att.height and att["causal"].all() and set(att["attn_impl"]) == {"sdpa-cpu"}
    assert ok.filter(pl.col("op") != "attention").select("causal", "attn_impl").null_count().row(0) == \
        (ok.height - att.height,) * 2
