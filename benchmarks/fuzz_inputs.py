"""Fuzz every entry point with mutated inputs, by hand: `python benchmarks/fuzz_inputs.py [N] [SEED]` (default 1000, 0).

Each input is a scenario with one to three random mutations anywhere in its schema (wrong types, out-of-range and
huge numbers, NaN, missing and extra keys, sections of the wrong type, whole files of random bytes, lists, JSON
Lines mixing good and bad lines) run through `predict` and `describe`, or random option values for `rank` and
`plans`, or a library call (perfpredict.predict / predict_many / rank). An outcome is `ok` (exit 0), `refused`
(exit 2, last stderr line "error: ...") or `BROKEN` (a traceback, another exit code, or a multi-line error). Prints
the tally and every broken input; exits 1 if any broke."""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import track
from typer.testing import CliRunner

import perfpredict
from perfpredict.cli import app
from perfpredict.core import Cluster, PerfPredictError, Workload, get_gpu

BASE = json.loads((Path(__file__).resolve().parents[1] / "examples" / "scenario-8b-dpo.json").read_text())
FIELDS = {
    "workload": ["objective", "seq_len", "global_batch", "dataset_size", "epochs", "precision", "master_weights_fp32",
                 "reference"],
    "plan": ["tp", "pp", "dp", "cp", "sequence_parallel", "zero", "recompute", "micro_batch", "grad_accum",
             "optimizer_offload", "framework", "schedule", "virtual_stages", "ep", "param_offload", "stage_layers"],
    "hardware": ["gpu", "gpus_per_node", "nodes", "gpus", "intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s"],
    "model": ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "experts_per_token", "expert_ffn",
              "tied_embeddings", "head_dim"],
}
CUSTOM_MODEL = {"name": "fz", "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192, "vocab": 128256}


def junk(r: random.Random):
    return r.choice([
        None, True, False, 0, 1, 2, 3, -1, 7, 28, 10**18, -(10**30), 2**63, 0.5, 2.0, float("nan"), float("inf"),
        -0.0, 1e308, "", "nan", "1", "tp", "megatron", "trl", "deepspeed", "gpipe", "interleaved", "live", "\x00",
        [], [1, 2], [4, 4, 4, 4, 4, 4, 4], {}, {"a": 1}, "h100-sxm-80gb", "é" * 5, r.randint(-5, 300),
        r.uniform(-10, 1e6)])


def scenario_file(r: random.Random) -> bytes:
    roll = r.random()
    if roll < 0.06:
        return bytes(r.randrange(256) for _ in range(r.randint(0, 80)))
    if roll < 0.1:
        return r.choice([b"[]", b"{}", b"null", b"3", b'"x"', b"[" * 5000, b"\xef\xbb\xbf{}", b"   \n\n"])
    d = json.loads(json.dumps(BASE))
    if r.random() < 0.3:
        d["model"] = dict(CUSTOM_MODEL)
    for _ in range(r.randint(1, 3)):
        section = r.choice(list(FIELDS))
        kind = r.random()
        if kind < 0.08:
            d[section] = junk(r)
        elif not isinstance(d.get(section), dict):
            continue
        elif kind < 0.18:
            d[section].pop(r.choice(list(d[section])), None) if d[section] else None
        elif kind < 0.25:
            d[section][r.choice(["bogus", "TP", "gpu_count"])] = junk(r)
        else:
            d[section][r.choice(FIELDS[section])] = junk(r)
    text = json.dumps(d, allow_nan=True)
    roll = r.random()
    if roll < 0.15:  # JSON Lines mixing this with good and broken lines
        return "\n".join([json.dumps(BASE), text, "{broken", ""]).encode()
    if roll < 0.2:
        return json.dumps([BASE, d], allow_nan=True).encode()
    if roll < 0.25:
        return json.dumps({"scenario": d}).encode()
    return text.encode()


def option(r: random.Random, good: str) -> str:
    return good if r.random() < 0.6 else str(junk(r))


def cli_case(r: random.Random, tmp: Path) -> tuple[str, list[str]]:
    kind = r.random()
    if kind < 0.55:
        f = tmp / f"s{r.randrange(10**9)}.json"
        f.write_bytes(scenario_file(r))
        cmd = r.choice(["predict", "describe"])
        extra = r.choice([[], [], ["--json", "-"], ["--json", str(tmp / "out.json")], ["--json", str(f)]])
        return f"{cmd} {f.read_bytes()[:120]!r}", [cmd, str(f), *extra]
    if kind < 0.8:
        args = ["plans", "--model", option(r, "qwen2.5-0.5b"), "--gpu", option(r, "a100-sxm-80gb"),
                "--gpus", option(r, str(r.choice([1, 2, 8, 16, 24]))), "--gpus-per-node", option(r, "8"),
                "--global-batch", option(r, "64"), "--seq-len", option(r, "2048"), "--objective", option(r, "dpo"),
                "--sample", option(r, "5")]
        return " ".join(args), args
    args = ["rank", "--model", option(r, "llama-3.2-1b"), "--gpu", option(r, "h100-sxm-80gb"),
            "--gpus", option(r, str(r.choice([1, 2, 8]))), "--seq-len", option(r, "1024"),
            "--global-batch", option(r, "16"), "--top", option(r, "3"), "--objective", option(r, "dpo"),
            "--framework", option(r, "megatron"), "--target-pairs-per-s", option(r, "0"),
            "--reference", option(r, ""), "--precision", option(r, "bf16"), "--pairs", option(r, "1000")]
    args += r.choice([[], ["--emit", option(r, "megatron"), "--emit-dir", str(tmp / "emit")],
                      ["--csv", option(r, str(tmp / "r.csv"))], ["--json", option(r, "-")]])
    return " ".join(args), args


def library_case(r: random.Random) -> tuple[str, object]:
    d = junk(r)
    if r.random() < 0.5:
        try:
            d = json.loads(scenario_file(r).decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            pass  # not one JSON value (bytes, JSON Lines): keep the junk value
    which = r.choice(["predict", "predict_many", "rank"])
    if which == "predict":
        return f"predict({d!r:.100})", lambda: perfpredict.predict(d)
    if which == "predict_many":
        items = [BASE, d] if r.random() < 0.5 else d
        return f"predict_many({items!r:.100})", lambda: perfpredict.predict_many(items, errors=r.choice(
            ["raise", "return", "x"]))
    kw = {"model": r.choice(["llama-3.2-1b", junk(r)]), "top": r.choice([None, 3, junk(r)]),
          "cluster": r.choice([Cluster(get_gpu("h100-sxm-80gb"), 8, 1), junk(r)]),
          "workload": r.choice([Workload(global_batch=16, seq_len=1024), junk(r)]),
          "frameworks": r.choice([None, ["fsdp"], junk(r)])}
    return f"rank({kw!r:.100})", lambda: perfpredict.rank(**kw)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    r = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    runner = CliRunner()
    tally: Counter = Counter()
    broken: list[str] = []
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # a junk output name (--json True) lands in the scratch folder, not the checkout
        for _ in track(range(n), description="fuzzing"):
            if r.random() < 0.8:
                what, args = cli_case(r, Path(tmp))
                res = runner.invoke(app, args)
                err = res.stderr.strip().splitlines()
                one_line = bool(err) and err[-1].startswith("error: ") and all(
                    x.startswith(("line ", "index ")) for x in err[:-1])
                if res.exit_code == 0 and res.exception is None:
                    tally["ok"] += 1
                elif res.exit_code == 2 and one_line and (res.exception is None or isinstance(res.exception,
                                                                                              SystemExit)):
                    tally["refused"] += 1
                else:
                    tally["BROKEN"] += 1
                    broken.append(f"{what}\n  exit {res.exit_code}: {res.exception!r}\n  {res.output[-400:]}")
            else:
                what, call = library_case(r)
                try:
                    call()
                    tally["ok"] += 1
                except PerfPredictError as e:
                    if "\n" in str(e):
                        tally["BROKEN"] += 1
                        broken.append(f"{what}\n  multi-line error: {e}")
                    else:
                        tally["refused"] += 1
                except TypeError as e:
                    if "positional" in str(e) or "keyword" in str(e):
                        tally["refused"] += 1
                    else:
                        tally["BROKEN"] += 1
                        broken.append(f"{what}\n  {e!r}")
                except Exception as e:  # noqa: BLE001 - counting what escapes is the point
                    tally["BROKEN"] += 1
                    broken.append(f"{what}\n  {e!r}")
    os.chdir(home)
    con = Console()
    con.print(f"{n} inputs: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    for b in broken[:30]:
        con.print(b, markup=False, highlight=False)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
