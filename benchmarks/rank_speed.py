"""Ranking speed: plans per second and how it grows with the plan count; a cold `perfpredict rank`.

Run by hand: `python benchmarks/rank_speed.py`. Targets: all plans of a 512-GPU cluster for a 70B model
ranked in under 1 s warm; a cold CLI rank under 2 s. Calculon searches about 420 plans/s per core, for scale."""

from __future__ import annotations

import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from perfpredict.core import Cluster, Workload, get_gpu, get_model
from perfpredict.features.plans import PlanSpace
from perfpredict.predictor.predict import load_predictor
from perfpredict.predictor.rank import rank_plans

CASES = [  # (model, gpus, global batch)
    ("llama-3.2-1b", 8, 64), ("llama-3.1-8b", 16, 64), ("llama-3.1-8b", 64, 256), ("llama-3.1-70b", 128, 512),
    ("llama-3.1-70b", 512, 1024), ("llama-3.1-70b", 512, 4096), ("llama-3.1-405b", 1024, 2048),
]


def main() -> None:
    bundle = load_predictor()
    t = Table("model", "GPUs", "global batch", "plans", "rank s (best of 3)", "plans/s")
    for name, gpus, gb in CASES:
        m = get_model(name)
        cl = Cluster(get_gpu("h100-sxm-80gb"), 8, gpus // 8)
        w = Workload(objective="dpo", seq_len=4096, global_batch=gb)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            r = rank_plans(model=m, cluster=cl, workload=w, space=PlanSpace(), bundle=bundle)
            best = min(best, time.perf_counter() - t0)
        t.add_row(name, str(gpus), str(gb), str(r.table.height), f"{best:.3f}", f"{r.table.height / best:,.0f}")
    Console().print(t)
    cmd = [sys.executable, "-m", "perfpredict.cli", "rank", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb",
           "--gpus", "512", "--global-batch", "1024", "--seq-len", "4096", "--top", "5"]
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    Console().print(f"cold `perfpredict rank` (70B, 512 GPUs, new process each time): best {min(walls):.2f} s, "
                    f"median {sorted(walls)[1]:.2f} s")


if __name__ == "__main__":
    main()
