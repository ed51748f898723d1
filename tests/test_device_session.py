"""The prepared session for a lent GPU machine (collect.device, benchmarks/device/h200_session.sh): its grid, that
it imports without polars (which cannot travel there), and that `collect import-device` turns its files into
dataset rows with the measuring machine's provenance. A `slow` test runs the whole session as a dry run on this CPU
(tiny model) and imports what it wrote (opt-in: PERFPREDICT_DEVICE_DRY_RUN=1, minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from perfpredict.collect.device.session import GPU_SHAPE, grid
from perfpredict.collect.trl.grid import TrlConfig, chunks

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_grid_covers_backends_checkpointing_and_reference_in_a_balanced_order():
    g = grid(dry_run=False, backends=["single", "fsdp", "deepspeed"])
    assert len(g) == 16 and len({c.key(warmup=2, steps=3, hardware="h") for c in g}) == 16
    assert all(c.device == "cuda" and c.precision == "bf16" and c.world == 1 and c.shape == GPU_SHAPE for c in g)
    assert {(c.launch_group, c.checkpointing, c.reference) for c in g} == {
        (b, k, r) for b in ("single", "fsdp", "deepspeed-z2-w1", "deepspeed-z3-w1") for k in (False, True)
        for r in ("live", "precomputed")}
    # plain and FSDP one launch each, first; then DeepSpeed one config per launch, both stages early
    out = chunks(g, 4)
    assert [b for b, _ in out[:2]] == ["single", "fsdp"] and [len(cs) for _, cs in out[:2]] == [4, 4]
    assert {b for b, _ in out[2:4]} == {"deepspeed-z3-w1", "deepspeed-z2-w1"}
    assert "deepspeed" not in {c.backend for c in grid(dry_run=False, backends=["single", "fsdp"])}


def test_cpu_keys_are_unchanged_by_the_device_fields():
    c = TrlConfig(trainer="dpo", loss_type="sigmoid", reference="live", backend="single", shape="t1-2k",
                  per_device_batch=1, grad_accum=1, checkpointing=False, padding_free=False, prompt_len=16,
                  completion_len=16)
    assert "device" not in c.to_dict() and "precision" not in c.to_dict() and "world_size" not in c.to_dict()
    gpu = TrlConfig(**(c.to_dict() | {"device": "cuda", "precision": "bf16"}))
    assert gpu.key(warmup=1, steps=1, hardware="h") != c.key(warmup=1, steps=1, hardware="h")


def _top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is imported (module level, outside `if TYPE_CHECKING:`)."""
    import ast

    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(n, ast.Import):
                out |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                out.add(n.module)
                out |= {f"{n.module}.{a.name}" for a in n.names}
    return out


def test_the_device_path_imports_without_polars():
    """polars cannot travel to the lent machine (its runtime wheel is 54 MiB of the 64 a call carries): nothing the
    session, its probe subprocesses or the TRL workers import at module level may import it."""
    todo = ["perfpredict.collect.device.session", "perfpredict.collect.trl.worker", "perfpredict.collect.trl.collect",
            "perfpredict.collect.probes.suite", "perfpredict.collect.fingerprint"]
    seen: dict[str, str] = {}
    while todo:
        mod = todo.pop()
        for cand in (ROOT / (mod.replace(".", "/") + ".py"), ROOT / mod.replace(".", "/") / "__init__.py"):
            if cand.exists():
                for imp in _top_level_imports(cand):
                    assert imp.split(".")[0] != "polars", f"{mod} imports polars (via {seen.get(mod, mod)})"
                    if imp.startswith("perfpredict") and imp not in seen:
                        seen[imp] = mod
                        todo.append(imp)
                break
    assert "perfpredict.collect.trl.measure" in seen  # the walk reached the worker's own modules


