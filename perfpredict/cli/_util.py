"""What every command shares: the one `app`, the consoles, the error handling, and each option declared once.

On spaCy's pattern (spacy/cli/_util.py): command modules import `app` (or a sub-app) from here and register
themselves; an option that several commands take is one `Annotated` alias below, so its name, default and help
text cannot drift between commands. Every PerfPredictError becomes one line on stderr and exit code 2, never a
traceback."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from perfpredict.core.console import stderr_console, stdout_console
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.objectives import OBJECTIVES

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_exc

# typer >= 0.29 vendors click without `Abort` (Ctrl-C arrives as KeyboardInterrupt, handled in main); an
# `except` naming a missing attribute turned every other error into an AttributeError traceback.
_ABORT = getattr(click_exc, "Abort", ())
# --help is click's plain layout, not typer's rich panels: on an 80-column terminal the panels cut long option
# names ("--gpu-memory-utiliz…"), the plain layout wraps the help text and keeps every name whole.
CONTEXT = {"max_content_width": 120}

console = stdout_console()
err = stderr_console(piped_width=None)


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


def _typer(help: str) -> typer.Typer:
    return typer.Typer(add_completion=False, no_args_is_help=True, cls=OneLineErrors, help=help,
                       context_settings=CONTEXT, rich_markup_mode=None)


app = _typer("Predict per-GPU memory and throughput of distributed LLM training plans and vLLM generation "
             "layouts, and rank them.")
generate_app = _typer("vLLM generation: rank TP / PP / replica layouts, measure the engine, evaluate the model.")
collect_app = _typer("Measure kernels, collectives and training steps on this machine (needs torch).")
app.add_typer(generate_app, name="generate")
app.add_typer(collect_app, name="collect")


def friendly(fn):
    """Domain errors (and the usual bad-input errors) end as one line and exit code 2."""

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


def command(name: str, *, on: typer.Typer = app):
    """Register a command on `on` (the top-level app by default), wrapped by `friendly`."""

    def deco(fn):
        on.command(name)(friendly(fn))
        return fn

    return deco


def check_outputs(*, json_out: str | None = None, csv_out: str | None = None, plot: Path | None = None,
                  not_same_as: Path | None = None) -> None:
    """Every file a command will write is checked before its work starts; `-` is stdout, once."""
    from perfpredict.core.paths import writable_file

    if json_out == "-" and csv_out == "-":
        raise PerfPredictError("--json - and --csv - both write to stdout: give one of them a file name")
    for opt, path in (("--json", json_out), ("--csv", csv_out), ("--plot", plot)):
        if path is not None and str(path) != "-":
            writable_file(opt, path, not_same_as=not_same_as)
    if plot is not None and str(plot) == "-":
        raise PerfPredictError("--plot needs a file name (a PNG); stdout is not accepted")


def write_text(dest: str | Path, text: str) -> None:
    """`-` is stdout (newline-terminated), anything else a file."""
    if str(dest) == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        Path(dest).write_text(text)


def machine_readable(*dests: str | Path | None) -> bool:
    """A command writing JSON or CSV to stdout prints nothing else there."""
    return any(d is not None and str(d) == "-" for d in dests)


JSON_HELP = "write JSON to FILE, or to stdout with -"

# --- options shared by several commands (declared once) ---------------------------------------------------------
ModelOpt = Annotated[str, typer.Option(help="catalog name (`perfpredict catalog models`), Hugging Face id, or "
                                            "config.json path")]
GpuOpt = Annotated[str, typer.Option(help="GPU catalog name (`perfpredict catalog gpus`)")]
GpusPerNodeOpt = Annotated[int, typer.Option(help="GPUs per node")]
IntraBwOpt = Annotated[float, typer.Option(help="GB/s per GPU inside a node (default: the GPU's)")]
InterBwOpt = Annotated[float, typer.Option(help="GB/s per GPU between nodes (default: the GPU's)")]
ObjectiveOpt = Annotated[str, typer.Option(help=" | ".join(OBJECTIVES))]
SeqLenOpt = Annotated[int, typer.Option(help="tokens per sequence (prompt + response)")]
GlobalBatchOpt = Annotated[int, typer.Option(help="pairs (preference objectives) or sequences per optimizer step")]
PrecisionOpt = Annotated[str, typer.Option(help="bf16 | fp16 | fp32")]
FrameworkOpt = Annotated[list[str] | None, typer.Option(help="only these frameworks (repeatable; "
                                                              "`perfpredict frameworks`)")]
TopOpt = Annotated[int, typer.Option(help="rows to show (and to write with --json)")]
ExplainOpt = Annotated[bool, typer.Option(help="why #1 beats #2, term by term")]
JsonOpt = Annotated[str | None, typer.Option("--json", help=JSON_HELP)]
CsvOpt = Annotated[str | None, typer.Option("--csv", help="write the whole ranking as CSV (FILE or -)")]
PredictorOpt = Annotated[Path | None, typer.Option(help="a trained predictor folder (default: the shipped one)")]
EmitDirOpt = Annotated[Path, typer.Option(help="where --emit writes")]
DataOpt = Annotated[Path, typer.Option(help="datasets folder (probes*.parquet and runs*.parquet under it)")]
SeedOpt = Annotated[int, typer.Option(help="random seed (same data and seed give the same result)")]
PromptsOpt = Annotated[int, typer.Option(help="prompts to generate for (each iteration, in `iteration`)")]
SamplesOpt = Annotated[int, typer.Option(help="responses per prompt (vLLM's n)")]
InputLenOpt = Annotated[int, typer.Option(help="prompt tokens")]
OutputLenOpt = Annotated[int, typer.Option(help="tokens generated per response")]
