"""`perfpredict generate rank|evaluate` and `perfpredict iteration`: vLLM layouts for generating preference data,
and how to split GPUs between generation and training in online DPO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.table import Table

from perfpredict.cli._util import (
    CsvOpt,
    DataOpt,
    EmitDirOpt,
    ExplainOpt,
    GlobalBatchOpt,
    GpuOpt,
    GpusPerNodeOpt,
    InputLenOpt,
    JsonOpt,
    ModelOpt,
    OutputLenOpt,
    PrecisionOpt,
    PredictorOpt,
    PromptsOpt,
    SamplesOpt,
    SeedOpt,
    TopOpt,
    check_outputs,
    command,
    console,
    generate_app,
    machine_readable,
    write_text,
)
from perfpredict.core.formatting import num, num_range, pct, seconds


def layout_table(df: pl.DataFrame, title: str) -> Table:
    t = Table(title=title)
    for h in ("#", "layout", "out tok/s [90%]", "per device", "total tok/s", "KV tokens/replica", "weights GiB/dev",
              "finish"):
        t.add_column(h, justify="left" if h == "layout" else "right")
    for x in df.iter_rows(named=True):
        lo, hi = x["output_tokens_per_s_interval"]
        t.add_row(str(x["rank"]), x["layout"], f"{num(x['output_tokens_per_s'])} [{num_range(lo, hi)}]",
                  num(x["output_tokens_per_s_per_gpu"]), num(x["total_tokens_per_s"]),
                  f"{x['kv_capacity_tokens']:,}", f"{x['weights_gib_per_rank']:.1f}", seconds(x["time_to_generate_s"]))
    return t


def flat_for_csv(df: pl.DataFrame) -> pl.DataFrame:
    """CSV cells hold one value: each [lo, hi] interval becomes its own _lo and _hi columns, and each part of a
    breakdown its own <column>_<part> column."""
    cols = []
    for c, t in df.schema.items():
        if isinstance(t, pl.List):
            cols += [pl.col(c).list.get(0).alias(f"{c}_lo"), pl.col(c).list.get(1).alias(f"{c}_hi")]
        elif isinstance(t, pl.Struct):
            cols += [pl.col(c).struct.field(f.name).alias(f"{c}_{f.name}") for f in t.fields]
        else:
            cols.append(pl.col(c))
    return df.select(cols)


def write_tables(df: pl.DataFrame, *, json_out: str | None, csv_out: str | None, top: int) -> None:
    if json_out:
        write_text(json_out, json.dumps(df.head(top).to_dicts(), default=str))
    if csv_out:
        write_text(csv_out, flat_for_csv(df).write_csv())


@command("rank", on=generate_app)
def generate_rank_cmd(
    model: ModelOpt,
    gpu: GpuOpt,
    prompts: PromptsOpt,
    gpus: Annotated[int, typer.Option(help="devices to lay replicas and stages over")] = 8,
    gpus_per_node: GpusPerNodeOpt = 8,
    samples_per_prompt: SamplesOpt = 1,
    input_len: InputLenOpt = 512,
    output_len: OutputLenOpt = 512,
    precision: PrecisionOpt = "bf16",
    max_num_seqs: Annotated[list[int] | None, typer.Option(help="only these max_num_seqs (repeatable)")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="vLLM's gpu_memory_utilization (GPUs)")] = 0.9,
    kv_space_gib: Annotated[float | None, typer.Option(help="VLLM_CPU_KVCACHE_SPACE per rank (CPU hosts only)")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="vLLM's --kv-cache-dtype: auto (the model data type; bf16 for an "
                                                     "FP8 checkpoint), fp8, fp8_e4m3, fp8_e5m2, bf16, fp16")] = "auto",
    engine: Annotated[str, typer.Option(help="serving engine: vllm, sglang or trtllm (kernels measured under vLLM; "
                                             "the others are composed from them, and the output says so)")] = "vllm",
    engine_version: Annotated[str | None, typer.Option(help="the engine's version (default: the one the "
                                                            "prediction describes, printed above the table)")] = None,
    top: TopOpt = 10,
    explain: ExplainOpt = False,
    json_out: JsonOpt = None,
    csv_out: CsvOpt = None,
    plot: Annotated[Path | None, typer.Option(help="KV capacity vs throughput PNG, one colour per TP degree")] = None,
    emit: Annotated[str | None, typer.Option(help="vllm: serve/offline scripts for #1")] = None,
    emit_dir: EmitDirOpt = Path("perfpredict-plan"),
    predictor: PredictorOpt = None,
) -> None:
    """Rank serving-engine layouts (TP, PP, replicas, max_num_seqs) by predicted generation throughput."""
    from perfpredict.api import rank_generation
    from perfpredict.core.errors import PerfPredictError, check_int
    from perfpredict.core.paths import writable_dir
    from perfpredict.predictor.generate import rank as gr

    check_int("--top", top, 1, 1 << 30)
    check_outputs(json_out=json_out, csv_out=csv_out, plot=plot)
    if emit is not None:
        if emit != "vllm":
            raise PerfPredictError(f"unknown --emit target {emit!r} for generation; accepted: vllm (training "
                                   "configs come from `perfpredict rank --emit`)")
        writable_dir("--emit-dir", emit_dir)
    say = (lambda *a, **k: None) if machine_readable(json_out, csv_out) else console.print
    r = rank_generation(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, prompts=prompts,
                        samples_per_prompt=samples_per_prompt, input_len=input_len, output_len=output_len,
                        precision=precision, max_num_seqs=max_num_seqs, kv_space_gib=kv_space_gib,
                        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
                        predictor=predictor, engine=engine, engine_version=engine_version)
    f = r.fitting
    say(gr.headline(r))
    if f.height:
        say(layout_table(f.head(top), f"top {min(top, f.height)} layouts by predicted output tokens/s"))
    if explain:
        say(gr.explain(r))
    elif f.height:
        say(gr.top_tie(r).sentence("output tok/s"))
    write_tables(r.table, json_out=json_out, csv_out=csv_out, top=top)
    if plot is not None:
        from perfpredict.predictor.plots import layouts_plot

        say(f"plot: {layouts_plot(r, plot)}")
    if emit:
        for p in gr.emit_vllm(r, out_dir=emit_dir):
            say(f"wrote {p}")


@command("iteration")
def iteration_cmd(
    model: ModelOpt,
    gpu: GpuOpt,
    prompts: PromptsOpt,
    gpus: Annotated[int, typer.Option(help="devices for the whole iteration (shared or split)")] = 8,
    gpus_per_node: GpusPerNodeOpt = 8,
    samples_per_prompt: SamplesOpt = 1,
    input_len: InputLenOpt = 512,
    output_len: OutputLenOpt = 512,
    precision: PrecisionOpt = "bf16",
    global_batch: GlobalBatchOpt = 64,
    seq_len: Annotated[int | None, typer.Option(help="DPO tokens per sequence (prompt + response); default input "
                                                     "+ output length")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="only these modes (repeatable): colocated, split, "
                                                        "split-async")] = None,
    top: TopOpt = 10,
    explain: ExplainOpt = False,
    json_out: JsonOpt = None,
    csv_out: CsvOpt = None,
    predictor: PredictorOpt = None,
) -> None:
    """Online DPO: generate with vLLM, hand the weights over, train; colocated (time-shared, with the engine's
    memory hand-over) and split layouts, fastest iteration first."""
    from perfpredict.api import rank_iteration
    from perfpredict.core.errors import check_int

    check_int("--top", top, 1, 1 << 30)
    check_outputs(json_out=json_out, csv_out=csv_out)
    say = (lambda *a, **k: None) if machine_readable(json_out, csv_out) else console.print
    rep = rank_iteration(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, prompts=prompts,
                         samples_per_prompt=samples_per_prompt, input_len=input_len, output_len=output_len,
                         precision=precision, global_batch=global_batch, seq_len=seq_len,
                         modes=tuple(mode) if mode else None, predictor=predictor)
    df = rep.table
    say(rep.headline)
    t = Table("#", "option", "layout", "train plan", "generate", "sync", "train", "iteration [90%]", "pairs/s",
              "idle", title=f"top {min(top, df.height)} options by predicted iteration time")
    for r in df.head(top).iter_rows(named=True):
        t.add_row(str(r["rank"]), r["option"], r["gen_layout"], r["train_plan"], seconds(r["generate_s"]),
                  seconds(r["sync_s"]), seconds(r["train_s"]),
                  f"{seconds(r['iteration_s'])} [{seconds(r['iteration_lo_s'])}-{seconds(r['iteration_hi_s'])}]",
                  num(r["pairs_per_s"]), pct(r["idle_gpu_share"], 0))
    say(t)
    say(rep.explain if explain else rep.tie.sentence("iteration time"))
    write_tables(df, json_out=json_out, csv_out=csv_out, top=top)


@command("evaluate", on=generate_app)
def generate_evaluate_cmd(
    data: DataOpt = Path("datasets"),
    seed: SeedOpt = 0,
    json_out: JsonOpt = None,
    save: Annotated[bool, typer.Option(help="save the model fitted on all rows as the shipped one")] = False,
    silicon: Annotated[bool, typer.Option(help="instead: the GPU composition from measured silicon against the "
                                               "silicon_sample serving runs (datasets/public/aiconfigurator_e2e)")]
    = False,
    markdown: Annotated[str | None, typer.Option("--markdown", metavar="<str>",
                                                 help="with --silicon: write the tables as markdown to FILE, or to "
                                                      "stdout with -")] = None,
) -> None:
    """Held-out accuracy of the generation model on measured vLLM runs (and refit it with --save); with --silicon,
    of the GPU composition on vLLM / SGLang / TensorRT-LLM serving runs, held out by model, GPU and backend.
    `perfpredict evaluate --phase generate` runs both."""
    from perfpredict.core.errors import PerfPredictError

    check_outputs(json_out=json_out)
    if markdown and not silicon:
        raise PerfPredictError("--markdown writes the silicon check's tables: add --silicon")
    if silicon:
        if save:
            raise PerfPredictError("--save refits the CPU-learned model; the silicon composition has nothing to save")
        check_markdown(json_out=json_out, markdown=markdown)
        res = silicon_evaluation(data=data, say=quiet_or_print(json_out=json_out, markdown=markdown))
        if json_out:
            write_text(json_out, json.dumps(res, indent=1, default=str))
        if markdown:
            from perfpredict.train.generate_silicon import silicon_markdown

            write_text(markdown, silicon_markdown(res))
        return
    say = quiet_or_print(json_out=json_out)
    res, model = cpu_evaluation(data=data, seed=seed, say=say)
    if json_out:
        write_text(json_out, json.dumps(res, indent=1, default=str))
    if save:
        say(f"saved the model trained on all rows to {model.save()}")


def check_markdown(*, json_out: str | None, markdown: str | None) -> None:
    """`--markdown FILE|-` is checked before the work starts; stdout carries one of --json and --markdown."""
    from perfpredict.core.errors import PerfPredictError

    if markdown and str(markdown) == "-" and json_out and str(json_out) == "-":
        raise PerfPredictError("--json - and --markdown - both write to stdout: give one of them a file name")
    if markdown and str(markdown) != "-":
        from perfpredict.core.paths import writable_file

        writable_file("--markdown", markdown)


def quiet_or_print(*, json_out: str | None, markdown: str | None = None):
    """The tables go to stdout unless stdout carries the JSON or the markdown."""
    if machine_readable(json_out) or (markdown and str(markdown) == "-"):
        return lambda *a, **k: None
    return console.print


def silicon_evaluation(*, data: Path, say) -> dict:
    """The silicon end-to-end check (train.generate_silicon.evaluate_silicon) with its baselines, its tables said."""
    from perfpredict.train.generate_silicon import evaluate_silicon

    res = evaluate_silicon(data)
    for line in silicon_report(res):
        say(line)
    return res


def cpu_evaluation(*, data: Path, seed: int, say) -> tuple[dict, object]:
    """The CPU-learned generation model on held-out measured vLLM runs (train.generate.evaluate) beside the rule of
    thumb, its tables said; returns the result (JSON-ready) and the model fitted on all rows."""
    from perfpredict.train.generate import evaluate, vidur_root

    res = evaluate(data, seed=seed)
    model = res.pop("model")
    say(f"{res['rows']:,} measured vLLM rows ({res['ok_rows']:,} ok) -> {res['configs']:,} configurations "
        f"(median of gated repeats; repeat spread median CV {pct(res['repeat_cv_median'])})")
    kv = res["kv_capacity"]
    say(f"KV capacity vs the engine's log line, {kv['engines']} engines: max error {pct(kv['max_rel_err'], 2)}, "
        f"mean {pct(kv['mean_rel_err'], 2)}")
    g = res.get("kv_capacity_gpu_logged")
    if g:
        say(f"KV capacity vs vLLM-logged GPU figures ({g['rows']} rows, datasets/public/vllm_logged_kv): "
            f"{g['within_2pct']} within 2 %, median error {pct(g['median_rel_err'], 2)}, worst "
            f"{pct(g['max_rel_err'])} ({g['worst']})")
    t = Table("held out", "train", "test", "MAPE", "median APE", "MAPE w/o correction", "best layout", "within 5%",
              "within noise", "regret", "rule: best", "within 5%", "regret", "cases",
              title="output tokens/s on held-out vLLM runs; layout choice beside the rule of thumb (smallest TP that "
                    "fits, then replicas)")
    for s in res["splits"]:
        t.add_row(s["split"], f"{s['train_rows']:,}", f"{s['test_rows']:,}", pct(s["mape"]), pct(s["median_ape"]),
                  pct(s["mape_without_correction"]), pct(s["best_exact"], 0), pct(s["best_within_5pct"], 0),
                  pct(s["best_within_noise"], 0), pct(s["mean_regret"]), pct(s.get("rule_best_exact"), 0),
                  pct(s.get("rule_best_within_5pct"), 0), pct(s.get("rule_mean_regret")), str(s["cases"]))
    say(t)
    for s in res["splits"]:
        rr = s.get("repeat_resampled")
        if rr:
            say(f"{s['split']}, each configuration labelled by one of its own repeats ({rr['draws']:,} draws): best "
                f"within 5 % {pct(rr['pred_within_5pct_mean'], 0)} [{pct(rr['pred_within_5pct_lo'], 0)}-"
                f"{pct(rr['pred_within_5pct_hi'], 0)}] predicted vs {pct(rr['rule_within_5pct_mean'], 0)} "
                f"[{pct(rr['rule_within_5pct_lo'], 0)}-{pct(rr['rule_within_5pct_hi'], 0)}] by the rule; the "
                f"prediction does at least as well in {pct(rr['pred_not_worse_share'], 0)} of draws")
    if "vidur_decode_layer" in res:
        t = Table("gpu", "layers x tp x tokens", "median composed/measured", "mean |error|", "p90 |error|",
                  title="GPU decode layer (GEMMs, norms, activation, residual) vs Vidur's per-op profiles "
                        f"({vidur_root(data)})")
        for r in res["vidur_decode_layer"]:
            t.add_row(r["gpu"], f"{r['n']:,}", f"{r['median']:.3f}", pct(r["mape"]), pct(r["p90"]))
        say(t)
    return res, model


def silicon_report(res: dict) -> list:
    """The tables `generate evaluate --silicon` prints: errors per held-out group, composition and correction,
    dense and MoE apart; layout choice beside the rule of thumb and a roofline."""
    out: list = [f"{res['rows']:,} measured serving runs composed from their GPU's kernels; left out: "
                 + "; ".join(f"{k} ({v:,})" for k, v in res["skipped"].items())]
    t = Table("held out", "kind", "runs", "TPOT MAPE", "TTFT MAPE", "TTFT corrected", "tok/s per GPU MAPE",
              "corrected", "roofline", title="composition (no fitted part) on held-out groups; the correction "
                                             "refitted without the group")
    for s in res["splits"]:
        for kind in ("dense", "moe"):
            c, k = s["composition"].get(kind), s["corrected"].get(kind)
            if not c:
                continue
            t.add_row(f"{s['split']}: {s['held_out']}", kind, f"{c['rows']:,}", pct(c["tpot_mape"]),
                      pct(c["ttft_mape"]), pct(k["ttft_mape"]), pct(c["throughput_mape"]), pct(k["throughput_mape"]),
                      pct(c["roofline_throughput_mape"]))
    for kind in ("dense", "moe"):
        c = res["composition"].get(kind)
        if c:
            t.add_row("all", kind, f"{c['rows']:,}", pct(c["tpot_mape"]), pct(c["ttft_mape"]), "",
                      pct(c["throughput_mape"]), "", pct(c["roofline_throughput_mape"]))
    out.append(t)
    lay = res["layout_composition"]
    lt = Table("chooser", "best within 5 %", "mean regret", title=f"TP choice in {lay['groups']} groups (backend x "
               "model x GPU x format x isl/osl, >= 2 TP degrees measured)")
    lt.add_row("composition", pct(lay["pred_within_5pct"], 0), pct(lay["pred_mean_regret"]))
    lt.add_row("rule: smallest TP that fits", pct(lay["rule_within_5pct"], 0), pct(lay["rule_mean_regret"]))
    lt.add_row("roofline", pct(lay["roof_within_5pct"], 0), pct(lay["roof_mean_regret"]))
    out.append(lt)
    pb = res.get("prefill_bound")
    if pb and pb["rows"]:
        w = pb["composition_without"]
        out.append(f"{pb['rows']} runs live shorter than the composed prefill of their prompts alone (a closed loop of "
                   f"fresh prompts cannot; {'; '.join(pb['by_model'])}): without them tok/s per GPU "
                   f"{pct(w['dense']['throughput_mape'])} dense, {pct(w['moe']['throughput_mape'])} MoE")
    for split in ("model", "gpu", "backend"):
        u = res.get(f"held_out_{split}", {}).get("as_used")
        if u and "dense" in u and "moe" in u:
            out.append(f"held out by {split}, as used (the correction only where used): tok/s per GPU "
                       f"{pct(u['dense']['throughput_mape'])} dense, {pct(u['moe']['throughput_mape'])} MoE; TTFT "
                       f"{pct(u['dense']['ttft_mape'])} dense, {pct(u['moe']['ttft_mape'])} MoE")
    used = res["correction_used"]
    for q, what in (("tpot", "TPOT / throughput (a scale per backend x dense/MoE)"),
                    ("ttft", "TTFT (grouped returns + opening burst + a fixed front-end time + a host time per "
                             "running stream, pooled over backends)")):
        out.append(f"learned correction of {what}: " + ("used: it lowers the held-out error on every split"
                                                         if used[q] else "not used: it does not lower the held-out "
                                                                         "error on every split"))
    return out