def _h200_session(folder: Path) -> Path:
    """A session folder as the H200 would return it (facts of an H200, one probe, one TRL row, one failed row)."""
    folder.mkdir()
    facts = {"source": "ours-gpu", "hardware": "h200-sxm-141gb", "short_hash": "h200-sxm-141gb-0123456789",
             "collected_at": "2026-12-04T10:00:00+00:00",
             "hardware_fingerprint": {"device": "NVIDIA H200", "device_count": 1, "cpu_cores": 16,
                                      "gpus": [{"name": "NVIDIA H200", "memory_gib": 139.8}]},
             "software": {"torch": "2.11.0+cu130", "cuda": "13.0", "trl": "1.16.0", "transformers": "5.17.0"}}
    (folder / "meta.json").write_text(json.dumps({"facts": facts, "command": "python -m perfpredict.collect."
                                                  "device.session --out /out", "dry_run": False}))
    (folder / "probes.jsonl").write_text(json.dumps(
        {"op": "gemm", "pass_": "fwd", "dtype": "bf16", "m": 8, "n": 4096, "k": 4096, "flops": 2.7e8,
         "time_s": 1.1e-5, "time_spread": 0.02, "repeats": 25, "outcome": "ok", "error": None, "world_size": 1,
         "suite": "quick"}) + "\n" + '{"op": "gemm", "pa')  # a line cut by the session's timeout
    g = grid(dry_run=False, backends=["single", "deepspeed"])
    rank = {"times_s": [0.21, 0.2, 0.22], "peak_bytes": 30 * 2**30, "base_bytes": 20 * 2**30,
            "reserved_bytes": 34 * 2**30, "run_peak_bytes": 31 * 2**30, "distributed_type": "NO",
            "params_measured": 1_235_814_400, "grad_bytes": 4_943_257_600, "train_loss": 0.69,
            "real_tokens_mean": 8192.0, "batch_shapes": [[8, 1032]], "construct_s": 3.0, "ref_in_memory": True}
    ok = {"outcome": "ok", "error": None, "ranks": [rank], "attempts": 1, "calib_before_s": 0.1,
          "calib_after_s": 0.1, "calib_baseline_s": 0.1, "wall_s": 20.0}
    bad = {"outcome": "oom", "error": "OutOfMemoryError: CUDA out of memory", "ranks": [], "attempts": 1}
    lines = [{"key": c.key(warmup=2, steps=3, hardware=facts["short_hash"]), "config": c.to_dict(), "result": r,
              "warmup": 2, "steps": 3} for c, r in ((g[0], ok), (g[-1], bad))]
    (folder / "trl.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_import_device_writes_rows_with_the_measuring_machines_provenance(tmp_path):
    from perfpredict.cli import app

    src = _h200_session(tmp_path / "files")
    root = tmp_path / "ours"
    r = CliRunner().invoke(app, ["collect", "import-device", str(src), "--root", str(root)])
    assert r.exit_code == 0, r.output
    assert "trl.parquet: 2 rows appended" in r.output and "probes.parquet: 1 rows appended" in r.output
    out = root / "h200-sxm-141gb-0123456789"
    trl = pl.read_parquet(out / "trl.parquet")
    ok = trl.filter(pl.col("outcome") == "ok").row(0, named=True)
    assert ok["hardware"] == "h200-sxm-141gb" and ok["source"] == "ours-gpu" and ok["dtype"] == "bf16"
    assert ok["memory_kind"] == "cuda_max_allocated" and ok["peak_memory_gib"] == pytest.approx(30.0)
    assert ok["peak_reserved_gib"] == pytest.approx(34.0) and ok["step_time_s"] == pytest.approx(0.21)
    assert ok["w_precision"] == "bf16" and not ok["oversubscribed"] and "H200" in ok["hardware_fingerprint"]
    assert ok["collected_at"] == "2026-12-04T10:00:00+00:00" and "device.session" in ok["command"]
    assert json.loads(ok["software"])["transformers"] == "5.17.0"  # the H200's, not this machine's
    assert set(trl["outcome"]) == {"ok", "oom"} and set(trl["backend"]) == {"single", "deepspeed"}
    probes = pl.read_parquet(out / "probes.parquet")
    assert probes.height == 1 and probes["hardware"][0] == "h200-sxm-141gb"
    again = CliRunner().invoke(app, ["collect", "import-device", str(src), "--root", str(root)])
    assert "0 rows appended (2 already there)" in again.output and pl.read_parquet(out / "trl.parquet").height == 2


def test_import_device_refuses_a_dry_run_and_a_foreign_folder(tmp_path):
    from perfpredict.cli import app

    src = _h200_session(tmp_path / "files")
    meta = json.loads((src / "meta.json").read_text())
    (src / "meta.json").write_text(json.dumps(meta | {"dry_run": True}))
    for args, needle in (([str(src)], "dry run"), ([str(tmp_path)], "no meta.json")):
        r = CliRunner().invoke(app, ["collect", "import-device", *args, "--root", str(tmp_path / "o")])
        assert r.exit_code != 0 and needle in r.output and "Traceback" not in r.output


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PERFPREDICT_DEVICE_DRY_RUN") != "1",
                    reason="1-2.5 min on 2 shared cores: opt in with PERFPREDICT_DEVICE_DRY_RUN=1 (before a device call)")
