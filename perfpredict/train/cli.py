"""`perfpredict train`, `perfpredict evaluate`, `perfpredict import-public`: thin typer commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from perfpredict.core.console import stdout_console

console = stdout_console()


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
    iv = meta["intervals_log10"]
    console.print(f"launch floor per kernel {meta['launch_floor_s']}; OOM margin {meta['oom_margin']:+.3f}; 90% "
                  f"intervals (log10) outside the data: time {iv['time']['outside']}, memory {iv['memory']['outside']}")


TABLE_COLUMNS = (
    ("variant", "variant"), ("split", "split"), ("source", "source"), ("trl_mode", "TRL trainer x reference"),
    ("time_n", "n"), ("time_mape", "MAPE"), ("time_median_ape", "med"), ("time_p90_ape", "p90"),
    ("time_composed_mape", "composed"), ("time_analytic_mape", "analytic"), ("time_coverage", "cover90"),
    ("time_weight_mean", "applic."), ("mem_n", "mem n"), ("mem_mape", "mem MAPE"),
    ("mem_analytic_mape", "analytic"), ("mem_coverage", "cover90"), ("false_oom", "false OOM"),
    ("false_oom_analytic", "analytic"), ("rank_spearman", "Spearman"), ("rank_top1_regret", "regret"),
)
PLAIN = {"time_n", "mem_n", "rank_spearman", "time_weight_mean"}


def _table(df: pl.DataFrame, title: str) -> Table:
    t = Table(title=title)
    cols = [(k, h) for k, h in TABLE_COLUMNS if k in df.columns]
    for _, h in cols:
        t.add_column(h, justify="right")
    for r in df.iter_rows(named=True):
        cells = []
        for col, _ in cols:
            v = r.get(col)
            if v is None or (isinstance(v, float) and v != v):
                cells.append("-")
            elif isinstance(v, float):
                cells.append(f"{v:.2f}" if col in PLAIN else f"{100 * v:.1f}%")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    return t


def evaluate_cmd(
    data: Annotated[Path, typer.Option(help="datasets folder")] = Path("datasets"),
    seed: Annotated[int, typer.Option()] = 0,
    split: Annotated[list[str] | None, typer.Option(help="splits to run (repeat): model, width, scale, hardware, "
                                                          "trl-shape, largest (the test partition); default all")] = None,
    variant: Annotated[list[str] | None, typer.Option(help="correction variants to compare (repeat): absolute, "
                                                            "scale-free, scale-free+domain (shipped)")] = None,
    subset: Annotated[int, typer.Option(help="evaluate on a random subset of N runs (quick check)")] = 0,
    source: Annotated[list[str] | None, typer.Option(help="only these sources' runs and their hardware's probes "
                                                          "(repeat), e.g. ours-cpu + ours-cpu-trl")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a predicted-vs-measured PNG (needs the plot extra)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the metric table as JSON")] = None,
    phase: Annotated[str, typer.Option(help="train | generate (the vLLM generation model)")] = "train",
    save: Annotated[bool, typer.Option(help="generate: save the model fitted on all rows as the shipped one")] = False,
) -> None:
    """Held-out accuracy on extrapolating splits: leave one model / width / hardware out, scale-out, and the
    untouched test partition (each source's largest model).

    Step-time MAPE, median and p90 APE beside the composition-only and analytic baselines, 90%-interval coverage,
    mean applicability of the correction, peak-memory errors, false-OOM rate, ranking Spearman and top-1 regret."""
    if phase == "generate":
        from perfpredict.train.generate_cli import run_evaluate

        return run_evaluate(data=data, seed=seed, save=save, json_out=json_out)
    if phase != "train":
        from perfpredict.core.errors import PerfPredictError

        raise PerfPredictError(f"unknown --phase {phase!r}; accepted: train, generate")
    from perfpredict.train.evaluate import SPLITS, evaluate, plot_predicted_vs_measured
    from perfpredict.train.fit import DEFAULT_VARIANT, VARIANTS

    splits = tuple(split or SPLITS)
    variants = tuple(variant or (DEFAULT_VARIANT.name,))
    bad = [s for s in splits if s not in SPLITS] + [v for v in variants if v not in VARIANTS]
    if bad:
        from perfpredict.core.errors import PerfPredictError

        raise PerfPredictError(f"unknown split/variant {bad}; splits: {', '.join(SPLITS)}; "
                               f"variants: {', '.join(VARIANTS)}")
    with _progress() as prog:
        task = prog.add_task("evaluating", total=None)
        res = evaluate(data=data, seed=seed, splits=splits, variants=variants, subset=subset or None,
                       sources=tuple(source or ()),
                       progress=lambda m: prog.update(task, description=f"held out {m}"))
    console.print("time: step-time errors (learned | composition alone | analytic); applic.: mean weight of the "
                  "learned correction; mem: peak memory; false OOM: ran but predicted not to fit")
    console.print(_table(res["metrics"], "held-out accuracy (split 'largest' is the untouched test partition)"))
    trl = res.get("metrics_trl")
    if trl is not None and trl.height:
        console.print(_table(trl, "TRL runs per trainer x reference mode (trl-shape: each TRL model shape held out)"))
    if json_out:
        out = res["metrics"].to_dicts() + ([{"table": "trl", **r} for r in trl.to_dicts()]
                                           if trl is not None and trl.height else [])
        json_out.write_text(json.dumps(out, indent=1, default=str))
    if plot is not None:
        console.print(f"plot: {plot_predicted_vs_measured(res['predictions'], plot)}")


def import_public_cmd(
    shared: Annotated[Path, typer.Option(help="the public data folder")] = Path("../shared/data/public"),
    out: Annotated[Path, typer.Option(help="output folder")] = Path("datasets/public"),
) -> None:
    """Convert the published measurements under shared/data/public into our dataset schema."""
    from perfpredict.importers import import_public

    counts = import_public(shared_root=shared, out_root=out)
    for k, v in counts.items():
        console.print(f"{k}: {v} rows")
