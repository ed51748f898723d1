"""The perfpredict command line: one package of thin typer commands over keyword-only library functions.

Each module registers its commands on the one `app` (or its `generate` / `collect` sub-apps) from `_util`; importing
this package mounts them all. A command parses, calls one library function and prints what it returns."""

from __future__ import annotations

import sys

from perfpredict.cli._util import app, err

# isort: off
# Imported in the order `--help` lists their commands; importing a module registers its commands.
from perfpredict.cli import info, plans, rank, predict, generate, train, collect  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
