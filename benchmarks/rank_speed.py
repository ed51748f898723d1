"""Ranking speed against the previous release, measured in the same run: a cold `perfpredict rank` (a new process)
and warm ranking (plans/s) for Llama-3.1-70B DPO on 512 H100, then how warm speed grows with the plan count.
Warm is the same scenario ranked again in one process (its described plans remembered: predictor.rank
_described_plans); "new scenario" empties that memo before each ranking (its plans enumerated and described anew;
what a process remembers below a scenario, the kernel models' answers and the layouts' legality probes, stays, as
for any later ranking of the process: a first ranking in a new process is the cold run). CPU seconds are shown
beside wall seconds: on a shared machine they move less with the load.

Run by hand: `python benchmarks/rank_speed.py` (`--baseline REF` for another git commit to compare with, `--runs N`).
Targets (issue 21): cold under 1.0 s and warm at least 50,000 plans/s on a 2-core machine. The previous release is
checked out of git (`git archive`) into a temporary folder and run by the same harness, alternating with this tree
run by run, so both see the same load; medians are reported, and the top plans of both are compared (the speed work
must not change a number beyond 1e-9 relative). Calculon searches about 420 plans/s per core, for scale."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
# main just before issue 21's speed work landed (0045894: engine terms, host-RAM checks and TRL host scales in, the speed work
# not): the same predictions, so the top plans must match to 1e-9.
PREVIOUS_RELEASE = "0045894"
CLI = ["rank", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--gpus", "512", "--global-batch", "1024",
       "--seq-len", "4096", "--top", "5"]
HEAVY = ("xgboost", "scipy", "torch", "matplotlib", "sklearn")
CASES = [  # (model, gpus, global batch)
    ("llama-3.2-1b", 8, 64), ("llama-3.1-8b", 16, 64), ("llama-3.1-8b", 64, 256), ("llama-3.1-70b", 128, 512),
    ("llama-3.1-70b", 512, 1024), ("llama-3.1-70b", 512, 4096), ("llama-3.1-405b", 1024, 2048),
]
# Runs in a fresh interpreter on either tree (only API both releases have): warm-up once, then time `reps` rankings.
WARM = """
import json, sys, time
from perfpredict.core import Cluster, Workload, get_gpu, get_model
from perfpredict.features.plans import PlanSpace
from perfpredict.predictor.predict import load_predictor
from perfpredict.predictor.rank import rank_plans
model, gpus, gb, reps, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
b = load_predictor()
args = dict(model=get_model(model), cluster=Cluster(get_gpu("h100-sxm-80gb"), 8, gpus // 8),
            workload=Workload(objective="dpo", seq_len=4096, global_batch=gb), space=PlanSpace(), bundle=b)
r = rank_plans(**args)
times, cpu = [], []
for _ in range(reps):
    t0, c0 = time.perf_counter(), time.process_time()
    r = rank_plans(**args)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
# The same rankings with the scenario memo emptied first (rank._described_plans; a tree without one is unchanged):
# a ranking of a scenario this process has not ranked yet, its plans enumerated and described anew.
import perfpredict.predictor.rank as rank_mod
memo = getattr(rank_mod, "_scenario_memo", {})
fresh, fresh_cpu = [], []
for _ in range(reps):
    memo.clear()
    t0, c0 = time.perf_counter(), time.process_time()
    rank_plans(**args)
    fresh.append(time.perf_counter() - t0)
    fresh_cpu.append(time.process_time() - c0)
cols = ["plan", "samples_per_s", "step_time_s", "peak_memory_gib", "peak_memory_lo_gib", "peak_memory_hi_gib",
        "step_time_lo_s", "step_time_hi_s", "fits"]
print(json.dumps({"times": times, "cpu": cpu, "fresh": fresh, "fresh_cpu": fresh_cpu, "plans": r.table.height, "top": r.table.head(top).select(cols).to_dicts()}))
"""
# The CLI as a user runs it, reporting at exit which heavy modules it imported.
COLD = """
import atexit, runpy, sys
heavy = set(sys.argv[1].split(","))
atexit.register(lambda: print("HEAVY", sorted({m.split(".")[0] for m in sys.modules} & heavy), file=sys.stderr))
sys.argv = ["perfpredict"] + sys.argv[2:]
runpy.run_module("perfpredict.cli", run_name="__main__")
"""


def _export(ref: str, into: Path) -> Path:
    """The perfpredict package of git commit `ref`, unpacked under `into` (no worktree, nothing left behind)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "perfpredict"], check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(tar.stdout)) as t:
        t.extractall(into, filter="data")
    return into


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cold(tree: Path) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds (user + system: what the wall would be on an idle machine, give or take polars'
    second thread) of one `perfpredict rank` in a new process, and the heavy modules it imported."""
    with tempfile.TemporaryDirectory() as cwd:  # a neutral cwd: `-m`/`-c` put it first on sys.path
        c0, t0 = _children_cpu(), time.perf_counter()
        p = subprocess.run([sys.executable, "-c", COLD, ",".join(HEAVY), *CLI], env=_env(tree), cwd=cwd,
                           capture_output=True, text=True, check=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    heavy = next((line for line in p.stderr.splitlines() if line.startswith("HEAVY")), "HEAVY []")
    return wall, cpu, json.loads(heavy.removeprefix("HEAVY ").replace("'", '"'))


def warm(tree: Path, model: str = "llama-3.1-70b", gpus: int = 512, gb: int = 1024, reps: int = 3,
         top: int = 20) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        p = subprocess.run([sys.executable, "-c", WARM, model, str(gpus), str(gb), str(reps), str(top)],
                           env=_env(tree), cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def same_top(a: list[dict], b: list[dict], rel: float = 1e-9) -> str:
    if [r["plan"] for r in a] != [r["plan"] for r in b]:
        return "NO: the top plans differ"
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for k, v in x.items():
            if isinstance(v, float):
                worst = max(worst, abs(v - y[k]) / max(abs(v), 1e-300))
            elif v != y[k]:
                return f"NO: {x['plan']} {k} {v} vs {y[k]}"
    return f"yes (largest relative difference {worst:.1e})" if worst <= rel else f"NO: relative difference {worst:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=PREVIOUS_RELEASE, help="git commit to compare with ('' for none)")
    ap.add_argument("--runs", type=int, default=5, help="cold runs and warm processes per tree")
    ap.add_argument("--no-cases", action="store_true", help="skip the plans/s-by-size table")
    ap.add_argument("--source-only", action="store_true",
                    help="do not compile bytecode first (with PYTHONDONTWRITEBYTECODE set, every run compiles)")
    a = ap.parse_args()
    con = Console(width=120)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT}
        if a.baseline:
            try:
                trees[f"previous ({a.baseline})"] = _export(a.baseline, Path(tmp))
            except (subprocess.CalledProcessError, FileNotFoundError) as e:
                con.print(f"no baseline: git archive {a.baseline} failed ({e}); this tree alone")
        if not a.source_only:  # as an installed package runs: pip compiles the bytecode at install time
            for tree in trees.values():
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "perfpredict")], check=True,
                               capture_output=True)
        colds: dict[str, list[float]] = {k: [] for k in trees}
        cold_cpu: dict[str, list[float]] = {k: [] for k in trees}
        warms: dict[str, list[float]] = {k: [] for k in trees}
        warm_cpu: dict[str, list[float]] = {k: [] for k in trees}
        fresh: dict[str, list[float]] = {k: [] for k in trees}
        fresh_cpu: dict[str, list[float]] = {k: [] for k in trees}
        heavy: dict[str, list[str]] = {}
        tops: dict[str, list[dict]] = {}
        plans = 0
        for _ in range(a.runs):  # alternate the trees so both see the same load
            for name, tree in trees.items():
                wall, cpu, heavy[name] = cold(tree)
                colds[name].append(wall)
                cold_cpu[name].append(cpu)
                w = warm(tree)
                warms[name].append(statistics.median(w["times"]))
                warm_cpu[name].append(statistics.median(w["cpu"]))
                fresh[name].append(statistics.median(w["fresh"]))
                fresh_cpu[name].append(statistics.median(w["fresh_cpu"]))
                tops[name], plans = w["top"], w["plans"]
        med = statistics.median
        t = Table("tree", "cold s (median)", "best", "cold CPU s", "warm s (median)",
                  f"warm plans/s ({plans:,} plans)", "warm CPU s", "new scenario plans/s", "new scenario CPU s",
                  "heavy imports",
                  title="Llama-3.1-70B DPO on 512 H100, global batch 1024, seq 4096 (medians)")
        for name in trees:
            t.add_row(name, f"{med(colds[name]):.2f}", f"{min(colds[name]):.2f}", f"{med(cold_cpu[name]):.2f}",
                      f"{med(warms[name]):.3f}", f"{plans / med(warms[name]):,.0f}", f"{med(warm_cpu[name]):.3f}",
                      f"{plans / med(fresh[name]):,.0f}", f"{med(fresh_cpu[name]):.3f}",
                      ", ".join(heavy[name]) or "none")
        con.print(t)
        if len(trees) == 2:
            new, old = trees
            # The top plans can only match where both trees ship the same bundle (a retrained one predicts anew).
            meta = "perfpredict/predictor/default/metadata.json"
            same_bundle = (trees[old] / meta).read_bytes() == (trees[new] / meta).read_bytes()
            verdict = (same_top(tops[old], tops[new]) if same_bundle else
                       "not compared (the baseline ships another bundle; --baseline a commit with this one)")
            con.print(f"cold: {statistics.median(colds[old]) / statistics.median(colds[new]):.1f}x faster than the "
                      f"previous release; warm: {statistics.median(warms[old]) / statistics.median(warms[new]):.2f}x; "
                      f"new scenario: {statistics.median(fresh[old]) / statistics.median(fresh[new]):.2f}x (CPU "
                      f"{statistics.median(fresh_cpu[old]) / statistics.median(fresh_cpu[new]):.2f}x); "
                      f"top 20 plans and predictions identical: {verdict}")
        con.print(f"targets: cold < 1.0 s ({'met' if statistics.median(colds['this tree']) < 1.0 else 'NOT met'}), "
                  f"warm >= 50,000 plans/s ({'met' if plans / statistics.median(warms['this tree']) >= 50_000 else 'NOT met'}"
                  f", new scenario {'met' if plans / statistics.median(fresh['this tree']) >= 50_000 else 'NOT met'})"
                  f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
                  + ("; bytecode compiled first, as pip does" if not a.source_only else "; from source"))
    if a.no_cases:
        return
    t = Table("model", "GPUs", "global batch", "plans", "rank s (median of 3)", "plans/s", title="warm, this tree")
    for model, gpus, gb in CASES:
        w = warm(ROOT, model, gpus, gb, reps=3, top=1)
        s = statistics.median(w["times"])
        t.add_row(model, str(gpus), str(gb), f"{w['plans']:,}", f"{s:.3f}", f"{w['plans'] / s:,.0f}")
    con.print(t)


if __name__ == "__main__":
    main()
