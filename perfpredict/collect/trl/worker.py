"""One worker launch of `perfpredict collect trl`: a list of configs of one backend, measured in one process per
rank (imports and process start cost seconds; a config then costs its trainer construction and steps).

    python -m perfpredict.collect.trl.worker --job job.json                        # single
    accelerate launch --multi_gpu --num_processes 2 ... -m perfpredict.collect.trl.worker --job job.json

`accelerate launch --multi_gpu` without a GPU starts torchrun-style ranks that accelerate runs as MULTI_CPU over
gloo (accelerate/state.py; `--cpu` with 2 processes falls back to the simple single-process launcher).

Per config, on every rank: a gc, the calibration workload (all ranks at once, one thread each), the run, the
calibration again; other processes' CPU = the machine's busy CPU time minus every rank's own, over the config's
wall time, and the part of it beyond the cores our ranks leave idle (competing_load). A disturbed config
(calibration > 1.12x baseline or competing load > 0.3 cores, core.dataset's limits) is re-run up to `max_retries` times after waiting for a quiet
spell, and the least disturbed attempt is kept. Rank 0 appends one JSON line per config to the job's results file
and writes `START <key>` to its progress file first, so the parent can tell which config a hang or crash hit."""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import tempfile
import time
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist

from perfpredict.collect import timing
from perfpredict.collect.tensors import is_oom, live_tensor_bytes
from perfpredict.collect.trl.data import dataset, examples_needed, llama, tokenizer
from perfpredict.collect.trl.grid import TrlConfig
from perfpredict.collect.trl.measure import BatchRecorder, StepProbe
from perfpredict.collect.trl.trainers import build_trainer, enable_fsdp_on_cpu, release
from perfpredict.core.gates import CALIB_RATIO_MAX, OTHER_LOAD_MAX_CORES


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _broadcast(obj: Any) -> Any:
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def on_disk(train: Any, shared_dir: str) -> Any:
    """The dataset saved by rank 0 and loaded by every rank from one folder, as a dataset loaded from disk or the
    Hub is: TRL's reference precompute writes its cache file beside the dataset's own cache files and every rank
    reads it back (dpo_trainer.py:1168-1240); with an in-memory dataset each rank looks in its own temporary folder
    and the other ranks fail (FileNotFoundError), so in-memory datasets cannot precompute under DDP."""
    from datasets import load_from_disk

    if not dist.is_initialized() or dist.get_rank() == 0:
        train.save_to_disk(shared_dir)
    _barrier()
    return load_from_disk(shared_dir)


def from_disk(model: Any, path: str) -> Any:
    from transformers import LlamaForCausalLM

    if not dist.is_initialized() or dist.get_rank() == 0:
        model.save_pretrained(path)
    _barrier()
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)


def run_config(cfg: TrlConfig, *, warmup: int, steps: int, tmp: str, shared_dir: str) -> dict[str, Any]:
    """Build the trainer and train warmup + steps + 1 (profiled) optimizer steps; this rank's figures."""
    total = warmup + steps + 1
    cuda = cfg.device == "cuda"
    if cuda:  # this config's peaks only (a launch measures several configs)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    tok = tokenizer(_vocab(cfg))
    model = llama(cfg.shape, tok, cfg.seed, cfg.device)
    ref = llama(cfg.shape, tok, cfg.seed, cfg.device) if cfg.reference == "live" else None
    train = on_disk(dataset(cfg, examples_needed(cfg, total)), shared_dir + "/data")
    if cfg.backend == "fsdp":
        if not cuda:
            enable_fsdp_on_cpu()
        if cfg.reference == "precomputed":
            # Under FSDP TRL builds a reference from the policy's path to precompute with (dpo_trainer.py:908-926,
            # 1032-1033), as it does for a user's model loaded by name: the random model is saved and reloaded.
            model = from_disk(model, shared_dir + "/model")
    probe, rec = StepProbe(total, device=cfg.device), BatchRecorder()
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, model=model, ref_model=ref, tok=tok, train=train, steps=total, out_dir=tmp,
                            callbacks=[probe])
    construct_s = time.perf_counter() - t0
    trainer.data_collator = rec.wrap(trainer.data_collator)
    ref_in_memory = getattr(trainer, "ref_model", None) is not None
    dist_type = str(trainer.accelerator.distributed_type).split(".")[-1]
    if cfg.backend == "fsdp" and dist_type != "FSDP":  # enable_fsdp_on_cpu did not take: never record DDP as FSDP
        raise RuntimeError(f"FSDP requested but accelerate runs the model as {dist_type} on this machine")
    # ZeRO-3 partitions in place (a parameter's numel drops to 0, ds_numel keeps the full count): TRL's precompute
    # engine (kto_trainer.py:1249-1251) does it at construction.
    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    out = trainer.train()
    if cfg.backend == "deepspeed":
        release(trainer)
    res: dict[str, Any] = {
        "times_s": probe.step_times(warmup, steps), "peak_bytes": probe.peak_bytes, "base_bytes": probe.base_bytes,
        "net_bytes": probe.net_bytes, "end_bytes": probe.end_bytes,
        "rss_bytes": probe.rss_bytes, "construct_s": construct_s, "ref_in_memory": ref_in_memory,
        "distributed_type": dist_type, "params_measured": params, "grad_bytes": grad_bytes,
        "train_loss": float(out.training_loss), "steps_done": int(trainer.state.global_step),
        "padding_free_effective": bool(getattr(trainer, "padding_free", False)),
        "reserved_bytes": probe.reserved_bytes, "run_peak_bytes": probe.run_peak_bytes,
        **rec.summary(2 if cfg.trainer == "kto" else 1),
    }
    del trainer, model, ref, out
    return res


