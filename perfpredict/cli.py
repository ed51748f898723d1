"""The perfpredict command line: a thin typer layer over keyword-only library functions.

Every PerfPredictError becomes one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from rich.table import Table

from perfpredict.core.console import stderr_console, stdout_console
from perfpredict.core.errors import PerfPredictError

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_exc


# typer >= 0.29 vendors click without `Abort` (Ctrl-C arrives as KeyboardInterrupt, handled in main); an
# `except` naming a missing attribute turned every other error into an AttributeError traceback.
_ABORT = getattr(click_exc, "Abort", ())


class OneLineErrors(typer.core.TyperGroup):
    """Option values the parser itself refuses (`--gpus x`, a missing value) end like our own errors: one line,
    exit 2, instead of a usage box; `--help` and a bare command still print help."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click_exc.NoArgsIsHelpError as e:
            text = e.ctx.get_help() if e.ctx else ""  # typer's rich help prints itself and returns ""
            if text:
                print(text)
            sys.exit(2)
        except click_exc.ClickException as e:
            cmd = f" (`{e.ctx.command_path} --help` lists the options)" if getattr(e, "ctx", None) else ""
            err.print(f"error: {e.format_message()}{cmd}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except _ABORT:
            err.print("aborted")
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=OneLineErrors,
                  help="Predict per-GPU memory and throughput of distributed LLM training plans, and rank them.")
console = stdout_console(piped_width=160)
err = stderr_console(piped_width=None)
JSON_HELP = "write JSON to FILE, or to stdout with -"


