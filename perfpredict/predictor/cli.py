"""`perfpredict rank` and `perfpredict predict`: thin typer commands over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.table import Table

from perfpredict.core.console import stderr_console, stdout_console
from perfpredict.core.errors import PerfPredictError, check_int, check_number
from perfpredict.core.paths import writable_dir, writable_file

console = stdout_console()
err = stderr_console(piped_width=None)
JSON_HELP = "write JSON to FILE, or to stdout with -"
PREDICT_KEYS = ("step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_gib", "fits", "mfu",
                "step_time_interval_s", "peak_memory_interval_gib", "breakdown", "dominant")


def _fmt_h(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h * 60:.0f} min" if h < 1 else (f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} d")


def _table(df: pl.DataFrame, unit: str, title: str) -> Table:
    t = Table(title=title)
    for h in ("#", "plan", f"{unit}/s", "finish", "peak GiB [90%]", "MFU", "dominated by"):
        t.add_column(h, justify="right" if h not in ("plan", "dominated by") else "left")
    for r in df.iter_rows(named=True):
        t.add_row(str(r["rank"]), r["plan"], f"{r['samples_per_s']:.3g}", _fmt_h(r["time_to_finish_h"]),
                  f"{r['peak_memory_gib']:.1f} [{r['peak_memory_lo_gib']:.1f}-{r['peak_memory_hi_gib']:.1f}]",
                  f"{100 * r['mfu']:.0f}%", r["dominant"])
    return t


def _explain(df: pl.DataFrame, unit: str) -> str:
    if df.height < 2:
        return "only one plan fits: nothing to compare"
    a, b = df.row(0, named=True), df.row(1, named=True)
    parts = [("compute", "b_compute_s"), ("TP communication", "b_tp_comm_s"), ("DP communication", "b_dp_comm_s"),
             ("pipeline communication", "b_pp_comm_s"), ("pipeline bubble", "b_bubble_s"),
             ("optimizer/offload", "b_optimizer_s")]
    diffs = sorted(((b[k] - a[k], name) for name, k in parts), reverse=True)
    lines = [f"#1 {a['plan']}: {a['samples_per_s']:.3g} {unit}/s, step {a['step_time_s']:.3g} s, "
             f"{a['peak_memory_gib']:.1f} GiB",
             f"#2 {b['plan']}: {b['samples_per_s']:.3g} {unit}/s, step {b['step_time_s']:.3g} s, "
             f"{b['peak_memory_gib']:.1f} GiB",
             f"#1 is {100 * (a['samples_per_s'] / b['samples_per_s'] - 1):.1f}% faster. Per step (s), #1 vs #2:"]
    for name, k in parts:
        lines.append(f"  {name:<24} {a[k]:8.3f} vs {b[k]:8.3f}")
    gain, why = diffs[0]
    if gain > 0:
        lines.append(f"The main gain is {why} ({gain:.3f} s less per step).")
    lines.append(f"Memory: states {a['mem_states_gib']:.1f} vs {b['mem_states_gib']:.1f}, activations "
                 f"{a['mem_activations_gib']:.1f} vs {b['mem_activations_gib']:.1f}, logits "
                 f"{a['mem_logits_gib']:.1f} vs {b['mem_logits_gib']:.1f}, reference {a['mem_reference_gib']:.1f} vs "
                 f"{b['mem_reference_gib']:.1f}, gathered parameters {a['mem_other_gib']:.1f} vs "
                 f"{b['mem_other_gib']:.1f} GiB (the peak rank's parts; they add up to its peak).")
    return "\n".join(lines)


def rank_cmd(
    model: Annotated[str, typer.Option(help="catalog name or config.json path")],
    gpu: Annotated[str, typer.Option(help="GPU catalog name (`perfpredict catalog gpus`)")],
    gpus: Annotated[str, typer.Option(help="total GPUs, or 'auto' with --target-pairs-per-s")] = "8",
    gpus_per_node: Annotated[int, typer.Option()] = 8,
    intra_node_bw: Annotated[float, typer.Option(help="GB/s per GPU inside a node (default: the GPU's)")] = 0.0,
    inter_node_bw: Annotated[float, typer.Option(help="GB/s per GPU between nodes (default: the GPU's)")] = 0.0,
    objective: Annotated[str, typer.Option(help="dpo | ipo | simpo | orpo | kto | sft | pretrain")] = "dpo",
    pairs: Annotated[int, typer.Option(help="dataset size: pairs (preference) or samples")] = 0,
    epochs: Annotated[float, typer.Option()] = 1.0,
    seq_len: Annotated[int, typer.Option(help="tokens per sequence (prompt + response)")] = 2048,
    global_batch: Annotated[int, typer.Option(help="pairs (preference) or sequences per optimizer step")] = 64,
    reference: Annotated[str, typer.Option(help="live | precomputed | offloaded | none (default by objective)")] = "",
    precision: Annotated[str, typer.Option(help="bf16 | fp16 | fp32")] = "bf16",
    framework: Annotated[list[str] | None, typer.Option(help="only these frameworks (repeatable)")] = None,
    target_pairs_per_s: Annotated[float, typer.Option(help="throughput target (pairs/s, or samples/s)")] = 0.0,
    top: Annotated[int, typer.Option(help="rows to show")] = 10,
    explain: Annotated[bool, typer.Option(help="why #1 beats #2")] = False,
    json_out: Annotated[str | None, typer.Option("--json", help=JSON_HELP)] = None,
    csv_out: Annotated[str | None, typer.Option("--csv", help="write the whole ranking as CSV (FILE or -)")] = None,
    plot: Annotated[Path | None, typer.Option(help="memory vs throughput PNG with the Pareto front")] = None,
    emit: Annotated[str | None, typer.Option(help="deepspeed | fsdp | megatron | trl | torchrun: configs for #1")] = None,
    emit_dir: Annotated[Path, typer.Option(help="where --emit writes")] = Path("perfpredict-plan"),
    predictor: Annotated[Path | None, typer.Option(help="a trained predictor folder (default: the shipped one)")] = None,
    phase: Annotated[str, typer.Option(help="train | generate (vLLM layouts) | iteration (online DPO split)")] = "train",
    prompts: Annotated[int, typer.Option(help="generate/iteration: prompts to generate for")] = 0,
    samples_per_prompt: Annotated[int, typer.Option(help="generate/iteration: responses per prompt (n)")] = 1,
    input_len: Annotated[int, typer.Option(help="generate/iteration: prompt tokens")] = 512,
    output_len: Annotated[int, typer.Option(help="generate/iteration: tokens generated per response")] = 512,
    max_num_seqs: Annotated[list[int] | None, typer.Option(help="generate: only these max_num_seqs (repeatable)")] = None,
    kv_space_gib: Annotated[float | None, typer.Option(help="generate on CPU: VLLM_CPU_KVCACHE_SPACE per rank")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="generate: vLLM's gpu_memory_utilization")] = 0.9,
) -> None:
    """Rank every legal plan by predicted throughput; drop those predicted not to fit.

    --phase generate ranks vLLM layouts (TP, PP, replicas, max_num_seqs) by generation throughput; --phase
    iteration splits the GPUs between generation and DPO training."""
    from perfpredict.api import rank_report
    from perfpredict.predictor.emit import TARGETS

    if phase != "train":
        from perfpredict.predictor.generate_cli import run_rank

        if gpus == "auto" or not gpus.isdigit():
            raise PerfPredictError(f"--phase {phase} needs --gpus N, got {gpus!r}")
        return run_rank(model=model, gpu=gpu, gpus=int(gpus), gpus_per_node=gpus_per_node, phase=phase,
                        prompts=prompts, samples_per_prompt=samples_per_prompt, input_len=input_len,
                        output_len=output_len, precision=precision, max_num_seqs=max_num_seqs,
                        kv_space_gib=kv_space_gib, gpu_memory_utilization=gpu_memory_utilization,
                        global_batch=global_batch, top=top, explain_=explain, json_out=json_out, csv_out=csv_out,
                        plot=plot, emit=emit, emit_dir=emit_dir, predictor=predictor)

    if json_out == "-" and csv_out == "-":
        raise PerfPredictError("--json - and --csv - both write to stdout: give one of them a file name")
    if gpus != "auto" and not (gpus.isdigit() and int(gpus) > 0):
        raise PerfPredictError(f"--gpus must be a positive integer or 'auto', got {gpus!r}")
    check_int("--top", top, 1, 1 << 30)
    check_number("--target-pairs-per-s", target_pairs_per_s, 0.0, 1e12)
    if gpus == "auto" and target_pairs_per_s <= 0:
        raise PerfPredictError("--gpus auto needs --target-pairs-per-s")
    # Everything the command will write is checked before the ranking work starts.
    for opt, path in (("--json", json_out), ("--csv", csv_out), ("--plot", plot)):
        if path is not None and str(path) != "-":
            writable_file(opt, path)
    if emit is not None:
        if emit not in TARGETS:
            raise PerfPredictError(f"unknown --emit target {emit!r}; accepted: {', '.join(TARGETS)}")
        writable_dir("--emit-dir", emit_dir)
    machine = json_out == "-" or csv_out == "-"
    say = (lambda *a, **k: None) if machine else console.print
    rep = rank_report(model=model, gpu=gpu, gpus=None if gpus == "auto" else int(gpus), gpus_per_node=gpus_per_node,
                      intra_node_bw=intra_node_bw, inter_node_bw=inter_node_bw, objective=objective,
                      dataset_size=pairs, epochs=epochs, seq_len=seq_len, global_batch=global_batch,
                      reference=reference, precision=precision, frameworks=framework,
                      target_samples_per_s=target_pairs_per_s, predictor=predictor)
    r = rep.ranking
    unit = "pairs" if r.workload.is_preference else "samples"
    fit = r.fitting
    say(f"{r.model.name} on {r.cluster.gpus} x {r.cluster.gpu.name} ({r.cluster.nodes} node(s)), "
        f"{r.workload.objective}, seq {r.workload.seq_len}, global batch {r.workload.global_batch} {unit}, "
        f"reference {r.workload.reference}")
    say(f"{r.table.height} legal plans ({r.rejections.total} candidates rejected); {fit.height} predicted to fit, "
        f"{r.table.height - fit.height} dropped as out of memory")
    for note in rep.notes:
        say(note)
    if fit.height:
        say(_table(fit.head(top), unit, f"top {min(top, fit.height)} plans by predicted {unit}/s"))
    if r.misses.height:
        miss = r.misses.head(3)
        say(f"closest misses (a plan fits when its predicted peak x {1 + r.oom_margin:.2f}, the margin calibrated on "
            "held-out OOM outcomes, stays within GPU memory): "
            + "; ".join(f"{m['plan']} needs {m['peak_memory_gib']:.1f} GiB of {m['g_memory_gib']:.0f}"
                        for m in miss.iter_rows(named=True)))
    if explain and fit.height:
        say(_explain(fit, unit))
    if json_out:
        text = json.dumps(r.table.to_dicts(), default=str)
        (sys.stdout.write(text + "\n") if json_out == "-" else Path(json_out).write_text(text))
    if csv_out:
        (sys.stdout.write(r.table.write_csv()) if csv_out == "-" else r.table.write_csv(csv_out))
    if plot is not None:
        from perfpredict.predictor.plots import pareto_plot

        say(f"plot: {pareto_plot(r, plot)}")
    if emit:
        if not fit.height:
            raise PerfPredictError("nothing fits, so there is no plan to emit")
        from perfpredict.api import emit_winner

        rank_no, paths = emit_winner(ranking=r, target=emit, out_dir=emit_dir)
        say(f"emitting plan #{rank_no} for {emit}" + ("" if rank_no == 1 else
                                                       f" (#1 cannot be run by {emit}; #{rank_no} is the best it can)"))
        for p in paths:
            say(f"wrote {p}")


def predict_cmd(
    file: Annotated[Path, typer.Argument(help="one scenario (JSON), a JSON list, or JSON Lines")],
    json_out: Annotated[str | None, typer.Option("--json", help=JSON_HELP)] = None,
    predictor: Annotated[Path | None, typer.Option(help="a trained predictor folder")] = None,
) -> None:
    """One answer per scenario, in order: its prediction, or its error (exit code 2 if any scenario is invalid).
    Training scenarios, or `"phase": "generate"` ones (a file holds one kind)."""
    from perfpredict.api import predict_file_items
    from perfpredict.core.generate import is_generate
    from perfpredict.core.scenario import load_scenarios

    if json_out not in (None, "-"):
        writable_file("--json", json_out, not_same_as=file)
    try:
        dicts = load_scenarios(file)
    except PerfPredictError:
        dicts = []  # a bad line: predict_file_items answers every line, the bad ones with their error
    if any(is_generate(d) for d in dicts if isinstance(d, dict)):
        from perfpredict.predictor.generate_cli import predict_generate_dicts, print_predictions

        if not all(isinstance(d, dict) and is_generate(d) for d in dicts):
            raise PerfPredictError(f"{file} mixes generation and training scenarios; put them in separate files")
        return print_predictions(predict_generate_dicts(dicts), json_out)
    answers = predict_file_items(path=file, predictor=predictor)
    bad = [it for it, _ in answers if it.error]
    if len(answers) == 1 and bad and not json_out:
        raise PerfPredictError(bad[0].error)  # one scenario: its error is the whole answer
    if json_out:
        lines = [json.dumps({k: p.to_dict()[k] for k in PREDICT_KEYS} | it.location()) if p is not None else
                 json.dumps({"error": it.error, **it.location()}) for it, p in answers]
        text = "\n".join(lines) + "\n"
        sys.stdout.write(text) if json_out == "-" else Path(json_out).write_text(text)
    else:
        t = Table("#", "step s [90%]", "tokens/s", "samples/s", "peak GiB [90%]", "fits", "MFU", "dominated by")
        for it, p in answers:
            where = f"{it.where} {it.at}"
            if p is None:
                t.add_row(where, "[red]invalid[/]", "-", "-", "-", "-", "-", "-")
                continue
            t.add_row(where, f"{p.step_time_s:.3g} [{p.step_time_interval_s[0]:.3g}-{p.step_time_interval_s[1]:.3g}]",
                      f"{p.tokens_per_s:.4g}", f"{p.samples_per_s:.4g}",
                      f"{p.peak_memory_gib:.1f} [{p.peak_memory_interval_gib[0]:.1f}-"
                      f"{p.peak_memory_interval_gib[1]:.1f}]", "yes" if p.fits else "NO", f"{100 * p.mfu:.0f}%",
                      p.dominant)
        console.print(t)
    if bad:
        for it in bad if len(answers) > 1 else []:
            err.print(f"{it.where} {it.at}: {it.error}", markup=False, highlight=False, soft_wrap=True)
        raise PerfPredictError(f"{len(bad)} of {len(answers)} scenarios are invalid "
                               f"({', '.join(f'{it.where} {it.at}' for it in bad[:10])}"
                               f"{', ...' if len(bad) > 10 else ''}); the others were answered")