def test_dry_run_session_and_import(tmp_path):
    """The script itself on this CPU: decode probes and the TRL grid's plain backend, then imported."""
    pytest.importorskip("trl")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), H200_DRY_RUN="1", H200_TOTAL_S="240", H200_PROBES_S="60",
               H200_TRL_S="150", H200_SESSION_ARGS="--families decode --backends single", PYTHON=sys.executable)
    p = subprocess.run(["bash", "benchmarks/device/h200_session.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert {"env.txt", "session.log", "meta.json", "probes.jsonl", "trl.jsonl", "summary.json"} <= {
        f.name for f in out.iterdir()}
    assert len(list(out.iterdir())) <= 8  # what the device tool returns
    from perfpredict.collect.device.importer import import_device

    res = import_device(folder=out, root=tmp_path / "ours", allow_dry_run=True)
    assert res.rows_by_table["trl.parquet"] == 2 and res.outcomes == {"ok": 2}
    probes = pl.read_parquet(res.out_dir / "probes.parquet")
    assert set(probes["op"]) == {"gemm", "decode_attention"} and (probes["outcome"] == "ok").all()


def test_step_probe_on_cuda_reads_the_allocator_over_the_last_step(monkeypatch):
    """StepProbe's cuda branch (no GPU here: torch.cuda's counters faked): the last step's peak is
    max_memory_allocated after a reset at its begin, the run's peak the larger of before and during, and every
    stamp synchronizes first."""
    import torch

    from perfpredict.collect.trl.measure import StepProbe

    calls: list[str] = []
    mem = {"alloc": 10, "peak": 50, "reserved": 64}

    def reset() -> None:
        calls.append("reset")
        mem["peak"] = mem["alloc"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: mem["alloc"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: mem["peak"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: mem["reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)

    class State:
        global_step = 0

    probe, st = StepProbe(2, device="cuda"), State()
    probe.on_train_begin(None, st, None)
    probe.on_step_begin(None, st, None)  # step 0 of 2: not profiled
    st.global_step = 1
    probe.on_step_end(None, st, None)
    probe.on_step_begin(None, st, None)  # the last step: reset at its begin
    assert calls[-1] == "reset" and probe.run_peak_bytes == 50 and probe.base_bytes == 10
    mem.update(peak=40, alloc=12)
    st.global_step = 2
    probe.on_step_end(None, st, None)
    assert probe.peak_bytes == 40 and probe.end_bytes == 12 and probe.reserved_bytes == 64
    assert probe.run_peak_bytes == 50 and len(probe.ends) == 3 and calls.count("sync") >= 4
