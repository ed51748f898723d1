"""torchrun entry point for communication probes (gloo on CPU, NCCL on GPU); rank 0 writes the rows as JSON.

    torchrun --standalone --nproc-per-node W -m perfpredict.collect.probes.comm_probe --config cfg.json
    (across nodes: torchrun --nnodes N --nproc-per-node G --rdzv-endpoint HOST:PORT ... the same module)

`bytes` follows nccl-tests' `size`: the buffer an all_reduce / broadcast / send works on, the gathered output of
all_gather, the input of reduce_scatter, the whole send buffer of all_to_all. Each repeat is barrier-bracketed;
the time of a repeat is the slowest rank's (all_reduce MAX over the per-rank times), the label the median. The
repeat count is fixed from a first timed call, agreed over ranks (a per-rank adaptive stop would desynchronise
the collectives)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")


def _ag(out: torch.Tensor, inp: torch.Tensor) -> None:
    f = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    f(out, inp)


def _rs(out: torch.Tensor, inp: torch.Tensor) -> None:
    f = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    f(out, inp)


def make_op(op: str, nbytes: int, world: int, rank: int, device: torch.device) -> Any:
    n = max(world, nbytes // 4 // world * world)  # fp32 elements, divisible by world
    x = torch.ones(n, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "broadcast":
        return lambda: dist.broadcast(x, 0)
    if op == "all_gather":
        part = torch.ones(n // world, device=device)
        return lambda: _ag(x, part)
    if op == "reduce_scatter":
        part = torch.empty(n // world, device=device)
        return lambda: _rs(part, x)
    if op == "all_to_all":
        y = torch.empty_like(x)
        return lambda: dist.all_to_all_single(y, x)
    if op == "send_recv":
        # Pairs (0,1), (2,3), ...: even ranks send, odd ranks receive; an odd rank out sits idle.
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= world:
            return lambda: None
        if rank % 2 == 0:
            return lambda: dist.send(x, peer)
        return lambda: dist.recv(x, peer)
    raise ValueError(op)


def time_op(fn: Any, *, device: torch.device, warmup: int, cap_s: float, min_rep: int, max_rep: int) -> list[float]:
    def once() -> float:
        dist.barrier()
        t0 = time.perf_counter_ns()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e9

    for _ in range(warmup):
        once()
    first = torch.tensor([once()], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    reps = int(min(max_rep, max(min_rep, cap_s / max(float(first), 1e-6))))
    times = torch.tensor([once() for _ in range(reps)], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def run(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import statistics

    from perfpredict.collect.timing import cv_of

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = torch.cuda.is_available() and not cfg.get("force_cpu", False)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rows = []
    for op in cfg.get("ops", OPS):
        for nbytes in cfg["sizes"]:
            row: dict[str, Any] = {"op": op, "pass_": "comm", "dtype": "fp32", "bytes": int(nbytes),
                                   "world_size": world, "ranks_per_node": local_world, "flops": 0.0,
                                   "outcome": "ok", "error": None}
            try:
                fn = make_op(op, int(nbytes), world, rank, device)
                t = time_op(fn, device=device, warmup=cfg.get("warmup", 2), cap_s=cfg.get("cap_s", 1.0),
                            min_rep=cfg.get("min_repeats", 3), max_rep=cfg.get("max_repeats", 30))
                row.update(time_s=statistics.median(t), time_spread=cv_of(t), repeats=len(t))
                del fn
            except Exception as e:  # noqa: BLE001 - a failing probe is a row
                msg = str(e).lower()
                row.update(outcome="oom" if "out of memory" in msg or "allocate" in msg else "error",
                           error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
    dist.barrier()
    dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    warnings.filterwarnings("ignore", category=FutureWarning)
    rows = run(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(cfg["out"]).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