def _vocab(cfg: TrlConfig) -> int:
    return cfg.spec.vocab


def _fail_fast(key: str, mine: dict[str, Any], err_dir: str) -> None:
    """A rank that failed while its peers may sit in a collective: leave its error for the parent and exit at
    once, so the launcher tears the other ranks down instead of both blocking forever (as collect.harness.run_step)."""
    rank = dist.get_rank()
    with open(os.path.join(err_dir, f"{key}.rank{rank}.err.json"), "w") as fh:
        json.dump({k: mine.get(k) for k in ("outcome", "error", "trace")}, fh)
    os._exit(3)


def attempt(cfg: TrlConfig, *, warmup: int, steps: int, key: str = "", err_dir: str = "") -> dict[str, Any]:
    """One measured attempt of cfg (every rank); returns the merged result on every rank."""
    gc.collect()
    _barrier()
    before = timing.calibrate()
    _barrier()
    busy0, steal0, own0, t0 = timing._busy_cpu_s(), timing._steal_cpu_s(), _own_cpu_s(), time.monotonic()
    tmp = tempfile.mkdtemp(prefix="pp-trl-")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    shared = _broadcast(tempfile.mkdtemp(prefix="pp-trl-ds-", dir=err_dir or None) if rank0 else None)
    mine: dict[str, Any] = {"outcome": "ok", "error": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine.update(run_config(cfg, warmup=warmup, steps=steps, tmp=tmp, shared_dir=shared))
    except Exception as e:  # noqa: BLE001 - a failed config is a row
        mine.update(outcome="oom" if is_oom(e) else "error",
                    error=f"{type(e).__name__}: {e}"[:600], trace=traceback.format_exc()[-2000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if mine["outcome"] == "ok":
        _barrier()  # every rank is done with the shared dataset folder
        if rank0:
            shutil.rmtree(shared, ignore_errors=True)
    # (one DeepSpeed process initialises torch.distributed itself, world 1: nobody to wait for, go on)
    if mine["outcome"] != "ok" and dist.is_initialized() and dist.get_world_size() > 1 and err_dir:
        _fail_fast(key, mine, err_dir)
    gc.collect()
    _barrier()
    wall = time.monotonic() - t0
    busy, steal, own = timing._busy_cpu_s() - busy0, timing._steal_cpu_s() - steal0, _own_cpu_s() - own0
    after = timing.calibrate()
    mine.update(calib_before_s=before, calib_after_s=after, own_cpu_s=own)
    ranks = _gather(mine)
    bad = [r for r in ranks if r["outcome"] != "ok"]
    worst = next((r for r in bad if r["outcome"] == "oom"), bad[0]) if bad else ranks[0]
    return {"outcome": worst["outcome"], "error": worst.get("error"), "trace": worst.get("trace"), "ranks": ranks,
            "wall_s": wall, "steal_cores": timing.cores_over(steal, wall),
            "other_load_cores": (other := timing.cores_over(busy - sum(r["own_cpu_s"] for r in ranks), wall)),
            "competing_load_cores": competing_load(other, len(ranks)),
            "calib_before_s": max(r["calib_before_s"] for r in ranks),
            "calib_after_s": max(r["calib_after_s"] for r in ranks)}


def competing_load(other_cores: float, ranks: int) -> float:
    """Other processes' CPU beyond the cores our ranks leave idle: a single-rank config on 2 cores leaves one core
    to the neighbours (on this shared machine they always fill it), which does not take our rank's core. The
    calibration ratio says whether it slowed us anyway (shared caches, SMT siblings)."""
    return max(other_cores - max((os.cpu_count() or 1) - ranks, 0), 0.0)


def disturbance(a: dict[str, Any], baseline: float) -> float:
    ratio = max(a["calib_before_s"], a["calib_after_s"]) / baseline
    return max((ratio - 1.0) / (CALIB_RATIO_MAX - 1.0), a["competing_load_cores"] / OTHER_LOAD_MAX_CORES)


def measure(cfg: TrlConfig, *, warmup: int, steps: int, baseline: float, max_retries: int,
            retry_above: float = 1.0, key: str = "", err_dir: str = "") -> dict[str, Any]:
    """The config measured, re-run while its disturbance (1 = at the gate's limits) is above retry_above."""
    attempts: list[dict[str, Any]] = []
    start = live_tensor_bytes(cfg.device) if cfg.backend == "deepspeed" else 0
    for i in range(max_retries + 1):
        # A finished DeepSpeed ZeRO-3 trainer leaves its partitions reachable even after release() (measured: 24 B
        # per parameter per run, stages 0-2 free everything): a retry in this process would count them in its
        # peak, so no retry once anything is left over (the row keeps the first attempt and its gate columns).
        if i > 0 and cfg.backend == "deepspeed" and max(_gather(live_tensor_bytes(cfg.device) - start)) > 2**20:
            break
        if i > 0 and (not dist.is_initialized() or dist.get_rank() == 0):
            timing.wait_quiet(max_wait_s=5.0)
        _barrier()
        a = attempt(cfg, warmup=warmup, steps=steps, key=key, err_dir=err_dir)
        attempts.append(a)
        if a["outcome"] != "ok" or _broadcast(disturbance(a, baseline)) <= retry_above:
            break
    ok = [a for a in attempts if a["outcome"] == "ok"]
    best = min(ok, key=lambda a: disturbance(a, baseline)) if ok else attempts[-1]
    return {**best, "attempts": len(attempts), "calib_baseline_s": baseline}


def _autogroup_nice() -> None:
    """With CFS autogroups (/proc/sys/kernel/sched_autogroup_enabled = 1) a nice value only ranks processes inside
    one session: the neighbours' `nice -n 19` work in their own sessions competes with this launch as an equal
    group. PP_AUTOGROUP_NICE (set by the collector) gives this launch's group the weight a normal-priority job was
    meant to have over them; without the permission it stays as it is."""
    value = os.environ.get("PP_AUTOGROUP_NICE")
    if value:
        try:
            with open("/proc/self/autogroup", "w") as fh:
                fh.write(value)
        except OSError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    job = json.loads(open(ap.parse_args().job).read())
    torch.set_num_threads(1)
    _autogroup_nice()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    baseline = float(job["baseline_s"])
    for raw in job["configs"]:
        cfg = TrlConfig(**raw["config"])
        if rank == 0:
            with open(job["progress"], "a") as fh:
                fh.write(f"START {raw['key']}\n")
        res = measure(cfg, warmup=job["warmup"], steps=job["steps"], baseline=baseline,
                      max_retries=job["max_retries"], retry_above=float(job.get("retry_above", 1.0)),
                      key=raw["key"], err_dir=os.path.dirname(job["results"]))
        # Both calibrations well under the baseline: it was taken on a busy machine; lower it (as runs.run_one).
        if max(res["calib_before_s"], res["calib_after_s"]) < 0.95 * baseline:
            baseline = max(res["calib_before_s"], res["calib_after_s"])
        if rank == 0:
            with open(job["results"], "a") as fh:
                fh.write(json.dumps({"key": raw["key"], "config": raw["config"], **res}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
    _barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
