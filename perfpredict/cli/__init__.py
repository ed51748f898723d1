"""The perfpredict command line: one package of thin typer commands over keyword-only library functions.

Each module registers its commands on the one `app` (or its `generate` / `collect` sub-apps) from `_util`; importing
this package mounts them all. A command parses, calls one library function and prints what it returns."""

from __future__ import annotations

import gc
import sys

# A command starts by importing polars, typer, rich (then numpy) and the catalogs: several hundred thousand objects that
# live as long as the process. The cyclic collector's full passes over them found nothing to free and cost a cold
# `perfpredict rank` a tenth of its time, so it pauses while this package imports them, and main() freezes them out
# of every later pass (the documented use of gc.freeze).
_collecting = gc.isenabled()
gc.disable()

from perfpredict.cli._util import app, err  # noqa: E402

# isort: off
# Imported in the order `--help` lists their commands; importing a module registers its commands.
from perfpredict.cli import info, plans, rank, predict, generate, train, collect  # noqa: E402, F401
# isort: on

if _collecting:
    gc.enable()

__all__ = ["app", "main"]


def main() -> None:
    gc.freeze()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    finally:
        # The process ends here: the interpreter's last full collection need not walk what the command built.
        gc.freeze()
