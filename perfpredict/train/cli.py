"""`perfpredict train`, `perfpredict evaluate`, `perfpredict import-public`: thin typer commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 200)


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                    transient=True)


def train_cmd(
    data: Annotated[Path, typer.Option(help="datasets folder (probes*.parquet and runs*.parquet under it)")] = Path("datasets"),
    out: Annotated[Path, typer.Option(help="where to write the trained predictor")] = Path("out/predictor"),
    seed: Annotated[int, typer.Option(help="random seed (training is deterministic for the same data and seed)")] = 0,
    evaluate_too: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="store held-out metrics in metadata")] = False,
) -> None:
    """Train the kernel and plan-level models and save them (xgboost JSON + metadata.json)."""
    from perfpredict.train.api import train

    with _progress() as prog:
        task = prog.add_task("training", total=None)
        path = train(data=data, out=out, seed=seed, evaluate_too=evaluate_too,
                     progress=lambda m: prog.update(task, description=m))
    meta = json.loads((path / "metadata.json").read_text())
    console.print(f"trained on {meta['rows']} -> [bold]{path}[/]")
    console.print(f"intervals (90%, log10): time {meta['time_interval_log10']}, memory {meta['memory_interval_log10']}; "
                  f"OOM margin {meta['oom_margin']:+.3f}")


def _table(df: pl.DataFrame, key: str, title: str) -> Table:
    t = Table(title=title)
    cols = [key, "time_n", "time_mape", "time_median_ape", "time_p90_ape", "time_composed_mape", "time_analytic_mape",
            "mem_n", "mem_mape", "mem_median_ape", "mem_p90_ape", "mem_analytic_mape", "oom_n", "oom_accuracy",
            "oom_accuracy_analytic", "rank_groups", "rank_spearman", "rank_top1_regret"]
    heads = [key, "n", "MAPE", "med", "p90", "composed", "analytic", "n", "MAPE", "med", "p90", "analytic", "n",
             "acc", "analytic", "groups", "Spearman", "regret"]
    for h in heads:
        t.add_column(h, justify="right")
    for r in df.iter_rows(named=True):
        cells = []
        for col in cols:
            v = r.get(col)
            if v is None or (isinstance(v, float) and v != v):
                cells.append("-")
            elif isinstance(v, float):
                cells.append(f"{v:.3f}" if "spearman" in col else f"{100 * v:.1f}%")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    return t


def evaluate_cmd(
    data: Annotated[Path, typer.Option(help="datasets folder")] = Path("datasets"),
    seed: Annotated[int, typer.Option()] = 0,
    subset: Annotated[int, typer.Option(help="evaluate on a random subset of N runs (quick check)")] = 0,
    plot: Annotated[Path | None, typer.Option(help="write a predicted-vs-measured PNG (needs the plot extra)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the metric tables as JSON")] = None,
    phase: Annotated[str, typer.Option(help="train | generate (the vLLM generation model)")] = "train",
    save: Annotated[bool, typer.Option(help="generate: save the model fitted on all rows as the shipped one")] = False,
) -> None:
    """Held-out accuracy: leave-one-model-out per source, leave-one-hardware-out per hardware.

    Step-time MAPE, median and p90 APE, peak-memory errors, OOM accuracy, ranking Spearman and top-1 regret, each
    beside the composition-only and analytic baselines."""
    if phase == "generate":
        from perfpredict.predictor.generate_cli import run_evaluate

        return run_evaluate(data=data, seed=seed, save=save, json_out=json_out)
    if phase != "train":
        from perfpredict.core.errors import PerfPredictError

        raise PerfPredictError(f"unknown --phase {phase!r}; accepted: train, generate")
    from perfpredict.train.evaluate import evaluate, plot_predicted_vs_measured

    with _progress() as prog:
        task = prog.add_task("evaluating", total=None)
        res = evaluate(data=data, seed=seed, subset=subset or None,
                       progress=lambda m: prog.update(task, description=f"held out {m}"))
    console.print("time: step-time errors; mem: peak-memory errors; rank: within (model, cluster, workload) groups")
    if "by_source" in res:
        console.print(_table(res["by_source"], "source", "leave-one-model-out, per source"))
    if "by_hardware" in res:
        console.print(_table(res["by_hardware"], "g_name", "leave-one-hardware-out, per hardware"))
    if json_out:
        json_out.write_text(json.dumps({k: v.to_dicts() for k, v in res.items() if k.startswith("by_")}, indent=1,
                                       default=str))
    if plot is not None:
        console.print(f"plot: {plot_predicted_vs_measured(res['predictions_model'], plot)}")


def import_public_cmd(
    shared: Annotated[Path, typer.Option(help="the public data folder")] = Path("../shared/data/public"),
    out: Annotated[Path, typer.Option(help="output folder")] = Path("datasets/public"),
) -> None:
    """Convert the published measurements under shared/data/public into our dataset schema."""
    from perfpredict.train.importers import import_public

    counts = import_public(shared_root=shared, out_root=out)
    for k, v in counts.items():
        console.print(f"{k}: {v} rows")
