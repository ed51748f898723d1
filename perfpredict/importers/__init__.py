"""Importers of published measurements (shared/data/public/<folder>) into the dataset schema.

`import_public` runs every importer and writes datasets/public/<folder>/{runs,probes}.parquet plus the upstream
SOURCE.md (with a section on what was imported and every assumption) and LICENSE, so nothing at run time needs the
shared folder. Each module also exposes its pieces (import_runs / import_probes / ...) for tests. A source of
datasets like collect, not part of train: the importers use perfpredict.core only.

TRANSCRIBED sources have no upstream copy: their hand transcription (datasets/public/<folder>/transcribed.csv,
perfpredict.importers.transcribed) is committed beside what it yields, so they read from the output folder."""

from __future__ import annotations

from pathlib import Path

from perfpredict.importers import (
    aiconfigurator,
    alignment_handbook,
    azure,
    hf_blog_ds_fsdp,
    liger_examples,
    msswift,
    nemo_automodel,
    oom_reports,
    playbook,
    vidur,
    vtrain,
)

IMPORTERS = {"vtrain": vtrain, "ultrascale_playbook": playbook, "vidur": vidur, "azure_ai_benchmarking": azure,
             "aiconfigurator": aiconfigurator}
TRANSCRIBED = {"msswift_examples": msswift, "nemo_automodel": nemo_automodel, "liger_hf_examples": liger_examples,
               "alignment_handbook": alignment_handbook, "hf_blog_ds_fsdp": hf_blog_ds_fsdp, "oom_reports": oom_reports}


# Where the transcriptions are committed (the repository's datasets/public): an import into another folder still
# reads them from here.
TRANSCRIBED_ROOT = Path(__file__).resolve().parents[2] / "datasets" / "public"


def import_public(*, shared_root: Path, out_root: Path, only: list[str] | None = None,
                  transcribed_root: Path | None = None) -> dict[str, int]:
    """Run the importers (all, or the named source folders); return row counts keyed `<folder>/<table>.parquet`.
    Transcribed sources read their transcribed.csv under `transcribed_root` (default TRANSCRIBED_ROOT)."""
    shared_root, out_root = Path(shared_root), Path(out_root)
    transcribed_root = Path(transcribed_root) if transcribed_root else TRANSCRIBED_ROOT
    unknown = set(only or ()) - set(IMPORTERS) - set(TRANSCRIBED)
    if unknown:
        raise ValueError(f"unknown source(s) {sorted(unknown)}; known: {sorted({*IMPORTERS, *TRANSCRIBED})}")
    counts: dict[str, int] = {}
    for folder, mod in IMPORTERS.items():
        if only and folder not in only:
            continue
        if not (shared_root / folder).is_dir():
            raise FileNotFoundError(f"{shared_root / folder} does not exist (expected the {folder} upstream folder)")
        counts.update(mod.run(shared_root, out_root))
    for folder, mod in TRANSCRIBED.items():
        if not only or folder in only:
            if not (transcribed_root / folder / "transcribed.csv").is_file():
                raise FileNotFoundError(f"{transcribed_root / folder / 'transcribed.csv'} does not exist (the {folder} "
                                        "transcription is committed in the repository's datasets/public)")
            counts.update(mod.run(transcribed_root, out_root))
    return counts


__all__ = ["IMPORTERS", "TRANSCRIBED", "import_public"]
