"""One vLLM engine (one replica) driven over stdin/stdout by `perfpredict generate collect`.

    python -m perfpredict.collect.vllm.worker SPEC.json

Runs under the interpreter that has vLLM (an isolated venv on CPU). It starts `LLM(...)` with dummy weights from a
folder holding a Llama config.json, warms up, prints one `@@PP {"event": "ready", ...}` line (the engine's KV
capacity), then for each `go I` line on stdin runs workload I of the spec and prints one `@@PP {...}` result line;
`quit` ends it. Results carry the wall time of `LLM.generate`, the tokens produced, and the deltas of vLLM's own
metrics (TTFT / inter-token histograms, preemptions, prefix-cache hits) over that call. The parent starts one worker
per replica and sends `go` to all of them at once, so replicas generate side by side.

The engine core is a spawned process: everything runs under the `__main__` guard."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

PREFIX = "@@PP "


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def prompts_for(w: dict[str, Any], vocab: int, seed: int) -> list[list[int]]:
    """Deterministic random token ids; `shared_prefix_len` leading tokens common to every prompt (a system prompt),
    which is what prefix caching can reuse."""
    import random

    rng = random.Random(seed)
    hi = min(vocab, 30000) - 1
    shared = [rng.randint(10, hi) for _ in range(w.get("shared_prefix_len", 0))]
    return [shared + [rng.randint(10, hi) for _ in range(w["input_len"] - len(shared))] for _ in range(w["prompts"])]


def metric_totals(llm: Any) -> dict[str, float]:
    """Counters, and sum/count of histograms, of the engine's metrics (vLLM V1 `LLM.get_metrics`)."""
    out: dict[str, float] = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - older engines or stats disabled: the parent derives what it can
        return out
    for m in metrics:
        name = m.name
        if hasattr(m, "sum") and hasattr(m, "count"):
            out[name + ":sum"] = out.get(name + ":sum", 0.0) + float(m.sum)
            out[name + ":count"] = out.get(name + ":count", 0.0) + float(m.count)
        elif hasattr(m, "value") and isinstance(m.value, (int, float)):
            out[name] = out.get(name, 0.0) + float(m.value)
    return out


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    eng = spec["engine"]
    t0 = time.perf_counter()
    kw: dict[str, Any] = dict(model=spec["model_dir"], load_format="dummy", skip_tokenizer_init=True,
                              enforce_eager=True, max_model_len=eng["max_model_len"],
                              tensor_parallel_size=eng["tp"], max_num_seqs=eng["max_num_seqs"],
                              enable_prefix_caching=eng["prefix_caching"], dtype=eng.get("dtype", "bfloat16"),
                              disable_log_stats=False, seed=eng.get("seed", 0))
    if eng.get("kv_cache_memory_bytes"):
        kw["kv_cache_memory_bytes"] = int(eng["kv_cache_memory_bytes"])
    if eng.get("max_num_batched_tokens"):
        kw["max_num_batched_tokens"] = int(eng["max_num_batched_tokens"])
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    cc = llm.llm_engine.vllm_config.cache_config
    sc = llm.llm_engine.vllm_config.scheduler_config
    vocab = spec["vocab"]
    # Warm-up: first calls allocate and (on CPU) pick kernels; not part of any timed workload.
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts_for(
        {"prompts": 4, "input_len": 32}, vocab, 1)],
        SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False), use_tqdm=False)
    emit({"event": "ready", "start_s": start_s, "num_gpu_blocks": cc.num_gpu_blocks, "block_size": cc.block_size,
          "max_num_batched_tokens": sc.max_num_batched_tokens, "max_num_seqs": sc.max_num_seqs,
          "pid": os.getpid()})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        i = int(cmd[1])
        w = spec["workloads"][i]
        try:
            prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts_for(w, vocab, 1000 + i)]
            sp = SamplingParams(n=w["n"], max_tokens=w["output_len"], ignore_eos=True, detokenize=False,
                                temperature=1.0)  # no per-request seed: vLLM 0.32's CPU sampler
            # fails on seeded requests ("CPU Generator does not use offset")
            if eng["prefix_caching"]:
                # Repeats re-run the same prompts: without a reset they would hit the blocks the previous repeat
                # left, which a dataset of new prompts never does.
                llm.reset_prefix_cache()
            before = metric_totals(llm)
            t = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            wall = time.perf_counter() - t
            after = metric_totals(llm)
            delta = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
            out_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
            emit({"event": "result", "i": i, "wall_s": wall, "output_tokens": out_tokens,
                  "prompt_tokens": sum(len(p["prompt_token_ids"]) for p in prompts),
                  "completions": sum(len(o.outputs) for o in outs), "metrics": delta})
        except Exception as e:  # noqa: BLE001 - the parent records it as a row
            emit({"event": "result", "i": i, "error": f"{type(e).__name__}: {e}",
                  "trace": traceback.format_exc()[-2000:]})


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception as e:  # noqa: BLE001
        emit({"event": "failed", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
        sys.exit(1)
