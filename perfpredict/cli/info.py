"""`perfpredict catalog` and `perfpredict frameworks`: what the predictor knows."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from perfpredict.cli._util import command, console


@command("catalog")
def catalog_cmd(kind: Annotated[str, typer.Argument(help="gpus or models")] = "gpus") -> None:
    """List the GPU or model catalog."""
    from perfpredict.api import catalog_rows

    rows = catalog_rows(kind=kind)
    t = Table(*rows[0].keys())
    for r in rows:
        t.add_row(*map(str, r.values()))
    console.print(t)


@command("frameworks")
def frameworks_cmd() -> None:
    """What each training framework can run: the capability table plans, emit and collect read."""
    from perfpredict.core.frameworks import table_rows

    rows = table_rows()
    t = Table(*rows[0].keys())
    for r in rows:
        t.add_row(*("yes" if v is True else "-" if v is False else str(v) for v in r.values()))
    console.print(t)
