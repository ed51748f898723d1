"""`perfpredict collect probes|runs|trl` and `perfpredict generate collect`: measure this machine.

Each command needs torch (and vLLM for generation) only when it runs; bad input raises PerfPredictError, which
`friendly` prints as one line."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from perfpredict.cli._util import collect_app, command, generate_app
from perfpredict.core.errors import PerfPredictError


def _command() -> str:
    argv = sys.argv[:]
    argv[0] = Path(argv[0]).name
    return shlex.join(argv)


@command("probes", on=collect_app)
def probes(quick: bool = typer.Option(False, "--quick", help="A < 2 minute subset (CPU)."),
           out: Path | None = typer.Option(None, "--out", help="Folder for probes.parquet "
                                           "(default datasets/ours/<hardware hash>)."),
           seed: int = typer.Option(0, "--seed", help="Seed of the shape sampling."),
           families: list[str] | None = typer.Option(None, "--families", help="Probe families (repeatable): gemm, "
                                                     "attention, memory, comm (default: these four), decode (GEMMs "
                                                     "and attention of a generation decode step), or trl alone "
                                                     "(the ops TRL's Llama really runs -> probes-trl.parquet).")
           ) -> None:
    """GEMM, attention, memory-bound and collective probes -> probes.parquet (--families trl: probes-trl.parquet)."""
    from perfpredict.collect.probes.suite import DEFAULT_FAMILIES, run_probes
    from perfpredict.core.console import stderr_console

    console = stderr_console(piped_width=None)
    path, df = run_probes(quick=quick, out_dir=out, command=_command(), seed=seed,
                          families=tuple(families) if families else DEFAULT_FAMILIES,
                          log=lambda s: console.print(f"[dim]{s}[/]"))
    bad = df.filter(df["outcome"] != "ok").height
    console.print(f"{df.height} probe rows ({bad} failed) appended to {path}")


@command("runs", on=collect_app)
def runs(plans: int = typer.Option(20, "--plans", help="Number of sampled plans to measure."),
         models: list[str] | None = typer.Option(None, "--models", help="Sweep model shapes (repeatable); "
                                                 "default: all."),
         out: Path | None = typer.Option(None, "--out", help="Folder for runs.parquet "
                                         "(default datasets/ours/<hardware hash>)."),
         timeout: float = typer.Option(600.0, "--timeout", help="Seconds before a run is killed and recorded "
                                       "as a timeout."),
         seed: int = typer.Option(0, "--seed", help="Seed of the plan sampling (same seed resumes)."),
         warmup: int = typer.Option(2, "--warmup"), steps: int = typer.Option(5, "--steps"),
         retries: int = typer.Option(2, "--retries", help="Retries of a disturbed run (calibration gate).")) -> None:
    """Sample legal plans and measure full training steps under torchrun -> runs.parquet (resumable)."""
    from perfpredict.collect.harness.sweep import DEFAULT_MODELS, run_sweep

    if plans < 1:
        raise PerfPredictError(f"--plans must be >= 1, got {plans}")
    if timeout <= 0:
        raise PerfPredictError(f"--timeout must be positive, got {timeout}")
    if steps < 1 or warmup < 0:
        raise PerfPredictError("--steps must be >= 1 and --warmup >= 0")
    chosen = tuple(models) if models else DEFAULT_MODELS  # unknown names: sample_plans says which are accepted
    import signal

    # SIGTERM (kill PID, nohup'd sweeps) -> SystemExit, so the run in flight has its ranks killed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_sweep(n=plans, models=chosen, out_dir=out, timeout_s=timeout, seed=seed, warmup=warmup, steps=steps,
              command=_command(), max_retries=retries)


@command("collect", on=generate_app)
def generate(groups: int = typer.Option(14, "--groups", help="Groups to measure; each group is one model shape, "
                                        "engine knobs and 4 workloads, timed under every layout of the cores."),
             repeats: int = typer.Option(2, "--repeats", help="Timings of each workload per engine start."),
             shapes: list[str] | None = typer.Option(None, "--shapes", help="Model shapes (repeatable); default all."),
             out: Path | None = typer.Option(None, "--out", help="Folder for generate.parquet "
                                             "(default datasets/ours/<hardware hash>)."),
             python: str | None = typer.Option(None, "--python", help="Interpreter with vLLM installed (default "
                                               "$PERFPREDICT_VLLM_PYTHON or this one)."),
             seed: int = typer.Option(0, "--seed", help="Seed of the group sampling (same seed resumes)."),
             timeout: float = typer.Option(300.0, "--timeout", help="Seconds for an engine start or a workload "
                                           "before it is recorded as a timeout.")) -> None:
    """Time the real vLLM engine generating (TP, replicas, max_num_seqs, KV space, prefix caching, lengths, n)
    -> generate.parquet (resumable)."""
    import signal

    from perfpredict.collect.vllm.generate import collect_generate

    if timeout <= 0:
        raise PerfPredictError(f"--timeout must be positive, got {timeout}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    path = collect_generate(groups=groups, repeats=repeats, shapes=tuple(shapes) if shapes else None, out_dir=out,
                            python=python, seed=seed, command=_command(), start_timeout_s=timeout, timeout_s=timeout)
    typer.echo(f"rows in {path}")


@command("trl", on=collect_app)
def trl(configs: int = typer.Option(300, "--configs", help="Number of sampled TRL configurations (same seed "
                                    "resumes: configs already in trl.parquet are skipped)."),
        backends: str = typer.Option("single,ddp", "--backends", help="Comma-separated: single, ddp, fsdp, "
                                     "deepspeed (needs the deepspeed package)."),
        zero_stages: str = typer.Option("1,2,3", "--zero-stages", help="DeepSpeed ZeRO stages to rotate over "
                                        "(comma-separated, 0-3)."),
        ds_worlds: str = typer.Option("1", "--ds-worlds", help="DeepSpeed world sizes to rotate over (1, 2)."),
        shapes: list[str] | None = typer.Option(None, "--shapes", help="Model shapes (repeatable); default all."),
        out: Path | None = typer.Option(None, "--out", help="Folder for trl.parquet "
                                        "(default datasets/ours/<hardware hash>)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the config sampling."),
        warmup: int = typer.Option(2, "--warmup", help="Warm-up optimizer steps per config (>= 1)."),
        steps: int = typer.Option(4, "--steps", help="Timed optimizer steps per config."),
        retries: int = typer.Option(1, "--retries", help="Re-runs of a config the timing gate calls disturbed."),
        retry_above: float = typer.Option(1.0, "--retry-above", help="Re-run only when the disturbance (1 = at the "
                                          "gate's limits: calibration 1.12x, 0.3 competing cores) exceeds this."),
        timeout: float = typer.Option(300.0, "--timeout", help="Seconds without a result before a launch is "
                                      "killed and its config recorded as a timeout."),
        chunk: int = typer.Option(10, "--chunk", help="Configs per worker launch."),
        max_step_s: float = typer.Option(1.5, "--max-step-s", help="Skip sampled configs estimated slower than "
                                         "this per optimizer step."),
        min_seq: int = typer.Option(128, "--min-seq", help="Shortest prompt+completion length sampled (128, 256, "
                                    "512, 768 or 1024): a long-sequence supplement is --min-seq 512.")) -> None:
    """Run real TRL trainers (DPO sigmoid/IPO, CPO-SimPO, ORPO, KTO; reference live/precomputed/none) on random
    -weight Llama shapes, single process or accelerate DDP over gloo -> trl.parquet (resumable)."""
    import signal

    from perfpredict.collect.trl.collect import collect_trl
    from perfpredict.collect.trl.grid import BACKENDS

    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    bad = [b for b in chosen if b not in BACKENDS]
    if not chosen or bad:
        raise PerfPredictError(f"--backends: unknown {', '.join(bad) or '(none given)'}; accepted: "
                               f"{', '.join(BACKENDS)}")
    try:
        stages = tuple(int(z) for z in zero_stages.split(",") if z.strip())
        worlds = tuple(int(w) for w in ds_worlds.split(",") if w.strip())
    except ValueError:
        raise PerfPredictError(f"--zero-stages / --ds-worlds take comma-separated integers, got {zero_stages!r} / "
                               f"{ds_worlds!r}") from None
    if "deepspeed" in chosen:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise PerfPredictError("--backends deepspeed needs the deepspeed package in this Python (e.g. a venv "
                                   "with --system-site-packages and `pip install deepspeed`)")
    if configs < 1 or timeout <= 0 or chunk < 1 or max_step_s <= 0 or retry_above <= 0:
        raise PerfPredictError("--configs, --chunk must be >= 1 and --timeout, --max-step-s, --retry-above positive")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    path = collect_trl(n=configs, out_dir=out, seed=seed, backends=chosen, shapes=tuple(shapes) if shapes else None,
                       warmup=warmup, steps=steps, max_retries=retries, timeout_s=timeout, chunk=chunk,
                       max_step_s=max_step_s, retry_above=retry_above, min_seq=min_seq, zero_stages=stages,
                       ds_worlds=worlds, command=_command(), log=lambda s: typer.echo(s, err=True))
    typer.echo(f"rows in {path}")



@command("import-device", on=collect_app)
def import_device(folder: Path = typer.Argument(..., help="The files a lent machine's session returned "
                                                "(benchmarks/device/h200_session.sh: meta.json, *.jsonl)."),
                  root: Path = typer.Option(Path("datasets/ours"), "--root", help="Datasets folder; rows go to "
                                            "<root>/<the measuring machine's hash>/."),
                  allow_dry_run: bool = typer.Option(False, "--allow-dry-run", help="Import a dry run's files "
                                                     "too (H200_DRY_RUN=1: a tiny model on this CPU).")) -> None:
    """Rows measured on a lent GPU machine (probes, TRL steps) -> datasets/ours/<its hash>/*.parquet."""
    from perfpredict.collect.device.importer import import_device as run

    res = run(folder=folder, root=root, allow_dry_run=allow_dry_run)
    for table, n in res.rows_by_table.items():
        extra = f" ({res.skipped_by_table[table]:,} already there)" if res.skipped_by_table.get(table) else ""
        typer.echo(f"{table}: {n:,} rows appended{extra}")
    if res.outcomes:
        typer.echo("TRL outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(res.outcomes.items())))
    typer.echo(f"rows in {res.out_dir} (hardware {res.hardware})")
