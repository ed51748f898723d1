"""Shared helpers of the public-data importers: provenance, run ids, schema conformance, subsampling, writing.

Every importer reads one folder of shared/data/public (copied upstream measurements with a SOURCE.md) and returns
polars frames in the dataset schema of perfpredict.core.dataset: `runs` rows carry the flat scenario columns of
perfpredict.core.scenario.flat_row plus LABEL_COLUMNS and PROVENANCE; `probes` rows carry probe_schema(). Columns
the schema lacks (raw upstream values, notes) are kept at the end of each row."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.dataset import LABEL_COLUMNS, PROVENANCE, SCHEMA_VERSION, conform, probe_schema, write_atomic
from perfpredict.core.hardware import Cluster, GPUSpec
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario, flat_row
from perfpredict.core.workload import Workload

_PY_TO_POLARS = {bool: pl.Boolean, int: pl.Int64, float: pl.Float64, str: pl.Utf8}
# The `command` provenance of every imported row names the importers as they were called when datasets/public was
# imported (they then lived in perfpredict.train). Kept as it is so a re-import reproduces the committed files, and
# the data_hash the shipped model records, bit for bit; renaming it means re-importing and retraining together.
COMMAND_PREFIX = "perfpredict.train.importers"


@dataclass(frozen=True)
class Upstream:
    """What is known about one upstream source folder (from its SOURCE.md)."""

    folder: str  # folder name under shared/data/public, also the `source` column
    repo: str
    commit: str
    date: str  # ISO date of the upstream commit (collected_at)
    license: str
    software: dict[str, Any] = field(default_factory=dict)

    def command(self, module: str, relpath: str) -> str:
        return (f"{COMMAND_PREFIX}.{module} from shared/data/public/{self.folder}/{relpath} "
                f"@ {self.repo}@{self.commit}")

    def provenance(self, module: str, relpath: str, hardware: str, fingerprint: dict[str, Any],
                   software: dict[str, Any] | None = None) -> dict[str, Any]:
        sw = {"upstream": f"{self.repo}@{self.commit}", **self.software, **(software or {})}
        return {"source": self.folder, "hardware": hardware,
                "hardware_fingerprint": json.dumps(fingerprint, sort_keys=True),
                "software": json.dumps(sw, sort_keys=True), "collected_at": self.date,
                "command": self.command(module, relpath), "license": self.license,
                "schema_version": SCHEMA_VERSION}


def run_id(source: str, relpath: str, line: int | str, extra: str = "") -> str:
    """Stable id of an imported row: a hash of its upstream file and line (plus a discriminator when one line
    yields several rows, e.g. one probe per op)."""
    key = f"{source}/{relpath}:{line}" + (f"#{extra}" if extra else "")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _dummy_gpu() -> GPUSpec:
    return GPUSpec(name="schema", vendor="none", memory_gib=1.0, bf16_tflops=1.0, fp16_tflops=1.0, fp32_tflops=1.0,
                   hbm_tb_per_s=1.0, intra_node_bw_gb_per_s=1.0, inter_node_bw_gb_per_s=1.0)


def scenario_columns() -> dict[str, Any]:
    """Polars dtypes of the flat scenario columns, derived from flat_row itself so they follow its changes."""
    row = flat_row(ModelSpec(name="schema", layers=1, hidden=8, heads=1, kv_heads=1, ffn=8, vocab=8),
                   Cluster(gpu=_dummy_gpu(), gpus_per_node=1), Workload(objective="pretrain"), Plan())
    return {k: _PY_TO_POLARS[type(v)] for k, v in row.items()}


def runs_schema() -> dict[str, Any]:
    return {**scenario_columns(), **LABEL_COLUMNS, **PROVENANCE}


def scenario_row(model: ModelSpec, cluster: Cluster, workload: Workload, plan: Plan) -> tuple[dict[str, Any], str]:
    """Flat scenario columns of a measured run, and '' or the reason the scenario fails Scenario's checks.

    A published run is a fact even when its configuration would be rejected as a candidate plan (e.g. pp larger
    than the layer count), so the row is still built from the dataclasses; the reason goes into the row's note."""
    try:
        Scenario(model=model, cluster=cluster, workload=workload, plan=plan)
        problem = ""
    except ValueError as e:
        problem = str(e)
    return flat_row(model, cluster, workload, plan), problem


def frame(rows: Sequence[dict[str, Any]], columns: dict[str, Any]) -> pl.DataFrame:
    """Rows -> a frame with every schema column (nulls where unknown), extra columns kept at the end."""
    if not rows:
        return pl.DataFrame(schema=columns)
    df = pl.DataFrame(rows, infer_schema_length=None)
    return conform(df, columns)


def runs_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return frame(rows, runs_schema())


def probes_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return frame(rows, probe_schema())


def log_spaced(values: Iterable[float], n: int) -> list:
    """About n (or all) of the distinct values, spread evenly on a log scale; smallest and largest always kept."""
    originals = sorted(set(values))
    if len(originals) <= n:
        return originals
    vals = np.array(originals, dtype=float)
    logs = np.log(np.maximum(vals, 1e-12))

    def pick(k: int) -> np.ndarray:
        targets = np.linspace(logs[0], logs[-1], k)
        idx = np.clip(np.searchsorted(logs, targets), 1, len(vals) - 1)
        nearer_left = np.abs(logs[idx - 1] - targets) <= np.abs(logs[idx] - targets)
        return np.unique(np.where(nearer_left, idx - 1, idx))

    # Dense low values collapse onto the same picks: ask for more targets until n distinct values are kept.
    k, keep = n, pick(n)
    while len(keep) < n:
        k += 1
        keep = pick(k)
    return [originals[i] for i in keep]


def write_outputs(out_dir: Path, tables: dict[str, pl.DataFrame]) -> dict[str, int]:
    """Write non-empty tables as <name>.parquet (zstd) atomically; return row counts keyed by relative path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, df in tables.items():
        path = out_dir / f"{name}.parquet"
        if df.height == 0:
            if path.exists():
                path.unlink()
            continue
        write_atomic(df, path)
        counts[f"{out_dir.name}/{name}.parquet"] = df.height
    return counts


def write_source_md(src_dir: Path, out_dir: Path, section: str) -> None:
    """Copy upstream SOURCE.md and LICENSE next to the imported tables, appending what the importer did."""
    out_dir.mkdir(parents=True, exist_ok=True)
    upstream = (src_dir / "SOURCE.md").read_text() if (src_dir / "SOURCE.md").exists() else ""
    text = upstream.rstrip() + "\n\n" + section.strip() + "\n"
    (out_dir / "SOURCE.md").write_text(text)
    if (src_dir / "LICENSE").exists():
        shutil.copyfile(src_dir / "LICENSE", out_dir / "LICENSE")


def markdown_list(items: Iterable[str]) -> str:
    return "\n".join(f"- {s}" for s in items)
