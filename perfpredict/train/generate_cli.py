"""`perfpredict evaluate --phase generate`: prints what train.generate.evaluate returns and saves the shipped
generation model."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from perfpredict.core.console import stdout_console

console = stdout_console()


def run_evaluate(*, data: Path, seed: int, save: bool, json_out: Path | None) -> None:
    from perfpredict.train.generate import evaluate

    res = evaluate(data, seed=seed)
    model = res.pop("model")
    console.print(f"{res['rows']} measured vLLM rows ({res['ok_rows']} ok) -> {res['configs']} configurations "
                  f"(median of gated repeats; repeat spread median CV {100 * res['repeat_cv_median']:.1f}%)")
    kv = res["kv_capacity"]
    console.print(f"KV capacity vs the engine's log line, {kv['engines']} engines: max error "
                  f"{100 * kv['max_rel_err']:.2f}%, mean {100 * kv['mean_rel_err']:.2f}%")
    t = Table("held out", "train", "test", "MAPE", "median APE", "MAPE w/o correction", "best layout", "within 5%",
              "within noise", "regret", "cases", title="output tokens/s on held-out vLLM runs")
    for s in res["splits"]:
        t.add_row(s["split"], str(s["train_rows"]), str(s["test_rows"]), f"{100 * s['mape']:.1f}%",
                  f"{100 * s['median_ape']:.1f}%", f"{100 * s['mape_without_correction']:.1f}%",
                  f"{100 * s['best_exact']:.0f}%", f"{100 * s['best_within_5pct']:.0f}%",
                  f"{100 * s['best_within_noise']:.0f}%",
                  f"{100 * s['mean_regret']:.1f}%", str(s["cases"]))
    console.print(t)
    if "vidur_decode_layer" in res:
        from perfpredict.train.generate import vidur_root

        t = Table("gpu", "layers x tp x tokens", "median composed/measured", "mean |error|", "p90 |error|",
                  title="GPU decode layer (GEMMs, norms, activation, residual) vs Vidur's per-op profiles "
                        f"({vidur_root(data)})")
        for r in res["vidur_decode_layer"]:
            t.add_row(r["gpu"], str(r["n"]), f"{r['median']:.3f}", f"{100 * r['mape']:.1f}%", f"{100 * r['p90']:.1f}%")
        console.print(t)
    if json_out:
        json_out.write_text(json.dumps(res, indent=1, default=str))
    if save:
        console.print(f"saved the model trained on all rows to {model.save()}")