def friendly(fn):
    """Turn domain errors (and the usual bad-input errors) into one line."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except PerfPredictError as e:
            err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as e:
            what = e.strerror or str(e) or type(e).__name__
            err.print(f"error: {what}" + (f": {e.filename}" if e.filename else ""), markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


@app.command("catalog")
@friendly
def catalog_cmd(kind: Annotated[str, typer.Argument(help="gpus or models")] = "gpus") -> None:
    """List the GPU or model catalog."""
    from perfpredict.core.catalog import gpu_catalog, model_catalog

    if kind not in ("gpus", "models"):
        raise PerfPredictError(f"unknown catalog {kind!r}; accepted: gpus, models")
    if kind == "gpus":
        t = Table("name", "memory GiB", "bf16 TFLOP/s", "HBM TB/s", "intra GB/s", "inter GB/s")
        for g in sorted(gpu_catalog().values(), key=lambda g: g.name):
            t.add_row(g.name, f"{g.memory_gib:g}", f"{g.bf16_tflops:g}", f"{g.hbm_tb_per_s:g}",
                      f"{g.intra_node_bw_gb_per_s:g}", f"{g.inter_node_bw_gb_per_s:g}")
    else:
        t = Table("name", "params (B)", "layers", "hidden", "heads/kv", "ffn", "vocab", "experts")
        for m in sorted(model_catalog().values(), key=lambda m: m.name):
            t.add_row(m.name, f"{m.param_count / 1e9:.2f}", str(m.layers), str(m.hidden), f"{m.heads}/{m.kv_heads}",
                      str(m.ffn), str(m.vocab), f"{m.experts_per_token}/{m.experts}" if m.experts else "-")
    console.print(t)


@app.command("frameworks")
@friendly
def frameworks_cmd() -> None:
    """What each training framework can run: the capability table plans, emit and collect read."""
    from perfpredict.core.frameworks import table_rows

    rows = table_rows()
    t = Table(*rows[0].keys())
    for r in rows:
        t.add_row(*("yes" if v is True else "-" if v is False else str(v) for v in r.values()))
    console.print(t)


@app.command("plans")
@friendly
def plans_cmd(
    model: Annotated[str, typer.Option(help="catalog name or config.json path")],
    gpu: Annotated[str, typer.Option(help="GPU catalog name")],
    gpus: Annotated[int, typer.Option(help="total GPUs")] = 8,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    global_batch: Annotated[int, typer.Option(help="pairs (preference objectives) or sequences per step")] = 64,
    seq_len: Annotated[int, typer.Option(help="tokens per sequence (prompt + response)")] = 2048,
    objective: Annotated[str, typer.Option(help="pretrain | sft | dpo | ipo | simpo | orpo")] = "dpo",
    sample: Annotated[int, typer.Option(help="how many plans to show")] = 10,
    framework: Annotated[list[str] | None, typer.Option(help="only these frameworks (repeatable)")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help=JSON_HELP)] = None,
) -> None:
    """Count the legal plans for a model on a cluster, show a sample and the rejection tally."""
    from perfpredict.api import legal_plans
    from perfpredict.core.errors import check_int
    from perfpredict.core.paths import writable_file

    check_int("--sample", sample, 0, 1 << 20)
    if json_out not in (None, "-"):
        writable_file("--json", json_out)
    plans, rej = legal_plans(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node,
                             global_batch=global_batch, seq_len=seq_len, objective=objective, frameworks=framework)
    if json_out:
        text = json.dumps({"plans": [p.to_dict() | {"plan": p.label()} for p in plans],
                           "rejected": dict(rej.counts.most_common())})
        sys.stdout.write(text + "\n") if json_out == "-" else Path(json_out).write_text(text)
        return
    console.print(f"[bold]{len(plans)}[/] legal plans, {rej.total} candidates rejected")
    step = max(1, len(plans) // max(sample, 1))
    t = Table("framework", "tp", "pp", "dp", "cp", "ep", "sp", "zero", "mbs", "ga", "recompute", "schedule", "offload",
              "stages")
    for p in plans[::step][:sample]:
        t.add_row(p.framework, str(p.tp), str(p.pp), str(p.dp), str(p.cp), str(p.ep),
                  "y" if p.sequence_parallel else "-", str(p.zero), str(p.micro_batch), str(p.grad_accum), p.recompute,
                  p.schedule + (f"/v{p.virtual_stages}" if p.virtual_stages > 1 else ""),
                  ("y+params" if p.param_offload else "y") if p.optimizer_offload else "-",
                  ",".join(map(str, p.stage_layers)) or "even")
    console.print(t)
    r = Table("rejected because", "count")
    for reason, n in rej.counts.most_common():
        r.add_row(reason, str(n))
    console.print(r)


@app.command("describe")
@friendly
def describe_cmd(scenario: Annotated[Path, typer.Argument(help="scenario JSON file")],
                 json_out: Annotated[str | None, typer.Option("--json", help=JSON_HELP)] = None
                 ) -> None:
    """The analytic descriptors of one scenario, as a table."""
    from perfpredict.api import describe_scenarios
    from perfpredict.core.paths import writable_file

    if json_out not in (None, "-"):
        writable_file("--json", json_out, not_same_as=scenario)
    df = describe_scenarios(path=scenario)
    if json_out:
        text = json.dumps(df.to_dicts(), default=str)
        sys.stdout.write(text + "\n") if json_out == "-" else Path(json_out).write_text(text)
        return
    for i, row in enumerate(df.to_dicts()):
        t = Table("descriptor", "value", title=f"scenario {i + 1}")
        for k, v in row.items():
            if k.startswith("d_"):
                t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
        console.print(t)


def _mount_train() -> None:
    from perfpredict.train import cli as train_cli

    app.command("train")(friendly(train_cli.train_cmd))
    app.command("evaluate")(friendly(train_cli.evaluate_cmd))
    app.command("import-public")(friendly(train_cli.import_public_cmd))


_mount_train()


def _mount_predictor() -> None:
    from perfpredict.predictor import cli as predictor_cli

    app.command("rank")(friendly(predictor_cli.rank_cmd))
    app.command("predict")(friendly(predictor_cli.predict_cmd))


_mount_predictor()


def _mount_optional() -> None:
    # Sub-apps live beside their stages; collect needs torch only when its commands run.
    try:
        from perfpredict.collect.cli import app as collect_app
    except ImportError:
        return
    # Mounted with copies of its commands wrapped like ours (bad input: one line, exit 2, no traceback); the collect
    # app itself stays as it is for its own entry point.
    sub = typer.Typer(help=collect_app.info.help, no_args_is_help=True, add_completion=False)
    for cmd in collect_app.registered_commands:
        wrapped = copy.copy(cmd)
        wrapped.callback = friendly(cmd.callback)
        sub.registered_commands.append(wrapped)
    app.add_typer(sub, name="collect", help="Measure probes and real training steps on this machine.")


_mount_optional()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
