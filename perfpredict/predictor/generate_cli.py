"""The generation side of `perfpredict rank --phase generate|iteration` and `predict`.

Called from the existing commands (predictor/cli.py), which keep their option parsing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import polars as pl
from rich.table import Table

from perfpredict.core.console import stdout_console
from perfpredict.core.errors import PerfPredictError

console = stdout_console()
GEN_KEYS = ("output_tokens_per_s", "total_tokens_per_s", "kv_capacity_tokens", "time_to_generate_s", "fits",
            "output_tokens_per_s_interval", "time_to_generate_s_interval", "layout", "reason")


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def run_rank(*, model: str, gpu: str, gpus: int, gpus_per_node: int, phase: str, prompts: int,
             samples_per_prompt: int, input_len: int, output_len: int, precision: str, max_num_seqs: list[int] | None,
             kv_space_gib: float | None, gpu_memory_utilization: float, global_batch: int, top: int, explain_: bool,
             json_out: str | None, csv_out: str | None, plot: Path | None, emit: str | None, emit_dir: Path,
             predictor: Path | None) -> None:
    from perfpredict.api import make_cluster
    from perfpredict.core.catalog import get_model
    from perfpredict.core.generate import GenWorkload
    from perfpredict.predictor import generate_rank as gr

    if phase not in ("generate", "iteration"):
        raise PerfPredictError(f"unknown --phase {phase!r}; accepted: train, generate, iteration")
    if prompts <= 0:
        raise PerfPredictError("--phase generate/iteration needs --prompts N (> 0)")
    m = get_model(model)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node)
    w = GenWorkload(prompts=prompts, samples_per_prompt=samples_per_prompt, input_len=input_len, output_len=output_len,
                    precision=precision)
    machine = json_out == "-" or csv_out == "-"
    say = (lambda *a, **k: None) if machine else console.print
    if phase == "iteration":
        df = gr.rank_iteration(model=m, cluster=cluster, workload=w, global_batch=global_batch, predictor=predictor)
        say(f"online DPO on {cluster.gpus} x {cluster.gpu.name}: {prompts} prompts x {samples_per_prompt} samples, "
            f"{input_len} in / {output_len} out, then DPO on one pair per prompt (live reference scores it)")
        t = Table("#", "generate on", "layout", "train on", "plan", "generate", "train", "iteration", "pairs/s")
        for r in df.head(top).iter_rows(named=True):
            t.add_row(str(r["rank"]), str(r["gen_devices"]), r["gen_layout"], str(r["train_devices"]), r["train_plan"],
                      _fmt_s(r["generate_s"]), _fmt_s(r["train_s"]), _fmt_s(r["iteration_s"]), f"{r['pairs_per_s']:.3g}")
        say(t)
        _write(df, json_out, csv_out)
        return
    r = gr.rank_generate(model=m, cluster=cluster, workload=w, max_num_seqs=max_num_seqs, kv_space_gib=kv_space_gib,
                         gpu_memory_utilization=gpu_memory_utilization)
    f = r.fitting
    say(f"{m.name} generating on {cluster.gpus} x {cluster.gpu.name}: {prompts} prompts x {samples_per_prompt} "
        f"samples, {input_len} in / {output_len} out ({w.output_tokens:,} output tokens)")
    say(f"{r.table.height} layouts considered, {f.height} fit"
        + ("; rejected: " + "; ".join(f"{k} ({n})" for k, n in r.rejections.most_common(4)) if r.rejections else ""))
    if f.height:
        t = Table(title=f"top {min(top, f.height)} layouts by predicted output tokens/s")
        for h in ("#", "layout", "out tok/s [90%]", "per device", "total tok/s", "KV tokens/replica", "weights GiB/dev",
                  "finish"):
            t.add_column(h, justify="left" if h == "layout" else "right")
        for x in f.head(top).iter_rows(named=True):
            lo, hi = x["output_tokens_per_s_interval"]
            t.add_row(str(x["rank"]), x["layout"], f"{x['output_tokens_per_s']:.4g} [{lo:.3g}-{hi:.3g}]",
                      f"{x['output_tokens_per_s_per_gpu']:.4g}", f"{x['total_tokens_per_s']:.4g}",
                      f"{x['kv_capacity_tokens']:,}", f"{x['weights_gib_per_rank']:.1f}", _fmt_s(x["time_to_generate_s"]))
        say(t)
    if explain_:
        say(gr.explain(r))
    _write(r.table, json_out, csv_out)
    if plot is not None:
        say(f"plot: {plot_layouts(r, plot)}")
    if emit:
        if emit != "vllm":
            raise PerfPredictError(f"--emit {emit!r} is for training plans; the generation phase emits: vllm")
        for p in gr.emit_vllm(r, model_id=getattr(m, "hf_id", None) or m.name, out_dir=emit_dir):
            say(f"wrote {p}")


def _write(df: pl.DataFrame, json_out: str | None, csv_out: str | None) -> None:
    if json_out:
        text = json.dumps(df.to_dicts(), default=str)
        (sys.stdout.write(text + "\n") if json_out == "-" else Path(json_out).write_text(text))
    if csv_out:
        flat = df.with_columns([pl.col(c).cast(pl.List(pl.Utf8)).list.join(" ") for c, t in df.schema.items()
                                if isinstance(t, pl.List)])
        (sys.stdout.write(flat.write_csv()) if csv_out == "-" else flat.write_csv(csv_out))


def plot_layouts(r, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = r.fitting
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tp in sorted(set(f["tp"].to_list())):
        s = f.filter(pl.col("tp") == tp)
        ax.scatter(s["kv_capacity_tokens"].to_list(), s["output_tokens_per_s"].to_list(), label=f"TP{tp}", s=30)
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity per replica (tokens)")
    ax.set_ylabel("predicted output tokens/s (all replicas)")
    ax.set_title(f"{r.model.name} on {r.cluster.gpus} x {r.cluster.gpu.name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def predict_generate_dicts(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from perfpredict.core.generate import GenScenario
    from perfpredict.predictor.generate import predict_generation

    scs = [GenScenario.from_dict(d) for d in dicts]
    return predict_generation(scs).to_dicts()


def print_predictions(preds: list[dict[str, Any]], json_out: bool) -> None:
    if json_out:
        for p in preds:
            sys.stdout.write(json.dumps({k: p[k] for k in GEN_KEYS}, default=str) + "\n")
        return
    t = Table("#", "layout", "out tok/s [90%]", "total tok/s", "KV tokens/replica", "time to generate", "fits")
    for i, p in enumerate(preds, 1):
        iv = p["output_tokens_per_s_interval"]
        t.add_row(str(i), p["layout"], f"{p['output_tokens_per_s']:.4g} [{iv[0]:.3g}-{iv[1]:.3g}]" if p["fits"] else "-",
                  f"{p['total_tokens_per_s']:.4g}" if p["fits"] else "-", f"{p['kv_capacity_tokens']:,}",
                  _fmt_s(p["time_to_generate_s"]), "yes" if p["fits"] else f"NO: {p['reason']}")
    console.print(t)
