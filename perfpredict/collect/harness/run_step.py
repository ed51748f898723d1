"""torchrun entry point: one training setup, warm-up + timed steps, peak memory; one JSON result per rank.

    torchrun --standalone --nproc-per-node W -m perfpredict.collect.harness.run_step --config cfg.json

The config holds model (ModelSpec dict), workload, plan, warmup, steps, seed, threads, out_dir and optional
`fail` (error | oom | hang: failure injection for tests). Each rank writes out_dir/rank<r>.json; when all ranks got
through, rank 0 also writes out_dir/result.json with the merged figures. A rank that fails writes its file and
exits at once, so torchrun tears the others down instead of leaving them blocked in a collective.

Timing (shared/notes/cpu-measurement.md): 1 thread per rank; every step bracketed by barriers, wall time
barrier-to-barrier on rank 0 (on GPU after a device synchronise); the median of the timed steps is the label.

Memory:
- GPU: torch.cuda.max_memory_allocated / max_memory_reserved over warm-up and timed steps.
- CPU: the peak of live tensor bytes over one extra, untimed step: the bytes alive when it starts (every tensor
  Python can reach, found by a gc scan, storages counted once; grads already freed) plus the running maximum of
  the CPU allocator's allocations during the step from torch.profiler(profile_memory=True). DDP's flat gradient
  buckets are allocated in C++ when the model is wrapped and neither method sees them, so the label leaves them
  out (a label is only what was measured); their size (the gradient bytes, one copy) is recorded beside it as
  ddp_bucket_bytes, and features.memory.ddp_buckets adds it to the analytic peak. Process RSS peak is recorded as
  well, not as the label (it carries ~350 MB of import baseline)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perfpredict.collect.tensors import is_oom, live_tensor_bytes


def profiled_peak_bytes(fn: Any) -> int:
    """Running maximum of bytes allocated (minus freed) during fn(), from the profiler's allocation events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    events: list[tuple[int, int]] = []

    def walk(node: Any) -> None:
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for c in node.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort()
    cur = peak = 0
    for _, size in events:
        cur += size
        peak = max(peak, cur)
    return peak


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from perfpredict.collect.harness.parallel import build_runner
    from perfpredict.core.model import ModelSpec
    from perfpredict.core.plan import Plan
    from perfpredict.core.workload import Workload

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    res: dict[str, Any] = {"rank": rank, "world": world, "outcome": "error", "error": None}
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available() and not cfg.get("force_cpu", False)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(int(cfg.get("threads", 1)))
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    spec = ModelSpec.from_dict(cfg["model"])
    workload = Workload.from_dict(cfg["workload"])
    plan = Plan.from_dict(cfg["plan"])
    runner = build_runner(spec, workload, plan, rank=rank, world=world, device=device, seed=int(cfg.get("seed", 0)))

    fail = cfg.get("fail")
    if fail == "error":
        raise RuntimeError("injected failure (config fail=error)")
    if fail == "oom":
        # A real allocator failure: far more than any machine holds (CPU: "can't allocate memory"; GPU: OOM).
        torch.empty(1 << 42, dtype=torch.uint8, device=device)
    if fail == "hang":
        time.sleep(10**6)

    for _ in range(int(cfg.get("warmup", 2))):
        runner.step()
    _barrier()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(int(cfg.get("steps", 5))):
        _barrier()
        t0 = time.perf_counter_ns()
        loss = runner.step()
        if cuda:
            torch.cuda.synchronize()
        _barrier()
        times.append((time.perf_counter_ns() - t0) / 1e9)
        losses.append(runner.global_loss(loss) if dist.is_initialized() else float(loss))
    res.update(times_s=times, losses=losses, ddp_bucket_bytes=runner.ddp_bucket_bytes)
    if cuda:
        res.update(peak_bytes=torch.cuda.max_memory_allocated(), reserved_bytes=torch.cuda.max_memory_reserved(),
                   memory_kind="cuda_max_allocated")
    elif cfg.get("measure_memory", True):
        runner.optimizer.zero_grad(set_to_none=True)  # frees from before the window would be invisible to it
        base = live_tensor_bytes("cpu")
        _barrier()
        during = profiled_peak_bytes(runner.step)
        res.update(peak_bytes=base + during, baseline_bytes=base, reserved_bytes=None,
                   memory_kind="live_tensor_peak")
    _barrier()
    res["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res["outcome"] = "ok"
    res["wall_s"] = time.perf_counter() - t_start
    return res


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank files -> one result: the worst outcome, rank 0's step times, memory per rank."""
    order = {"ok": 0, "timeout": 1, "error": 2, "oom": 3}
    results = sorted(results, key=lambda r: r.get("rank", 0))
    worst = max(results, key=lambda r: order.get(r.get("outcome", "error"), 2))
    out: dict[str, Any] = {"outcome": worst.get("outcome", "error"), "error": worst.get("error"),
                           "ranks_reported": len(results)}
    if out["outcome"] == "ok":
        r0 = results[0]
        out.update(times_s=r0["times_s"], losses=r0["losses"], memory_kind=r0.get("memory_kind"),
                   peak_bytes=[r.get("peak_bytes") for r in results],
                   reserved_bytes=[r.get("reserved_bytes") for r in results],
                   rss_peak_bytes=[r.get("rss_peak_bytes") for r in results],
                   ddp_bucket_bytes=r0.get("ddp_bucket_bytes", 0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    try:
        res = run(cfg)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a result
        res = {"rank": rank, "world": world, "outcome": "oom" if is_oom(e) else "error",
               "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400] if str(e).strip() else ''}",
               "traceback": traceback.format_exc()[-4000:]}
        (out / f"rank{rank}.json").write_text(json.dumps(res))
        sys.stderr.write(res["traceback"])
        sys.stderr.flush()
        os._exit(1)  # do not wait in a collective for ranks that will never come
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        merged = merge([json.loads((out / f"rank{r}.json").read_text()) for r in range(world)])
        (out / "result.json").write_text(json.dumps(merged))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
