"""One measuring session on a lent machine, polars-free (the machine has torch, transformers and accelerate; trl,
datasets and deepspeed travel as wheels, benchmarks/device/fetch_wheels.sh):

    python -m perfpredict.collect.device.session --out $OUT [--dry-run] [--probes-s 120] [--trl-s 310]

Writes, each appended line by line so a session cut short by its `timeout` still returns what it measured:
- meta.json: machine_facts() of the measuring machine (fingerprint, versions, date), the command, the budgets;
- probes.jsonl / probes-trl.jsonl: `collect probes --quick` rows (gemm, attention, memory, decode; the trl family
  apart), one subprocess per family under the probes budget (a family cut off is a `timeout` row);
- trl.jsonl: one line per TRL config of grid() (key, config, the worker's result, warmup, steps), measured by the
  `collect trl` launcher (collect.trl.collect.run_chunk: hangs and crashes become rows) under the TRL budget;
- summary.json: what ran, what was skipped and why.
--dry-run: the same on this machine's CPU with a tiny model and two steps (seconds per config), the test of it.
The files go back to the session's machine and `perfpredict collect import-device <folder>` writes the rows."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from perfpredict.collect.processes import pythonpath_first
from perfpredict.collect.trl.grid import TrlConfig

PROBE_FAMILIES = ("gemm", "attention", "memory", "decode", "trl")
PROBE_FLOOR_S = 15.0
PACKAGES = ("torch", "transformers", "accelerate", "trl", "datasets", "deepspeed", "peft", "triton")
GPU_SHAPE = "g1-llama-1b"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


BACKENDS = ("single", "fsdp", "deepspeed")


def backends(*, dry_run: bool, wanted: tuple[str, ...] = BACKENDS) -> tuple[list[str], list[str]]:
    """(backends to run, skipped with reasons): DeepSpeed only where it imports (its wheel travelled)."""
    run, skipped = [b for b in ("single", "fsdp") if b in wanted], []
    if "deepspeed" not in wanted:
        pass
    elif importlib.util.find_spec("deepspeed") is None:
        skipped.append("deepspeed: not importable here (no wheel carried)")
    else:
        run.append("deepspeed")
    if not dry_run and importlib.util.find_spec("trl") is None:
        return [], ["trl: not importable here (no wheel carried)"]
    return run, skipped


def grid(*, dry_run: bool, backends: list[str]) -> list[TrlConfig]:
    """The TRL DPO step grid on one device: backend (plain, FSDP2 through a one-rank torchrun, DeepSpeed ZeRO-2 and
    ZeRO-3) x gradient checkpointing off/on x reference live/precomputed, DPO sigmoid, batch 4 of 256+768 tokens
    on Llama-3.2-1B's dimensions in bf16 (GPU). Ordered so that a prefix covers every backend: a session cut short
    keeps a balanced part (see the order below). Dry run: the tiny CPU shape, batch 1 of 16+16 tokens, bf16 as on the GPU (the path, not the numbers)."""
    common: dict[str, Any] = dict(trainer="dpo", loss_type="sigmoid", padding_free=False, grad_accum=1, seed=0)
    if dry_run:
        common.update(shape="t1-2k", per_device_batch=1, prompt_len=16, completion_len=16, device="cpu",
                      precision="bf16")
    else:
        common.update(shape=GPU_SHAPE, per_device_batch=4, prompt_len=256, completion_len=768, device="cuda",
                      precision="bf16")
    variants: list[dict[str, Any]] = []
    for b in backends:
        if b == "deepspeed":
            variants += [dict(backend=b, zero_stage=z) for z in (3, 2)]
        elif b == "fsdp":
            variants.append(dict(backend=b, world_size=1))
        else:
            variants.append(dict(backend=b))
    plans = [(ckpt, ref) for ckpt in (False, True) for ref in ("live", "precomputed")]
    if dry_run:
        plans = plans[:1] + plans[-1:]  # seconds: off/live and on/precomputed
    # One launch per backend except DeepSpeed's (one per config, collect.trl.grid.chunks): plain and FSDP first,
    # each in one launch, then the DeepSpeed configs alternating stages, so a cut keeps both stages.
    return [TrlConfig(**common, **v, checkpointing=ckpt, reference=ref) for v in variants if v["backend"] != "deepspeed"
            for ckpt, ref in plans] + [TrlConfig(**common, **v, checkpointing=ckpt, reference=ref)
                                       for ckpt, ref in plans for v in variants if v["backend"] == "deepspeed"]


class Session:
    def __init__(self, out: Path, *, dry_run: bool, probes_s: float, trl_s: float,
                 families: tuple[str, ...] = PROBE_FAMILIES, backends: tuple[str, ...] = BACKENDS) -> None:
        self.out, self.dry_run, self.probes_s, self.trl_s = out, dry_run, probes_s, trl_s
        self.families, self.backends = families, backends
        self.t0 = time.monotonic()
        self.summary: dict[str, Any] = {"probes": {}, "trl": {"ran": [], "skipped": []}}
        out.mkdir(parents=True, exist_ok=True)

    def log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f} s] {msg}"
        print(line, flush=True)

    def save_summary(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    def meta(self, argv: list[str]) -> None:
        from perfpredict.collect import fingerprint as fpr

        facts = fpr.machine_facts()
        facts["software"] = {**facts["software"], **{k: v for k, v in versions().items() if v}}
        (self.out / "meta.json").write_text(json.dumps({
            "facts": facts, "command": " ".join(["python -m perfpredict.collect.device.session", *argv]),
            "dry_run": self.dry_run, "probes_s": self.probes_s, "trl_s": self.trl_s}, indent=1))
        self.log(f"machine {facts['hardware']} ({facts['short_hash']}); versions {versions()}")

    def probes(self) -> None:
        """One subprocess per family (a hung or slow family costs its share, not the session)."""
        deadline = time.monotonic() + self.probes_s
        env = dict(os.environ, PYTHONPATH=pythonpath_first(os.environ.get("PYTHONPATH")))
        for i, fam in enumerate(self.families):
            left = deadline - time.monotonic()
            # A family may use what is left but a floor for each one after it (process start and CUDA init are
            # ~5-10 s of each): a quick family hands its unused time on, a hung one cannot starve the others.
            share = max(left - PROBE_FLOOR_S * (len(self.families) - i - 1), min(left, PROBE_FLOOR_S))
            if left < 5:
                self.summary["probes"][fam] = "skipped: probe budget spent"
                continue
            dest = self.out / ("probes-trl.jsonl" if fam == "trl" else "probes.jsonl")
            cmd = [sys.executable, "-m", "perfpredict.collect.device.session", "--probe-family", fam,
                   "--out", str(dest)]
            t = time.monotonic()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=min(share, left))
                status = "ok" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
            except subprocess.TimeoutExpired:
                status = f"timeout after {min(share, left):.0f} s"
                _append(dest, [{"op": fam, "pass_": "probe", "outcome": "timeout", "error": status,
                                "suite": "quick", "world_size": 1}])
            self.summary["probes"][fam] = f"{status} ({time.monotonic() - t:.0f} s)"
            self.log(f"probes {fam}: {self.summary['probes'][fam]}")
            self.save_summary()

    def trl(self) -> None:
        from perfpredict.collect import timing
        from perfpredict.collect.trl.collect import run_chunk
        from perfpredict.collect.trl.grid import chunks

        run, skipped = backends(dry_run=self.dry_run, wanted=self.backends)
        self.summary["trl"]["skipped"] += skipped
        configs = grid(dry_run=self.dry_run, backends=run)
        warmup, steps = (1, 1) if self.dry_run else (2, 3)
        hw = json.loads((self.out / "meta.json").read_text())["facts"]["short_hash"]
        dest = self.out / "trl.jsonl"
        deadline = time.monotonic() + self.trl_s
        baseline = timing.calibration_baseline()

        def on_result(key: str, cfg: TrlConfig, res: dict[str, Any]) -> None:
            _append(dest, [{"key": key, "config": cfg.to_dict(), "result": res, "warmup": warmup, "steps": steps}])
            t = (res.get("ranks") or [{}])[0].get("times_s")
            self.summary["trl"]["ran"].append(f"{cfg.launch_group} ckpt={cfg.checkpointing} ref={cfg.reference}"
                                              f" -> {res['outcome']}" + (f" {t}" if t else ""))
            self.log(self.summary["trl"]["ran"][-1])
            self.save_summary()

        with tempfile.TemporaryDirectory(prefix="pp-device-trl-") as tmp:
            per_backend = max(sum(c.backend == "single" for c in configs), 1)  # one launch each (see grid)
            for i, (_g, cfgs) in enumerate(chunks(configs, per_backend)):
                left = deadline - time.monotonic()
                if left < 20:
                    self.summary["trl"]["skipped"] += [f"{c.launch_group} ckpt={c.checkpointing} ref={c.reference}:"
                                                       " TRL budget spent" for c in cfgs]
                    continue
                items = [(c.key(warmup=warmup, steps=steps, hardware=hw), c) for c in cfgs]
                run_chunk(cfgs[0].world, items, work=Path(tmp) / f"chunk{i}", warmup=warmup, steps=steps,
                          baseline=baseline, max_retries=0, timeout_s=min(left, 180.0), retry_above=1e9,
                          on_result=on_result, log=self.log)
        self.save_summary()


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "a") as fh:
        for r in rows:
            fh.write(json.dumps(r, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def probe_family(family: str, dest: Path) -> None:
    from perfpredict.collect.probes.suite import probe_rows

    _append(dest, probe_rows(quick=True, families=(family,), log=print))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m perfpredict.collect.device.session")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dry-run", action="store_true", help="this machine's CPU, a tiny model (the script's test)")
    ap.add_argument("--probes-s", type=float, default=120.0, help="seconds for the probes (all families)")
    ap.add_argument("--trl-s", type=float, default=310.0, help="seconds for the TRL grid")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: probes, trl")
    ap.add_argument("--families", default=",".join(PROBE_FAMILIES), help="probe families, comma-separated")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="TRL backends, comma-separated")
    ap.add_argument("--probe-family", help=argparse.SUPPRESS)  # one family, in a subprocess of the session
    a = ap.parse_args(argv)
    import signal

    # The script's `timeout` sends SIGTERM: exit through run_chunk's finally, which kills the worker launch's own
    # process session (started with start_new_session, so the signal does not reach it otherwise).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.probe_family:
        probe_family(a.probe_family, a.out)
        return
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    fams = tuple(f.strip() for f in a.families.split(",") if f.strip())
    bks = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    bad = [f for f in fams if f not in PROBE_FAMILIES] + [b for b in bks if b not in BACKENDS]
    if bad or skip - {"probes", "trl"}:
        ap.error(f"unknown {sorted(bad + sorted(skip - {'probes', 'trl'}))}; families {PROBE_FAMILIES}, backends "
                 f"{BACKENDS}, --skip probes,trl")
    s = Session(a.out, dry_run=a.dry_run, probes_s=a.probes_s, trl_s=a.trl_s, families=fams, backends=bks)
    s.meta(argv)
    if "probes" not in skip:
        s.probes()
    if "trl" not in skip:
        s.trl()
    s.save_summary()
    s.log("session done")


if __name__ == "__main__":
    main()
