"""Published GPU fine-tuning measurements transcribed by hand into datasets/public/<folder>/transcribed.csv.

Some sources publish a handful of measured runs inside prose, script headers or Markdown tables (ms-swift's example
scripts, NeMo AutoModel's performance summary) rather than as data files, so there is no upstream copy under
shared/data/public: the transcription itself is committed beside what it yields, one row per published figure
(or per group of figures that share a reason to be left out), each with the upstream path, lines and commit it was
read from and the quoted text. This module turns the `ok` rows into `runs` rows through ModelSpec, Cluster,
Workload, Plan and flat_row, keeps every `skip` row's reason in SOURCE.md, and never invents a label: a figure the
source does not give stays null (e.g. a memory-only row has no step time)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.frameworks import OPTIMIZERS, why_not
from perfpredict.core.hardware import Cluster
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload
from perfpredict.importers.common import Upstream, run_id, runs_frame, scenario_row, write_outputs

CSV_NAME = "transcribed.csv"
COLUMNS = ("row_id", "upstream_path", "upstream_lines", "upstream_commit", "header_date", "status", "skip_reason",
           "quote", "model", "gpu", "gpus_per_node", "nodes", "intra_node_bw_gb_per_s", "objective", "framework",
           "zero", "tp", "pp", "cp", "dp", "ep", "sequence_parallel", "recompute", "micro_batch", "grad_accum",
           "seq_len", "optimizer_offload", "step_time_s", "peak_memory_gib", "memory_kind", "kernels", "fused_head")
# Workload columns a transcription may add after COLUMNS, blank where a row has no value, for padded batches
# (liger_hf_examples, whose transcribe.py derives both from the logs' per-step token counts): seq_len_cv, the spread
# of the padded length a rank's micro-batch gets (Workload.seq_len_cv), and peak_seq_len, the longest micro-batch's
# padded length (Workload.peak_seq_len).
OPTIONAL_COLUMNS = ("seq_len_cv", "peak_seq_len")
# `oom`: the run failed with the CUDA out-of-memory error the source quotes (core.schema outcome `oom`); an `ok` row of
# a fit-outcome source (Transcribed.fit_outcomes) may carry no label at all: "it ran" is its measurement.
STATUSES = ("ok", "oom", "skip")
# Optional trailing columns of a fit-outcome transcription: the numbers of PyTorch's OOM message, in GiB (blank where
# the message does not give them): the request that failed, what PyTorch had allocated and reserved when it did, and
# the capacity the driver reported. Evidence beside the `oom` outcome (the need was above allocated + tried), never a
# peak label.
OOM_COLUMNS = ("oom_tried_gib", "oom_allocated_gib", "oom_reserved_gib", "oom_capacity_gib")
# What a transcribed memory figure is, and the schema's memory_kind it becomes (core.schema LABEL_COLUMNS):
# ms-swift logs torch.cuda.max_memory_reserved() / 1024**3 as memory(GiB) (swift/trainers/patcher.py,
# swift/megatron/callbacks/print.py), i.e. the allocator's reserved peak, not the tensors' allocated peak.
# Liger-Kernel's EfficiencyCallback logs torch.cuda.memory.max_memory_allocated() (examples/huggingface/callback.py),
# the tensors' allocated peak: cuda_max_allocated.
MEMORY_KINDS = {"reserved": "reported", "allocated": "cuda_max_allocated"}


@dataclass(frozen=True)
class Transcribed:
    """One transcribed source: its provenance and the SOURCE.md section describing the import."""

    upstream: Upstream
    module: str  # the importer module's short name (command provenance)
    section: str  # SOURCE.md text above the generated row listing
    # Fit outcomes (ran / out of memory) rather than timings: `oom` rows and label-free `ok` rows are allowed, and
    # the transcription carries OOM_COLUMNS.
    fit_outcomes: bool = False


def read_rows(folder: Path) -> list[tuple[int, dict[str, str]]]:
    """(line in transcribed.csv, row) for every row; a malformed file is one clear error."""
    path = Path(folder) / CSV_NAME
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        names = tuple(reader.fieldnames or ())
        extra = names[len(COLUMNS):]
        oom = tuple(x for x in extra if x in OOM_COLUMNS)
        if (names[:len(COLUMNS)] != COLUMNS or not set(extra) <= set(OOM_COLUMNS + OPTIONAL_COLUMNS)
                or oom not in ((), OOM_COLUMNS)):
            raise ValueError(f"{path}: columns {reader.fieldnames} differ from the expected {list(COLUMNS)} "
                             f"(optionally followed by {list(OOM_COLUMNS)} and/or any of {list(OPTIONAL_COLUMNS)})")
        rows = [(line, r) for line, r in enumerate(reader, start=2)]
    for line, r in rows:
        if r["status"] not in STATUSES:
            raise ValueError(f"{path}:{line}: status {r['status']!r}; accepted: {', '.join(STATUSES)}")
        if r["status"] == "skip" and not r["skip_reason"].strip():
            raise ValueError(f"{path}:{line}: a skipped row needs its skip_reason")
    return rows


def _int(r: dict[str, str], k: str) -> int:
    return int(r[k])


def _float(r: dict[str, str], k: str) -> float | None:
    v = r[k].strip()
    return float(v) if v else None


def _optional(r: dict[str, str], k: str) -> str:
    """An OPTIONAL_COLUMNS value, "" where the transcription lacks the column or leaves it blank."""
    return (r.get(k) or "").strip()


def _bool(r: dict[str, str], k: str) -> bool:
    v = r[k].strip().lower()
    if v not in ("true", "false"):
        raise ValueError(f"{k} must be true or false, got {r[k]!r}")
    return v == "true"


def scenario_of(r: dict[str, str]) -> tuple[Any, Cluster, Workload, Plan]:
    """The (model, cluster, workload, plan) a transcribed `ok` row ran."""
    model = get_model(r["model"])
    # A blank link rate is the catalog GPU's; a variant of a catalog GPU that differs only in its NVLink (A800 =
    # A100 silicon with NVLink cut to 400 GB/s) is that GPU with its own rate, so its kernels keep their probes.
    cluster = Cluster(gpu=get_gpu(r["gpu"]), gpus_per_node=_int(r, "gpus_per_node"), nodes=_int(r, "nodes"),
                      intra_node_bw_gb_per_s=_float(r, "intra_node_bw_gb_per_s") or 0.0)
    mb, ga, dp = _int(r, "micro_batch"), _int(r, "grad_accum"), _int(r, "dp")
    tokens = (r["kernels"] or "").split("+")
    # A `kernels` token naming an optimizer (transformers' `optim`, core.frameworks OPTIMIZERS): the run's optimizer
    named = [t for t in tokens if t in OPTIMIZERS and t]
    if len(named) > 1:
        raise ValueError(f"kernels names {len(named)} optimizers ({', '.join(named)}); a run has one")
    workload = Workload(objective=r["objective"], seq_len=_int(r, "seq_len"), global_batch=mb * ga * dp,
                        precision="bf16", optimizer=named[0] if named else "",
                        seq_len_cv=float(_optional(r, "seq_len_cv") or 0.0),
                        peak_seq_len=int(_optional(r, "peak_seq_len") or 0))
    plan = Plan(tp=_int(r, "tp"), pp=_int(r, "pp"), dp=dp, cp=_int(r, "cp"), ep=_int(r, "ep"),
                sequence_parallel=_bool(r, "sequence_parallel"), zero=_int(r, "zero"), recompute=r["recompute"],
                micro_batch=mb, grad_accum=ga, optimizer_offload=_bool(r, "optimizer_offload"),
                framework=r["framework"], fused_head=_bool(r, "fused_head"),
                # `kernels` token eager_attention: transformers' eager attention ran (plan eager_attention)
                eager_attention="eager_attention" in tokens,
                # `kernels` token reentrant_checkpoint: transformers' gradient_checkpointing with use_reentrant true
                reentrant_checkpoint="reentrant_checkpoint" in tokens,
                # `kernels` token param_offload: DeepSpeed ZeRO-3 offload_param (a zero3_offload config)
                param_offload="param_offload" in tokens)
    return model, cluster, workload, plan


def import_runs(folder: Path, spec: Transcribed) -> pl.DataFrame:
    """One `runs` row per `ok` row of the transcription."""
    folder = Path(folder)
    rows: list[dict[str, Any]] = []
    for line, r in read_rows(folder):
        if r["status"] == "skip":
            continue
        if r["status"] == "oom" and not spec.fit_outcomes:
            raise ValueError(f"{folder / CSV_NAME}:{line} ({r['row_id']}): an oom row needs a fit-outcome source")
        try:
            model, cluster, workload, plan = scenario_of(r)
        except (ValueError, KeyError) as e:  # PerfPredictError is a ValueError
            raise ValueError(f"{folder / CSV_NAME}:{line} ({r['row_id']}): {e}") from None
        flat, problem = scenario_row(model, cluster, workload, plan)
        step, mem = _float(r, "step_time_s"), _float(r, "peak_memory_gib")
        if r["status"] == "oom" and (step is not None or mem is not None):
            raise ValueError(f"{folder / CSV_NAME}:{line} ({r['row_id']}): an oom row has no step time or peak")
        if r["status"] == "ok" and step is None and mem is None and not spec.fit_outcomes:
            raise ValueError(f"{folder / CSV_NAME}:{line} ({r['row_id']}): an ok row needs a step time or a memory")
        if mem is not None and r["memory_kind"] not in MEMORY_KINDS:
            raise ValueError(f"{folder / CSV_NAME}:{line}: memory_kind {r['memory_kind']!r}; accepted: "
                             f"{', '.join(MEMORY_KINDS)}")
        tokens = workload.tokens_per_step
        ref = f"{r['upstream_path']}:{r['upstream_lines']}@{r['upstream_commit'][:12]}"
        notes = [f"scenario check: {problem}"] if problem else []
        refused = why_not(plan, model)
        if refused:  # a published run is a fact even where the capability table would not rank its plan
            notes.append(f"capability table: {refused}")
        if r["kernels"]:
            notes.append(f"kernels: {r['kernels']}")
        oom = oom_message(r)
        if oom:
            notes.append(oom)
        rows.append({
            **flat,
            "run_id": run_id(spec.upstream.folder, CSV_NAME, line, r["row_id"]),
            "outcome": r["status"], "error": (oom or "CUDA out of memory") if r["status"] == "oom" else None,
            "step_time_s": step,
            "tokens_per_s": None if step is None else tokens / step,
            "samples_per_s": None if step is None else workload.global_batch / step,
            "peak_memory_gib": mem,
            "peak_reserved_gib": mem if r["memory_kind"] == "reserved" else None,
            "memory_kind": MEMORY_KINDS.get(r["memory_kind"]) if mem is not None else None,
            **spec.upstream.provenance(spec.module, CSV_NAME, r["gpu"],
                                       {"gpu": r["gpu"], "gpus_per_node": _int(r, "gpus_per_node"),
                                        "nodes": _int(r, "nodes"),
                                        "intra_node_bw_gb_per_s": cluster.intra_node_bw_gb_per_s,
                                        "as_published": r["quote"]}),
            "collected_at": r["header_date"] or spec.upstream.date,
            "note": "; ".join(notes) or None,
            "upstream_ref": ref,
            "transcribed_row": r["row_id"],
            "kernels": r["kernels"] or None,
        })
    return runs_frame(rows)


def oom_message(r: dict[str, str]) -> str:
    """The OOM message's numbers of a row, as one line ("" where the row has none)."""
    vals = {k: (r.get(k) or "").strip() for k in OOM_COLUMNS}
    if not any(vals.values()):
        return ""
    names = {"oom_tried_gib": "tried to allocate", "oom_allocated_gib": "allocated by PyTorch",
             "oom_reserved_gib": "reserved by PyTorch", "oom_capacity_gib": "GPU capacity"}
    return "OOM message: " + ", ".join(f"{names[k]} {float(v):g} GiB" for k, v in vals.items() if v)


