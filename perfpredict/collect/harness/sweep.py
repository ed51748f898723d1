"""Sample legal plans for a set of (shrunk) models and measure them, appending each row as it lands.

Sampling is space-filling, not a grid: a scrambled Sobol sequence over the knobs (model shape, objective, reference
mode, world size, parallel strategy, ZeRO stage, recompute, micro-batch, gradient accumulation, sequence length,
precision), each coordinate mapped to a categorical by weighted bins. A point that maps to an illegal plan is
repaired where a neighbouring choice is legal (e.g. grad_accum raised to the number of pipeline stages) or
skipped. A rough FLOP-based estimate keeps steps in the ~0.3-6 s range on this CPU.

Output: datasets/ours/<hardware short hash>/runs.parquet, one atomic append per run; a rerun of the same command
skips the run_ids already there (same seed -> same sequence -> same ids), so the sweep resumes after a crash."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.collect import fingerprint as fpr
from perfpredict.collect import store
from perfpredict.collect.harness.model import shrink
from perfpredict.collect.harness.parallel import check_plan
from perfpredict.collect.harness.runs import HARNESS, effective_plan, run_id, run_one
from perfpredict.collect.host import cluster_for, default_out
from perfpredict.core.catalog import get_model
from perfpredict.core.dataset import append_rows
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec
from perfpredict.core.objectives import objective
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario
from perfpredict.core.workload import Workload


@dataclass(frozen=True)
class Shape:
    """A model the sweep runs: a catalog model shrunk to a CPU-sized width/depth, or a custom tiny one."""

    key: str
    base: str | None  # catalog name it is shrunk from (None: custom)
    hidden: int = 0
    layers: int = 0
    min_kv_heads: int = 2
    custom: dict[str, Any] | None = None

    def spec(self) -> ModelSpec:
        if self.base is None:
            return ModelSpec(name=self.key, **(self.custom or {}))
        return shrink(get_model(self.base), hidden=self.hidden, layers=self.layers, min_kv_heads=self.min_kv_heads)


SHAPES: dict[str, Shape] = {s.key: s for s in [
    Shape("llama-3.2-1b@256x4", "llama-3.2-1b", hidden=256, layers=4),
    Shape("llama-3.2-1b@384x2", "llama-3.2-1b", hidden=384, layers=2, min_kv_heads=4),
    Shape("qwen2.5-0.5b@224x4", "qwen2.5-0.5b", hidden=224, layers=4),
    Shape("mixtral-8x7b@256x2", "mixtral-8x7b", hidden=256, layers=2),
    Shape("gemma-2-2b@256x4", "gemma-2-2b", hidden=256, layers=4),
    Shape("tiny-llama", None, custom=dict(layers=4, hidden=128, heads=4, kv_heads=4, ffn=512, vocab=4096)),
    Shape("tiny-moe", None, custom=dict(layers=2, hidden=128, heads=4, kv_heads=2, ffn=0, experts=4,
                                        experts_per_token=1, expert_ffn=256, vocab=4096)),
]}
DEFAULT_MODELS = tuple(SHAPES)

# Weighted categorical choices, one Sobol coordinate each.
OBJECTIVES = [("dpo", 0.45), ("sft", 0.14), ("pretrain", 0.1), ("simpo", 0.12), ("orpo", 0.07), ("ipo", 0.12)]
REFERENCES = [("live", 0.65), ("precomputed", 0.35)]
WORLDS = [(1, 0.2), (2, 0.55), (3, 0.05), (4, 0.2)]
RECOMPUTE = [("none", 0.5), ("selective", 0.25), ("full", 0.25)]
MICRO = [(1, 0.4), (2, 0.4), (4, 0.2)]
ACCUM = [(1, 0.45), (2, 0.35), (4, 0.2)]
SEQ = [(128, 0.25), (256, 0.35), (384, 0.2), (512, 0.2)]
PRECISION = [("fp32", 0.75), ("bf16", 0.25)]
# Strategies per world size: (tp, pp, dp, zero, sp, schedule); check_plan holds each to the harness's row of the
# capability table (core.frameworks), so a strategy the harness cannot build is skipped, never run.
STRATEGIES = {
    1: [((1, 1, 1, 0, False, "1f1b"), 1.0)],
    2: [((1, 1, 2, 0, False, "1f1b"), 0.2), ((1, 1, 2, 2, False, "1f1b"), 0.13),
        ((1, 1, 2, 3, False, "1f1b"), 0.17), ((2, 1, 1, 0, False, "1f1b"), 0.15),
        ((2, 1, 1, 0, True, "1f1b"), 0.1), ((1, 2, 1, 0, False, "gpipe"), 0.12),
        ((1, 2, 1, 0, False, "1f1b"), 0.13)],
    3: [((1, 1, 3, 0, False, "1f1b"), 0.4), ((1, 1, 3, 3, False, "1f1b"), 0.3), ((1, 3, 1, 0, False, "1f1b"), 0.3)],
    4: [((1, 1, 4, 0, False, "1f1b"), 0.2), ((1, 1, 4, 3, False, "1f1b"), 0.15), ((2, 1, 2, 3, False, "1f1b"), 0.2),
        ((2, 1, 2, 2, True, "1f1b"), 0.1), ((4, 1, 1, 0, False, "1f1b"), 0.15), ((1, 4, 1, 0, False, "1f1b"), 0.1),
        ((1, 4, 1, 0, False, "gpipe"), 0.1)],
}

# Effective single-thread rates seen for this model code (fp32 GEMM-bound; bf16 autocast on CPU is ~3x slower).
RATE_FLOPS = {"fp32": 70e9, "bf16": 23e9, "fp16": 23e9}
STEP_S_RANGE = (0.3, 5.0)


def pick(u: float, choices: list[tuple[Any, float]]) -> Any:
    total = sum(w for _, w in choices)
    acc = 0.0
    for value, w in choices:
        acc += w / total
        if u < acc:
            return value
    return choices[-1][0]


def estimate_step_s(spec: ModelSpec, w: Workload, p: Plan, cores: int) -> float:
    """Rough CPU step time: matmul FLOPs (policy fwd+bwd, reference fwd, recompute) over a per-thread rate,
    spread over min(world, cores) threads. Only used to keep sampled runs in a useful range."""
    tokens = w.tokens_per_step
    fwd = spec.flops_per_token(w.seq_len, backward=False)
    flops = tokens * fwd * (3 + (1 if w.reference == "live" else 0) + (1 if p.recompute == "full" else 0))
    world = p.gpus
    par = min(world, cores)
    # TP pays activation collectives over gloo in every layer (2-3x slower than its FLOPs say on this CPU).
    overhead = 1.0 + 0.3 * (world > 1) + 0.5 * (world > cores) + 1.2 * (p.tp > 1)
    return flops / RATE_FLOPS[w.precision] / par * overhead


def sample_plans(*, n: int, models: tuple[str, ...] = DEFAULT_MODELS, seed: int = 0,
                 cores: int | None = None) -> list[tuple[Shape, Workload, Plan]]:
    """n legal (shape, workload, plan) triples, space-filling over the knobs (scrambled Sobol)."""
    from scipy.stats import qmc

    cores = cores or fpr.cpu_cores()
    for m in models:
        if m not in SHAPES:
            raise PerfPredictError(f"unknown sweep model {m!r}; accepted: {', '.join(SHAPES)}")
    shapes = [SHAPES[m] for m in models]
    specs = {s.key: s.spec() for s in shapes}
    sob = qmc.Sobol(d=11, scramble=True, seed=seed)
    out: list[tuple[Shape, Workload, Plan]] = []
    seen: set[str] = set()
    draws = 0
    while len(out) < n and draws < 200 * max(n, 1):
        u = sob.random(1)[0]
        draws += 1
        shape = shapes[min(int(u[0] * len(shapes)), len(shapes) - 1)]
        spec = specs[shape.key]
        obj = pick(u[1], OBJECTIVES)
        ref = pick(u[2], REFERENCES) if objective(obj).needs_reference else "none"
        world = pick(u[3], WORLDS)
        tp, pp, dp, zero, sp, sched = pick(u[4], STRATEGIES[world])
        rc = pick(u[5], RECOMPUTE)
        mb = pick(u[6], MICRO)
        ga = pick(u[7], ACCUM)
        seq = pick(u[8], SEQ)
        prec = pick(u[9], PRECISION)
        if pp > 1:
            ga = max(ga, pp)  # a pipeline needs at least one micro-batch per stage to fill
        try:
            w = Workload(objective=obj, seq_len=seq, global_batch=mb * ga * dp, precision=prec, reference=ref)
            p = effective_plan(Plan(tp=tp, pp=pp, dp=dp, zero=zero, sequence_parallel=sp, recompute=rc,
                                    micro_batch=mb, grad_accum=ga, schedule=sched, framework=HARNESS.records_as))
            check_plan(spec, w, p, world)
            Scenario(model=spec, cluster=cluster_for(world), workload=w, plan=p)  # core's own legality rules
        except PerfPredictError:
            continue
        # Shrink the work until the estimate fits: fewer accumulation steps, then shorter sequences.
        while estimate_step_s(spec, w, p, cores) > STEP_S_RANGE[1] and (p.grad_accum > max(1, pp) or w.seq_len > 128):
            if p.grad_accum > max(1, pp):
                p = Plan(**{**p.to_dict(), "grad_accum": p.grad_accum // 2})
            else:
                w = Workload(**{**w.to_dict(), "seq_len": w.seq_len // 2})
            w = Workload(**{**w.to_dict(), "global_batch": p.micro_batch * p.grad_accum * p.dp})
        est = estimate_step_s(spec, w, p, cores)
        if not STEP_S_RANGE[0] / 3 <= est <= STEP_S_RANGE[1]:
            continue
        key = f"{shape.key}|{w.to_dict()}|{p.to_dict()}"
        if key in seen:
            continue
        seen.add(key)
        out.append((shape, w, p))
    return out


def done_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return set(pl.read_parquet(path, columns=["run_id"])["run_id"].to_list())


def iter_scenarios(plans: list[tuple[Shape, Workload, Plan]]) -> Iterator[tuple[Shape, Scenario]]:
    for shape, w, p in plans:
        yield shape, Scenario(model=shape.spec(), cluster=cluster_for(p.gpus), workload=w, plan=p)


def run_sweep(*, n: int, models: tuple[str, ...] = DEFAULT_MODELS, out_dir: Path | str | None = None,
              timeout_s: float = 600.0, seed: int = 0, warmup: int = 2, steps: int = 5, command: str | None = None,
              max_retries: int = 2, progress: bool = True,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Measure n sampled plans (skipping those already in out_dir/runs.parquet); returns the parquet path."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from perfpredict.core.console import stderr_console

    out = Path(out_dir) if out_dir else default_out()
    path = out / "runs.parquet"
    plans = sample_plans(n=n, models=models, seed=seed)
    done = done_ids(path)

    # A log file (nohup) gets one unwrapped line per run; a terminal gets the live bar as well.
    console = stderr_console()
    todo = []
    for shape, sc in iter_scenarios(plans):  # sampled plans are already as collect runs them (effective_plan)
        rid = run_id(sc, warmup=warmup, steps=steps, seed=seed, threads=1)
        if rid not in done:
            todo.append((shape, sc))
    console.print(f"[bold]collect runs[/]: {len(plans)} sampled, {len(plans) - len(todo)} already in {path}, "
                  f"{len(todo)} to run")
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=console, disable=not progress) as bar:
        task = bar.add_task("runs", total=len(todo))
        for i, (shape, sc) in enumerate(todo):
            try:
                row = run_one(sc, timeout_s=timeout_s, warmup=warmup, steps=steps, seed=seed,
                              max_retries=max_retries, shrunk_from=shape.base, command=command)
            except Exception as e:  # noqa: BLE001 - one bad scenario must not end a long sweep
                console.print(f"{i + 1}/{len(todo)} skipped {shape.key} {sc.plan.label()}: {e}")
                bar.advance(task)
                continue
            row["sweep_seed"] = seed
            row["model_shape"] = shape.key
            append_rows(path, [row], store.runs_schema())
            t = row["step_time_s"]
            console.print(
                f"{i + 1}/{len(todo)} {row['run_id']} {shape.key} {sc.workload.objective}/{sc.workload.reference} "
                f"{sc.plan.label()} seq{sc.workload.seq_len} {sc.workload.precision}: {row['outcome']} "
                + (f"{t:.3f}s cv={row['step_time_cv']:.3f} mem={row['peak_memory_gib'] * 1024:.0f}MiB "
                   if t is not None and not math.isnan(t) else f"{(row['error'] or '')[:120]} ")
                + f"calib={row['calib_ratio']:.2f} load={row['other_load_cores']:.2f} "
                + f"steal={row.get('steal_cores') or 0:.2f} tries={row['attempts']}")
            bar.advance(task)
            if on_row:
                on_row(row)
    return path


def measure_repeats(*, plans: list[tuple[Shape, Workload, Plan]], repeats: int, out_dir: Path | str | None = None,
                    timeout_s: float = 600.0, seed: int = 0, command: str | None = None) -> pl.DataFrame:
    """Run each plan `repeats` times (interleaved, so slow drifts hit every plan alike) into repeats.parquet
    (not runs*.parquet: the duplicates would weigh those configs twice in training) and return, per plan, the
    run-to-run coefficient of variation of the median step time."""
    out = Path(out_dir) if out_dir else default_out()
    path = out / "repeats.parquet"
    for r in range(repeats):
        for shape, sc in iter_scenarios(plans):
            row = run_one(sc, timeout_s=timeout_s, seed=seed, shrunk_from=shape.base, command=command)
            row.update(repeat=r, model_shape=shape.key, sweep_seed=seed)
            append_rows(path, [row], {**store.runs_schema(), "repeat": pl.Int64})
    df = pl.read_parquet(path).filter(pl.col("outcome") == "ok")
    return (df.group_by("run_id", "model_shape", "strategy")
            .agg(pl.len().alias("n"), pl.col("step_time_s").mean().alias("mean_s"),
                 (pl.col("step_time_s").std(ddof=0) / pl.col("step_time_s").mean()).alias("run_to_run_cv"),
                 pl.col("step_time_cv").median().alias("within_run_cv"),
                 (pl.col("peak_memory_gib").max() - pl.col("peak_memory_gib").min()).alias("mem_range_gib"))
            .sort("model_shape"))
