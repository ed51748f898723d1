"""Keyword-only training entry points."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perfpredict.train.fit import train_bundle


def train(*, data: Path | str, out: Path | str, seed: int = 0, evaluate_too: bool = False,
          progress: Callable[[str], None] | None = None) -> Path:
    bundle, _ = train_bundle(data=data, seed=seed, progress=progress)
    if evaluate_too:
        from perfpredict.train.evaluate import evaluate

        res = evaluate(data=data, seed=seed, progress=progress)
        bundle.metadata["evaluation"] = res["metrics"].to_dicts()
    return bundle.save(out)


def training_summary(path: Path | str) -> str:
    """What `perfpredict train` prints about the predictor it saved."""
    import json

    meta = json.loads((Path(path) / "metadata.json").read_text())
    iv = meta["intervals_log10"]
    return (f"trained on {meta['rows']} -> [bold]{path}[/]\n"
            f"launch floor per kernel {meta['launch_floor_s']}; OOM margin {meta['oom_margin']:+.3f}; 90% "
            f"intervals (log10) outside the data: time {iv['time']['outside']}, memory {iv['memory']['outside']}"
            + _trl_scales_line(meta))


def _trl_scales_line(meta: dict) -> str:
    """Where TRL's per-family efficiencies on CPU come from: the hosts' own TRL-op probes, or the fitted constants
    (and why)."""
    hosts, why = meta.get("trl_probe_hosts"), meta.get("trl_probe_fallback")
    if hosts:
        return f"\nTRL scales from TRL-op probes on {', '.join(hosts)}; other CPU hosts: the fitted constants"
    return f"\nTRL scales: the fitted constants ({why})" if why else ""
