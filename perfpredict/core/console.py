"""The rich consoles every command prints through: tables to stdout, progress and errors to stderr.

Piped output (CI logs, `| less`, tests' CliRunner) gets a fixed width, wide enough that rank and evaluate tables
are not folded; a terminal keeps its own width."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_STDOUT_WIDTH = 200
PIPED_STDERR_WIDTH = 240


def stdout_console(*, piped_width: int = PIPED_STDOUT_WIDTH) -> Console:
    return Console(width=None if sys.stdout.isatty() else piped_width)


def stderr_console(*, piped_width: int | None = PIPED_STDERR_WIDTH) -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() or piped_width is None else piped_width)
