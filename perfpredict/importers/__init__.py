"""Importers of published measurements (shared/data/public/<folder>) into the dataset schema.

`import_public` runs every importer and writes datasets/public/<folder>/{runs,probes}.parquet plus the upstream
SOURCE.md (with a section on what was imported and every assumption) and LICENSE, so nothing at run time needs the
shared folder. Each module also exposes its pieces (import_runs / import_probes / ...) for tests. A source of
datasets like collect, not part of train: the importers use perfpredict.core only."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers import aiconfigurator, azure, playbook, vidur, vtrain

IMPORTERS = {"vtrain": vtrain, "ultrascale_playbook": playbook, "vidur": vidur, "azure_ai_benchmarking": azure,
             "aiconfigurator": aiconfigurator}


def import_public(*, shared_root: Path, out_root: Path, only: list[str] | None = None) -> dict[str, int]:
    """Run the importers (all, or the named source folders); return row counts keyed `<folder>/<table>.parquet`."""
    shared_root, out_root = Path(shared_root), Path(out_root)
    unknown = set(only or ()) - set(IMPORTERS)
    if unknown:
        raise ValueError(f"unknown source(s) {sorted(unknown)}; known: {sorted(IMPORTERS)}")
    counts: dict[str, int] = {}
    for folder, mod in IMPORTERS.items():
        if only and folder not in only:
            continue
        if not (shared_root / folder).is_dir():
            raise FileNotFoundError(f"{shared_root / folder} does not exist (expected the {folder} upstream folder)")
        counts.update(mod.run(shared_root, out_root))
    return counts


__all__ = ["IMPORTERS", "import_public"]
