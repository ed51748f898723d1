"""`perfpredict collect import-device <folder>`: the files a lent machine's session returned (collect.device.session)
-> rows of datasets/ours/<that machine's short hash>/ (probes.parquet, probes-trl.parquet, trl.parquet), with the
measuring machine's provenance (its machine_facts, recorded there), never this machine's.

Re-importing a folder adds nothing: probe rows of a session already in a table (same collected_at and command) and
TRL rows whose run_id is there are skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfpredict.core.errors import PerfPredictError

TABLES = {"probes.jsonl": "probes.parquet", "probes-trl.jsonl": "probes-trl.parquet", "trl.jsonl": "trl.parquet"}


@dataclass(frozen=True)
class DeviceImport:
    out_dir: Path
    hardware: str
    rows_by_table: dict[str, int]  # table file -> rows appended
    skipped_by_table: dict[str, int]  # table file -> rows already there
    outcomes: dict[str, int]  # TRL outcome -> rows


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            # A session killed mid-write leaves a partial last line: that row was never complete.
            if i != len(path.read_text().splitlines()):
                raise PerfPredictError(f"{path}: line {i} is not JSON") from None
    return out


def read_meta(folder: Path) -> dict[str, Any]:
    meta = folder / "meta.json"
    if not folder.is_dir() or not meta.exists():
        raise PerfPredictError(f"{folder}: not a device session's folder (no meta.json; the files "
                               "`python -m perfpredict.collect.device.session --out DIR` writes)")
    m = json.loads(meta.read_text())
    for k in ("facts", "command"):
        if k not in m:
            raise PerfPredictError(f"{meta}: no {k!r} (written by an older or foreign session)")
    return m


def import_device(*, folder: Path | str, root: Path | str = "datasets/ours",
                  allow_dry_run: bool = False) -> DeviceImport:
    """Append the folder's rows to <root>/<short hash>/ tables. A dry run's folder (--dry-run: this host's CPU, a
    tiny model, no timing gate retries) is refused unless allow_dry_run: its rows are a test of the path."""
    import polars as pl

    from perfpredict.collect import fingerprint as fpr
    from perfpredict.collect import store
    from perfpredict.collect.trl.grid import TrlConfig
    from perfpredict.collect.trl.schema import trl_row
    from perfpredict.core.dataset import append_rows
    from perfpredict.core.schema import trl_schema

    folder = Path(folder)
    meta = read_meta(folder)
    if meta.get("dry_run") and not allow_dry_run:
        raise PerfPredictError(f"{folder}: a dry run's files (tiny model on a CPU, a test of the path); "
                               "--allow-dry-run imports them anyway (into a --root of your choice)")
    facts = meta["facts"]
    out = Path(root) / facts["short_hash"]
    added: dict[str, int] = {}
    skipped: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    cores = int(facts["hardware_fingerprint"].get("cpu_cores") or 1)
    for src, table in TABLES.items():
        raw = _lines(folder / src)
        if not raw:
            continue
        path = out / table
        if table == "trl.parquet":
            prov = fpr.provenance(meta["command"] + " (TRL grid)", facts=facts)
            done = set(pl.read_parquet(path, columns=["run_id"])["run_id"].to_list()) if path.exists() else set()
            rows = []
            for r in raw:
                if r["key"] in done:
                    continue
                cfg = TrlConfig(**r["config"])
                rows.append(trl_row(cfg, r["result"], key=r["key"], warmup=r["warmup"], steps=r["steps"],
                                    provenance=prov, cores=cores, hardware=facts["hardware"]))
                outcomes[r["result"]["outcome"]] = outcomes.get(r["result"]["outcome"], 0) + 1
            schema = trl_schema()
        else:
            fam = " --families trl" if table == "probes-trl.parquet" else ""
            prov = fpr.provenance(meta["command"] + f" (collect probes --quick{fam})", facts=facts)
            seen = (pl.read_parquet(path, columns=["collected_at", "command"]).unique().rows()
                    if path.exists() else [])
            rows = [] if (prov["collected_at"], prov["command"]) in seen else [{**r, **prov} for r in raw]
            schema = store.probes_schema()
        skipped[table] = len(raw) - len(rows)
        if rows:
            append_rows(path, rows, schema)
        added[table] = len(rows)
    if not added:
        raise PerfPredictError(f"{folder}: no rows (none of {', '.join(TABLES)} holds a line)")
    return DeviceImport(out_dir=out, hardware=facts["hardware"], rows_by_table=added, skipped_by_table=skipped,
                        outcomes=outcomes)
