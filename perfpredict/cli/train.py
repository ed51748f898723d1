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
    ("time_weight_mean", "applic."), ("mem_n", "mem n"), ("mem_mape", "mem MAPE"),
    ("mem_analytic_mape", "analytic"), ("mem_coverage", "cover90"), ("false_oom", "false OOM"),
    ("false_oom_analytic", "analytic"), ("rank_spearman", "Spearman"), ("rank_top1_regret", "regret"),
)
PLAIN = {"time_n", "mem_n", "rank_spearman", "time_weight_mean"}


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
                cells.append(f"{v:.2f}" if col in PLAIN else pct(v))
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
) -> None:
    """Held-out accuracy on extrapolating splits: leave one model / width / hardware out, scale-out, one TRL shape
    or one host's TRL runs out (trl-host), and the untouched test partition (each source's largest model). The generation model: `perfpredict generate evaluate`.

    Step-time MAPE, median and p90 APE beside the composition-only and analytic baselines, 90%-interval coverage,
    mean applicability of the correction, peak-memory errors, false-OOM rate, ranking Spearman and top-1 regret."""
    from perfpredict.train.evaluate import check_selection, evaluate, metrics_records, plot_predicted_vs_measured

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
    say("time: step-time errors (learned | composition alone | analytic); applic.: mean weight of the "
        "learned correction; mem: peak memory; false OOM: ran but predicted not to fit")
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
