"""`perfpredict collect trl`: sample TRL configs, measure them in worker launches, append rows to trl.parquet.

Resumable: a config whose key (TrlConfig.key = run_id) is already in the file is skipped, whatever its outcome.
Each result is appended atomically (core.dataset.append_rows) as soon as the worker writes it. A launch that stops
reporting for `timeout_s` is killed (its whole process tree) and the config in flight becomes a `timeout` row; a
launch that dies makes its config in flight an `error` row; either way the rest of its configs are relaunched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfpredict.collect import fingerprint as fpr
from perfpredict.collect import timing
from perfpredict.collect.processes import PKG_ROOT, kill_group, pythonpath_first
from perfpredict.collect.trl.grid import TrlConfig, chunks, sample_grid
from perfpredict.collect.trl.schema import failed_result, trl_row

# polars (done_keys, append_rows) is imported where rows are read or written: run_chunk also runs on a lent GPU
# machine without it (collect.device).

TABLE = "trl.parquet"


def default_out_dir() -> Path:
    return Path(PKG_ROOT) / "datasets" / "ours" / fpr.short_hash()


def done_keys(path: Path) -> set[str]:
    if not path.exists():
        return set()
    import polars as pl

    return set(pl.read_parquet(path, columns=["run_id"])["run_id"].to_list())


def pending(configs: list[TrlConfig], path: Path, *, warmup: int, steps: int) -> list[tuple[str, TrlConfig]]:
    hw = fpr.short_hash()
    done = done_keys(path)
    return [(k, c) for c in configs if (k := c.key(warmup=warmup, steps=steps, hardware=hw)) not in done]


def worker_command(world: int, job: Path, *, deepspeed: bool = False) -> list[str]:
    mod = ["-m", "perfpredict.collect.trl.worker", "--job", str(job)]
    if world == 1:
        return [sys.executable, *mod]
    # DeepSpeed: accelerate's DeepSpeed launcher (accelerate/commands/launch.py deepspeed_launcher: torchrun-style
    # ranks, ACCELERATE_USE_DEEPSPEED=true); the ZeRO config itself is the TrainingArguments' `deepspeed=` dict.
    # Otherwise --multi_gpu without a GPU: torchrun-style ranks that accelerate runs as MULTI_CPU over gloo.
    mode = "--use_deepspeed" if deepspeed else "--multi_gpu"
    return [sys.executable, "-m", "accelerate.commands.launch", mode, f"--num_processes={world}",
            "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no", *mod]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(*, deepspeed: bool = False, world: int = 1, torchrun_one: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if deepspeed or torchrun_one:
        # accelerate turns DeepSpeed on from this variable (accelerate/state.py, TrainingArguments' deepspeed= sets
        # the plugin); one process: the torch.distributed rendezvous DeepSpeed's init_distributed expects, on a
        # fresh port per launch. torchrun_one (FSDP on one GPU): the same variables make accelerate see a torchrun
        # rank (LOCAL_RANK set -> MULTI_GPU, accelerate/state.py _prepare_backend), which FSDP needs
        # (state.py:971-977 turns MULTI_GPU into FSDP when an FSDP plugin is given); without them it runs NO.
        if deepspeed:
            env["ACCELERATE_USE_DEEPSPEED"] = "true"
        if world == 1:
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(_free_port()))
    env["PYTHONPATH"] = pythonpath_first(env.get("PYTHONPATH"))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.setdefault("PP_AUTOGROUP_NICE", "-10")  # see trl.worker._autogroup_nice
    return env


def _read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_chunk(world: int, items: list[tuple[str, TrlConfig]], *, work: Path, warmup: int, steps: int,
              baseline: float, max_retries: int, timeout_s: float, retry_above: float,
              on_result: Callable[[str, TrlConfig, dict[str, Any]], None], log: Callable[[str], None]) -> None:
    """Measure items in worker launches until each has a result (relaunching after a hang or crash)."""
    todo = list(items)
    launch = 0
    while todo:
        launch += 1
        d = work / f"launch{launch}"
        d.mkdir(parents=True, exist_ok=True)
        job = d / "job.json"
        results, progress = d / "results.jsonl", d / "progress.txt"
        job.write_text(json.dumps({"configs": [{"key": k, "config": c.to_dict()} for k, c in todo],
                                   "warmup": warmup, "steps": steps, "baseline_s": baseline,
                                   "max_retries": max_retries, "retry_above": retry_above,
                                   "results": str(results),
                                   "progress": str(progress)}))
        by_key = dict(todo)
        seen = 0
        last = time.monotonic()
        with open(d / "log.txt", "wb") as fh:
            ds = any(c.backend == "deepspeed" for _, c in todo)
            one = world == 1 and any(c.backend == "fsdp" for _, c in todo)
            proc = subprocess.Popen(worker_command(world, job, deepspeed=ds), stdout=fh, stderr=subprocess.STDOUT,
                                    env=_env(deepspeed=ds, world=world, torchrun_one=one), start_new_session=True)
            try:
                while True:
                    lines = _read_lines(results)
                    for line in lines[seen:]:
                        r = json.loads(line)
                        on_result(r["key"], by_key[r["key"]], r)
                        todo = [(k, c) for k, c in todo if k != r["key"]]
                        last = time.monotonic()
                    seen = len(lines)
                    if proc.poll() is not None:
                        break
                    if time.monotonic() - last > timeout_s:
                        log(f"no result for {timeout_s:g} s: killing the launch")
                        kill_group(proc)
                        break
                    time.sleep(0.5)
            finally:
                kill_group(proc)
        for line in _read_lines(results)[seen:]:  # written between the last poll and the exit
            r = json.loads(line)
            on_result(r["key"], by_key[r["key"]], r)
            todo = [(k, c) for k, c in todo if k != r["key"]]
        if not todo:
            break
        started = [ln.split()[1] for ln in _read_lines(progress) if ln.startswith("START ")]
        stuck = started[-1] if started and started[-1] in dict(todo) else todo[0][0]
        timed_out = time.monotonic() - last > timeout_s
        tail = (d / "log.txt").read_text(errors="replace").strip().splitlines()[-4:]
        msg = " | ".join(t.strip() for t in tail if "USDT" not in t)[-400:]
        errs = sorted(d.glob(f"{stuck}.rank*.err.json"))
        if errs:  # a rank failed and exited at once (trl.worker._fail_fast): its own error, not the launcher's
            e = json.loads(errs[0].read_text())
            res = failed_result(e.get("outcome") or "error", e.get("error") or "rank failed")
            res["trace"] = e.get("trace")
        elif timed_out:
            res = failed_result("timeout", f"no result within {timeout_s:g} s (killed)")
        else:
            res = failed_result("error", f"worker exited {proc.returncode}: {msg}")
        on_result(stuck, dict(todo)[stuck], res)
        todo = [(k, c) for k, c in todo if k != stuck]


def collect_trl(*, n: int, out_dir: Path | None = None, seed: int = 0, backends: tuple[str, ...] = ("single", "ddp"),
                shapes: tuple[str, ...] | None = None, warmup: int = 2, steps: int = 4, max_retries: int = 1,
                timeout_s: float = 300.0, chunk: int = 10, max_step_s: float = 1.5, retry_above: float = 1.0,
                min_seq: int = 128, zero_stages: tuple[int, ...] = (1, 2, 3), ds_worlds: tuple[int, ...] = (1,),
                command: str = "",
                configs: list[TrlConfig] | None = None, log: Callable[[str], None] = print) -> Path:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from perfpredict.core.dataset import append_rows
    from perfpredict.core.schema import trl_schema

    if warmup < 1 or steps < 1:
        from perfpredict.core.errors import PerfPredictError

        raise PerfPredictError(f"--warmup and --steps must be >= 1, got {warmup} and {steps}")
    out = Path(out_dir) if out_dir else default_out_dir()
    path = out / TABLE
    grid = configs if configs is not None else sample_grid(n, seed=seed, backends=backends, shapes=shapes,
                                                           max_step_s=max_step_s, min_seq=min_seq,
                                                           zero_stages=zero_stages, ds_worlds=ds_worlds)
    todo = pending(grid, path, warmup=warmup, steps=steps)
    log(f"{len(grid)} configs, {len(grid) - len(todo)} already in {path}, {len(todo)} to measure")
    if not todo:
        return path
    baseline = timing.calibration_baseline()
    log(f"calibration baseline {baseline * 1e3:.1f} ms")
    prov = fpr.provenance(command)
    cores = fpr.cpu_cores()
    schema = trl_schema()
    counts = {"ok": 0, "failed": 0}
    with Progress(TextColumn("[bold]trl[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}")) as bar, tempfile.TemporaryDirectory(prefix="pp-trl-") as tmp:
        task = bar.add_task("", total=len(todo))

        def on_result(key: str, cfg: TrlConfig, res: dict[str, Any]) -> None:
            row = trl_row(cfg, res, key=key, warmup=warmup, steps=steps, provenance=prov, cores=cores)
            append_rows(path, [row], schema)
            counts["ok" if res["outcome"] == "ok" else "failed"] += 1
            t = row.get("step_time_s")
            bar.update(task, advance=1, description=(
                f"ok {counts['ok']} failed {counts['failed']} | {cfg.trainer}/{cfg.loss_type}/{cfg.reference} "
                f"{cfg.backend} {cfg.shape} -> {res['outcome']}" + (f" {t:.2f} s/step" if t else "")))

        by_key = dict(todo)
        order = chunks([c for _, c in todo], chunk)
        keys = {id(c): k for k, c in todo}
        for i, (_backend, cfgs) in enumerate(order):
            items = [(keys[id(c)], c) for c in cfgs]
            assert all(k in by_key for k, _ in items)
            run_chunk(cfgs[0].world, items, work=Path(tmp) / f"chunk{i}", warmup=warmup, steps=steps,
                      baseline=baseline, max_retries=max_retries, timeout_s=timeout_s, retry_above=retry_above,
                      on_result=on_result,
                      log=log)
    log(f"{counts['ok']} ok, {counts['failed']} failed rows appended to {path}")
    return path
