"""`perfpredict rank`: every legal training plan ranked by predicted throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.table import Table

from perfpredict.cli._util import (
    CsvOpt,
    EmitDirOpt,
    ExplainOpt,
    FrameworkOpt,
    GlobalBatchOpt,
    GpuOpt,
    GpusPerNodeOpt,
    InterBwOpt,
    IntraBwOpt,
    JsonOpt,
    ModelOpt,
    ObjectiveOpt,
    PrecisionOpt,
    PredictorOpt,
    SeqLenOpt,
    TopOpt,
    check_outputs,
    command,
    console,
    machine_readable,
    write_text,
)
from perfpredict.core.formatting import hours, num


def _risk(p: float) -> str:
    return "<1%" if p < 0.01 else f"{100 * p:.0f}%"


def plan_table(df: pl.DataFrame, unit: str, title: str) -> Table:
    """The ranked plans; "headroom" is GPU memory minus the predicted peak, "host GiB" what an offload plan's
    node pins in host RAM (a column only when a shown plan offloads)."""
    host = "host_ram_gib" in df.columns and bool((df["host_ram_gib"] > 0).any())
    # P(stall) (models.stall) only when a shown plan's pipeline may stall: the throughput is then the expectation
    # over the stall-free and the stalled regime.
    stall = "stall_risk" in df.columns and bool((df["stall_risk"] >= 0.005).any())
    t = Table(title=title)
    heads = ["#", "plan", f"{unit}/s", "finish", "peak GiB [90%]", "fit (P OOM)", "headroom"] + (
        ["host GiB"] if host else []) + (["P(stall)"] if stall else [])
    for h in [*heads, "MFU", "dominated by"]:
        t.add_column(h, justify="right" if h not in ("plan", "dominated by") else "left")
    for r in df.iter_rows(named=True):
        extra = ([(f"{r['host_ram_gib']:,.0f}" if r["host_ram_gib"] > 0 else "-")] if host else []) + (
            [_risk(r["stall_risk"])] if stall else [])
        t.add_row(str(r["rank"]), r["plan"], num(r["samples_per_s"]), hours(r["time_to_finish_h"]),
                  f"{r['peak_memory_gib']:.1f} [{r['peak_memory_lo_gib']:.1f}-{r['peak_memory_hi_gib']:.1f}]",
                  f"{r['fit_verdict']} ({_risk(r['oom_risk'])})", f"{r['headroom_gib']:.1f}", *extra,
                  f"{100 * r['mfu']:.0f}%", r["dominant"])
    return t


@command("rank")
def rank_cmd(
    model: ModelOpt,
    gpu: GpuOpt,
    gpus: Annotated[str, typer.Option(help="total GPUs, or 'auto': the fewest with a plan that fits (that meets "
                                           "--target-pairs-per-s when given)")] = "8",
    gpus_per_node: GpusPerNodeOpt = 8,
    host_ram_gib: Annotated[float, typer.Option(help="host RAM per node in GiB, which offload plans must fit in "
                                                     "(default: the GPU's usual node, e.g. DGX H100 2,048)")] = 0.0,
    intra_node_bw: IntraBwOpt = 0.0,
    inter_node_bw: InterBwOpt = 0.0,
    objective: ObjectiveOpt = "dpo",
    pairs: Annotated[int, typer.Option(help="dataset size: pairs (preference) or samples")] = 0,
    epochs: Annotated[float, typer.Option(help="passes over the dataset")] = 1.0,
    seq_len: SeqLenOpt = 2048,
    peak_seq_len: Annotated[int, typer.Option(help="padded batches of varying length: the longest micro-batch's "
                                                   "padded length, which the peak memory is composed at (seq_len "
                                                   "stays the mean the step time follows); 0 = every batch seq_len "
                                                   "long, e.g. packed")] = 0,
    global_batch: GlobalBatchOpt = 64,
    reference: Annotated[str, typer.Option(help="live | precomputed | offloaded | none (default by objective)")] = "",
    precision: PrecisionOpt = "bf16",
    optimizer: Annotated[str, typer.Option(help="the optimizer as transformers' `optim` names it: adamw_torch, "
                                                "adamw_torch_fused, adamw_bnb_8bit, paged_adamw_8bit ... (default: "
                                                "each framework's own)")] = "",
    seq_len_cv: Annotated[float, typer.Option(help="padded batches: spread (std / mean) of the padded length a "
                                                   "rank's micro-batch gets, --seq-len the mean; 0 = packed")] = 0.0,
    framework: FrameworkOpt = None,
    target_pairs_per_s: Annotated[float, typer.Option(help="throughput target (pairs/s, or samples/s)")] = 0.0,
    top: TopOpt = 10,
    explain: ExplainOpt = False,
    json_out: JsonOpt = None,
    csv_out: CsvOpt = None,
    plot: Annotated[Path | None, typer.Option(help="memory vs throughput PNG with the Pareto front")] = None,
    emit: Annotated[str | None, typer.Option(help="deepspeed | fsdp | fsdp2 | megatron | trl | torchrun: configs for #1")] = None,
    emit_dir: EmitDirOpt = Path("perfpredict-plan"),
    predictor: PredictorOpt = None,
) -> None:
    """Rank every legal training plan by predicted throughput; drop those predicted not to fit.

    vLLM generation layouts: `perfpredict generate rank`; online DPO splits: `perfpredict iteration`."""
    from perfpredict.api import check_emit_target, rank_report
    from perfpredict.core.errors import PerfPredictError, check_int, check_number
    from perfpredict.core.paths import writable_dir

    if gpus != "auto" and not (gpus.isdigit() and int(gpus) > 0):
        raise PerfPredictError(f"--gpus must be a positive integer or 'auto', got {gpus!r}")
    check_int("--top", top, 1, 1 << 30)
    check_number("--target-pairs-per-s", target_pairs_per_s, 0.0, 1e12)
    check_number("--host-ram-gib (0 = the GPU's node default)", host_ram_gib, 0.0, 1e7)
    check_outputs(json_out=json_out, csv_out=csv_out, plot=plot)
    if emit is not None:
        check_emit_target(target=emit, frameworks=framework)
        writable_dir("--emit-dir", emit_dir)
    say = (lambda *a, **k: None) if machine_readable(json_out, csv_out) else console.print
    rep = rank_report(model=model, gpu=gpu, gpus=None if gpus == "auto" else int(gpus), gpus_per_node=gpus_per_node,
                      intra_node_bw=intra_node_bw, inter_node_bw=inter_node_bw, objective=objective,
                      dataset_size=pairs, epochs=epochs, seq_len=seq_len, global_batch=global_batch,
                      reference=reference, precision=precision, frameworks=framework,
                      target_samples_per_s=target_pairs_per_s, predictor=predictor, host_ram_gib=host_ram_gib,
                      optimizer=optimizer, seq_len_cv=seq_len_cv, peak_seq_len=peak_seq_len)
    r = rep.ranking
    unit = "pairs" if r.workload.is_preference else "samples"
    fit = r.fitting
    say(rep.headline)
    for note in rep.notes:
        say(note)
    if fit.height:
        # ordered by the expected throughput over the pipeline-stall regimes (models.stall): with a stall risk
        # shown, the order can differ from the column's stall-free figure
        stalls = "stall_risk" in fit.columns and bool((fit.head(top)["stall_risk"] >= 0.005).any())
        say(plan_table(fit.head(top), unit, f"top {min(top, fit.height)} plans by predicted {unit}/s"
                       + (" (expected over P(stall))" if stalls else "")))
    if r.misses.height:
        say(rep.misses)
    if explain and fit.height:
        say(rep.explain)
    if json_out:
        write_text(json_out, json.dumps(r.table.head(top).to_dicts(), default=str))
    if csv_out:
        write_text(csv_out, r.table.write_csv())
    if plot is not None:
        from perfpredict.predictor.plots import pareto_plot

        say(f"plot: {pareto_plot(r, plot)}")
    if emit:
        from perfpredict.api import emit_winner

        if not fit.height:
            raise PerfPredictError("nothing fits, so there is no plan to emit")
        rank_no, paths = emit_winner(ranking=r, target=emit, out_dir=emit_dir)
        say(f"emitting plan #{rank_no} for {emit}" + ("" if rank_no == 1 else
                                                       f" (#1 cannot be run by {emit}; #{rank_no} is the best it can)"))
        for p in paths:
            say(f"wrote {p}")
