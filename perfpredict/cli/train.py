"""`perfpredict train`, `evaluate`, `import-public` and `report`: fit the predictor on measurements, score it on
held-out splits, ingest published data, and write the accuracy page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from perfpredict.cli._util import (
    DataOpt,
    JsonOpt,
    SeedOpt,
    check_outputs,
    command,
    console,
    machine_readable,
    write_text,
)
from perfpredict.core.console import stderr_console
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.formatting import missing, pct

TABLE_COLUMNS = (
    ("variant", "variant"), ("split", "split"), ("source", "source"), ("trl_mode", "TRL trainer x reference"),
    ("fold", "held-out host"), ("time_n", "n"), ("time_mape", "MAPE"), ("time_bias", "bias"), ("time_median_ape", "med"), ("time_p90_ape", "p90"),
    ("time_composed_mape", "composed"), ("time_composed_bias", "bias"), ("time_analytic_mape", "analytic"), ("time_coverage", "cover90"),
    ("time_interval_ratio", "width"), ("time_weight_mean", "applic."), ("mem_n", "mem n"), ("mem_mape", "mem MAPE"),
    ("mem_analytic_mape", "analytic"), ("mem_coverage", "cover90"), ("mem_interval_ratio", "width"),
    ("false_oom", "false OOM"), ("false_oom_analytic", "analytic"), ("missed_oom", "missed OOM"),
    ("missed_oom_analytic", "analytic"),
    ("at_risk", "at risk"), ("failed_unknown_n", "failed ?"), ("failed_unknown_fits", "called fits"),
    ("missed_oom_implied", "implied OOM called fits"), ("rank_spearman", "Spearman"), ("rank_top1_regret", "regret"),
)
PLAIN = {"time_n", "mem_n", "rank_spearman", "time_weight_mean", "failed_unknown_n"}
RATIO = {"time_interval_ratio", "mem_interval_ratio"}  # median high/low of the 90 % interval


def _progress(*, quiet: bool = False) -> Progress:
    # Progress goes to stderr, so a table or JSON on stdout stays clean.
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=stderr_console(), transient=True, disable=quiet)


def metrics_table(df: pl.DataFrame, title: str) -> Table:
    t = Table(title=title)
    cols = [(k, h) for k, h in TABLE_COLUMNS if k in df.columns]
    for _, h in cols:
        t.add_column(h, justify="right")
    for r in df.iter_rows(named=True):
        cells = []
        for col, _ in cols:
            v = r.get(col)
            if missing(v):
                cells.append("-")
            elif isinstance(v, float):
                cells.append(f"{v:.2f}" if col in PLAIN else f"{v:.2f}x" if col in RATIO else pct(v))
            else:
                cells.append(f"{v:,}" if isinstance(v, int) else str(v))
        t.add_row(*cells)
    return t


@command("train")
def train_cmd(
    data: DataOpt = Path("datasets"),
    out: Annotated[Path, typer.Option(help="where to write the trained predictor")] = Path("out/predictor"),
    seed: SeedOpt = 0,
    evaluate_too: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="store held-out metrics in metadata")] = False,
) -> None:
    """Train the kernel and plan-level models and save them (xgboost JSON + metadata.json)."""
    from perfpredict.train.api import train, training_summary

    with _progress() as prog:
        task = prog.add_task("training", total=None)
        path = train(data=data, out=out, seed=seed, evaluate_too=evaluate_too,
                     progress=lambda m: prog.update(task, description=m))
    console.print(training_summary(path))


@command("evaluate")
def evaluate_cmd(
    data: DataOpt = Path("datasets"),
    seed: SeedOpt = 0,
    split: Annotated[list[str] | None, typer.Option(help="splits to run (repeat): model, width, scale, hardware, "
                                                          "trl-shape, trl-host, largest (the test partition); "
                                                          "default all")] = None,
    variant: Annotated[list[str] | None, typer.Option(help="correction variants to compare (repeat): absolute, "
                                                            "scale-free, scale-free+domain (shipped)")] = None,
    subset: Annotated[int, typer.Option(help="evaluate on a random subset of N runs (quick check)")] = 0,
    source: Annotated[list[str] | None, typer.Option(help="only these sources' runs and their hardware's probes "
                                                          "(repeat), e.g. ours-cpu + ours-cpu-trl")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a predicted-vs-measured PNG (needs the plot extra)")] = None,
    held_out_source: Annotated[list[str] | None, typer.Option(
        help="score the shipped predictor on whole sources it was not trained on (repeat), per source and per "
             "model, without refitting; e.g. msswift_examples, nemo_automodel")] = None,
    refit: Annotated[bool, typer.Option("--refit", help="with --held-out-source: fit a predictor on every other "
                                                         "source first (minutes) instead of the shipped one")] = False,
    json_out: JsonOpt = None,
    phase: Annotated[str, typer.Option(help="train: the training predictor (the options above); generate: vLLM "
                                            "generation, the GPU composition on the silicon serving runs and the "
                                            "CPU-learned model on held-out vLLM runs, each beside its baselines")]
    = "train",
    markdown: Annotated[str | None, typer.Option("--markdown", metavar="<str>",
                                                 help="with --phase generate: the silicon check's tables as "
                                                      "markdown to FILE, or to stdout with -")] = None,
) -> None:
    """Held-out accuracy on extrapolating splits: leave one model / width / hardware out, scale-out, one TRL shape
    or one host's TRL runs out (trl-host), and the untouched test partition (each source's largest model). With
    --phase generate: the generation phase (`generate evaluate --silicon` and `generate evaluate` together).

    Step-time MAPE, median and p90 APE beside the composition-only and analytic baselines, 90%-interval coverage,
    mean applicability of the correction, peak-memory errors, false-OOM rate, ranking Spearman and top-1 regret."""
    from perfpredict.train.evaluate import check_selection, evaluate, metrics_records, plot_predicted_vs_measured

    if phase not in PHASES:
        raise PerfPredictError(f"--phase {phase!r}: not a phase; accepted: {', '.join(PHASES)}")
    if phase == "generate":
        train_only = {"--split": split, "--variant": variant, "--subset": subset, "--source": source, "--plot": plot,
                      "--held-out-source": held_out_source, "--refit": refit}
        given = [k for k, v in train_only.items() if v]
        if given:
            raise PerfPredictError(f"{', '.join(given)}: options of --phase train; --phase generate takes --data, "
                                   "--seed, --json and --markdown")
        return _evaluate_generate(data=data, seed=seed, json_out=json_out, markdown=markdown)
    if markdown:
        raise PerfPredictError("--markdown writes the generation check's tables: add --phase generate")
    check_outputs(json_out=json_out, plot=plot)
    splits, variants = check_selection(splits=split, variants=variant)
    say = (lambda *a, **k: None) if machine_readable(json_out) else console.print
    if refit and not held_out_source:
        raise PerfPredictError("--refit goes with --held-out-source SOURCE (the sources to fit without)")
    if held_out_source:
        from perfpredict.train.evaluate import held_out_records, held_out_sources

        with _progress(quiet=machine_readable(json_out)) as prog:
            task = prog.add_task("held-out sources", total=None)
            res = held_out_sources(data=data, sources=tuple(held_out_source), refit=refit, seed=seed,
                                   progress=lambda m: prog.update(task, description=m))
        who = "a predictor fitted without them" if refit else "the shipped predictor"
        say(metrics_table(res["metrics"], f"{who} on sources it never saw (split 'source': per source; "
                                          "'source:model': per model)"))
        if json_out:
            write_text(json_out, json.dumps(held_out_records(res), indent=1, default=str))
        if plot is not None:
            say(f"plot: {plot_predicted_vs_measured(res['predictions'], plot)}")
        return
    with _progress(quiet=machine_readable(json_out)) as prog:
        task = prog.add_task("evaluating", total=None)
        res = evaluate(data=data, seed=seed, splits=splits, variants=variants, subset=subset or None,
                       sources=tuple(source or ()),
                       progress=lambda m: prog.update(task, description=f"held out {m}"))
    say("time: step-time errors (learned | composition alone | analytic); width: median high/low of the 90% "
        "interval; applic.: mean weight of the learned correction; mem: peak memory; false OOM: ran but called "
        "'does not fit'; missed OOM: out of memory but called 'fits'; at risk: outcomes called neither; failed ?: "
        "failures whose cause the source does not give (not scored as OOM), the share of them called 'fits', and "
        "of those whose measured siblings extrapolate past the GPU (implied OOM) the share called 'fits'")
    say(metrics_table(res["metrics"], "held-out accuracy (split 'largest' is the untouched test partition)"))
    trl = res.get("metrics_trl")
    if trl is not None and trl.height:
        say(metrics_table(trl, "TRL runs per trainer x reference mode (trl-shape: each TRL model shape held out)"))
    host = res.get("metrics_trl_host")
    if host is not None and host.height:
        say(metrics_table(host, "leave-one-host-out, TRL (trl-host: a host's TRL runs held out, its probes kept; "
                                "bias = median of predicted / measured - 1)"))
    if json_out:
        write_text(json_out, json.dumps(metrics_records(res), indent=1, default=str))
    if plot is not None:
        say(f"plot: {plot_predicted_vs_measured(res['predictions'], plot)}")


PHASES = ("train", "generate")


def _evaluate_generate(*, data: Path, seed: int, json_out: str | None, markdown: str | None) -> None:
    """`evaluate --phase generate`: the silicon end-to-end check (per-GPU throughput, TPOT, TTFT held out by model,
    GPU and backend; layout choice beside the rule of thumb and a roofline), then the CPU-learned model on held-out
    vLLM runs (layout choice beside the rule of thumb); --json writes both under `silicon` and `cpu_vllm`."""
    from perfpredict.cli.generate import check_markdown, cpu_evaluation, quiet_or_print, silicon_evaluation
    from perfpredict.train.generate_silicon import silicon_markdown

    check_outputs(json_out=json_out)
    check_markdown(json_out=json_out, markdown=markdown)
    say = quiet_or_print(json_out=json_out, markdown=markdown)
    say("GPU generation (vLLM, SGLang, TensorRT-LLM): the composition from measured silicon on the silicon_sample "
        "serving runs")
    silicon = silicon_evaluation(data=data, say=say)
    say("CPU generation (vLLM): the learned model on held-out measured runs")
    cpu, _ = cpu_evaluation(data=data, seed=seed, say=say)
    if json_out:
        write_text(json_out, json.dumps({"silicon": silicon, "cpu_vllm": cpu}, indent=1, default=str))
    if markdown:
        write_text(markdown, silicon_markdown(silicon))


@command("evaluate-kernels")
def evaluate_kernels_cmd(
    data: DataOpt = Path("datasets"),
    seed: SeedOpt = 0,
    hardware: Annotated[list[str] | None, typer.Option(help="GPUs to hold out (repeat), e.g. h200-sxm-141gb; "
                                                             "default every GPU the source measured")] = None,
    family: Annotated[list[str] | None, typer.Option(help="kernel families (repeat): gemm, attention, collective, "
                                                           "decode_attention, moe; default all")] = None,
    source: Annotated[str, typer.Option(help="the source whose GPU probes are held out and trained on")] = "aiconfigurator",
    all_sources: Annotated[bool, typer.Option(help="train on every source's GPU probes, not only --source's")] = False,
    own_fraction: Annotated[float, typer.Option(help="share of the held-out GPU's probes added back (second score)")] = 0.5,
    rows_per_gpu: Annotated[int, typer.Option(help="at most this many training probes per GPU and family (0 = all)")] = 2000,
    json_out: JsonOpt = None,
    markdown: Annotated[Path | None, typer.Option(help="write the accuracy page (e.g. docs/kernels-accuracy.md)")] = None,
    from_json: Annotated[Path | None, typer.Option(help="render --markdown from a saved --json instead of "
                                                        "evaluating again")] = None,
) -> None:
    """Kernel models leave-one-GPU-out: each GPU predicted from the other GPUs' probes alone, then with a share of
    its own, beside the roofline alone. MAPE = mean |predicted / measured - 1|."""
    from perfpredict.core.errors import PerfPredictError
    from perfpredict.train.kernels_eval import EVAL_PARAMS, evaluate_kernels, kernels_accuracy_page, summary_table

    check_outputs(json_out=json_out, not_same_as=markdown)
    if markdown is not None:
        from perfpredict.core.paths import writable_file

        writable_file("--markdown", markdown)
    if not 0.0 < own_fraction < 1.0:
        raise PerfPredictError(f"--own-fraction must be between 0 and 1 (exclusive), got {own_fraction}")
    if rows_per_gpu < 0:
        raise PerfPredictError(f"--rows-per-gpu must be 0 (all) or positive, got {rows_per_gpu}")
    say = (lambda *a, **k: None) if machine_readable(json_out) else console.print
    if from_json is not None:
        try:
            res = pl.DataFrame(json.loads(Path(from_json).read_text()))
        except (OSError, ValueError) as e:
            raise PerfPredictError(f"--from-json {str(from_json)!r}: not a saved evaluate-kernels --json ({e})") from None
    else:
        with _progress(quiet=machine_readable(json_out)) as prog:
            task = prog.add_task("evaluating", total=None)
            res = evaluate_kernels(data=data, hardware=tuple(hardware or ()), families=tuple(family or ()),
                                   source=source, all_sources=all_sources, own_fraction=own_fraction,
                                   max_rows_per_gpu=rows_per_gpu or None, seed=seed,
                                   progress=lambda m: prog.update(task, description=f"held out {m}"))
    table = summary_table(res)
    t = Table(title=f"kernels leave-one-GPU-out ({source} probes; MAPE)")
    for h in ("family", "held-out GPU", "n", "without own", "med", "with own", "med", "roofline"):
        t.add_column(h, justify="right")
    for r in table.iter_rows(named=True):
        fam = r["family"] if r["group"] == "all" else f"{r['family']}:{r['group']}"
        t.add_row(fam, r["hardware"], f"{r['n_test']:,}", pct(r["mape_without"]), pct(r["median_without"]),
                  pct(r["mape_with"]), pct(r["median_with"]), pct(r["roofline_mape"]))
    say(t)
    if json_out:
        write_text(json_out, json.dumps(res.to_dicts(), indent=1))
    if markdown is not None:
        # The command that reproduces the numbers (not --from-json: the evaluation it rendered).
        parts = ["perfpredict evaluate-kernels", f"--rows-per-gpu {rows_per_gpu}", f"--seed {seed}",
                 *(f"--hardware {h}" for h in hardware or ()), *(f"--family {f}" for f in family or ()),
                 *([f"--source {source}"] if source != "aiconfigurator" else []),
                 *(["--all-sources"] if all_sources else []),
                 *([f"--own-fraction {own_fraction}"] if own_fraction != 0.5 else [])]
        write_text(markdown, kernels_accuracy_page(res, command=" ".join(parts), rows=rows_per_gpu or None,
                                                   trees=EVAL_PARAMS["n_estimators"]))
        say(f"wrote {markdown}")


@command("import-public")
def import_public_cmd(
    shared: Annotated[Path, typer.Option(help="the public data folder")] = Path("../shared/data/public"),
    out: Annotated[Path, typer.Option(help="output folder")] = Path("datasets/public"),
) -> None:
    """Convert the published measurements under shared/data/public into our dataset schema."""
    from perfpredict.importers import import_public

    counts = import_public(shared_root=shared, out_root=out)
    for k, v in counts.items():
        console.print(f"{k}: {v:,} rows")


@command("report")
def report_cmd(
    evaluation: Annotated[Path, typer.Option(help="what `perfpredict evaluate --json` wrote")] = Path(
        "docs/evaluation.json"),
    generate_evaluation: Annotated[Path | None, typer.Option(
        help="what `perfpredict generate evaluate --json` wrote (optional)")] = Path("docs/generate-evaluation.json"),
    out: Annotated[Path, typer.Option(help="the Markdown page to write")] = Path("docs/accuracy.md"),
    held_out_evaluation: Annotated[Path | None, typer.Option(
        help="what `perfpredict evaluate --held-out-source ... --json` wrote (optional)")] = Path(
        "docs/held-out-sources.json"),
) -> None:
    """Write the accuracy page (Markdown) from the evaluation JSON files."""
    from perfpredict.core.paths import writable_file
    from perfpredict.train.report import write_accuracy_page

    writable_file("--out", out)
    path = write_accuracy_page(evaluation_path=evaluation, generate_evaluation_path=generate_evaluation, out_path=out,
                               held_out_evaluation_path=held_out_evaluation)
    console.print(f"wrote {path}")