def listing(folder: Path) -> str:
    """SOURCE.md's row listing: every transcribed row, imported or skipped with its reason."""
    out = ["| row | upstream | status | as published | why left out |", "|---|---|---|---|---|"]
    for _, r in read_rows(folder):
        quote = r["quote"].replace("|", "\\|")
        out.append(f"| `{r['row_id']}` | `{r['upstream_path']}` lines {r['upstream_lines']} @ "
                   f"{r['upstream_commit'][:10]} | {r['status']} | "
                   f"{quote} | {r['skip_reason'] or '-'} |")
    return "\n".join(out)


def run(folder_root: Path, out_root: Path, spec: Transcribed) -> dict[str, int]:
    """Import one transcribed source from folder_root/<folder>/transcribed.csv into out_root/<folder> (usually the
    same folder: the transcription is committed beside what it yields; elsewhere it is copied along)."""
    folder = Path(folder_root) / spec.upstream.folder
    out = Path(out_root) / spec.upstream.folder
    counts = write_outputs(out, {"runs": import_runs(folder, spec)})
    if (out / CSV_NAME).resolve() != (folder / CSV_NAME).resolve():
        (out / CSV_NAME).write_text((folder / CSV_NAME).read_text(encoding="utf-8"), encoding="utf-8")
    text = spec.section.rstrip() + "\n\n## Every transcribed row\n\n" + listing(folder) + "\n"
    (out / "SOURCE.md").write_text(text)
    return counts
