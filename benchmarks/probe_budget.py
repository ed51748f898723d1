"""`perfpredict collect probes --quick` against its 2-minute budget, per probe family.

Run by hand: `python benchmarks/probe_budget.py`. The budget is for a fresh machine where a user checks that collect
works before a full run; the full suite's time is printed beside it for scale when `--full` is given."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from perfpredict.cli import app

BUDGET_S = 120.0


def _run(args: list[str], out: Path) -> tuple[float, pl.DataFrame]:
    from typer.testing import CliRunner

    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["collect", "probes", *args, "--out", str(out)])
    took = time.perf_counter() - t0
    if res.exit_code != 0:
        raise SystemExit(f"collect probes {' '.join(args)} failed: {res.output.strip().splitlines()[-1:]}")
    return took, pl.read_parquet(out / "probes.parquet")


def main() -> None:
    runs = [["--quick"]] + ([[]] if "--full" in sys.argv else [])
    t = Table("run", "wall s", "budget s", "rows", "ok rows", "within budget")
    fam = Table("run", "op", "rows", "probe s (sum of medians x repeats)")
    for args in runs:
        with tempfile.TemporaryDirectory() as d:
            took, df = _run(args, Path(d))
        name = " ".join(args) or "full"
        ok = df.filter(pl.col("outcome") == "ok")
        budget = BUDGET_S if args == ["--quick"] else float("nan")
        t.add_row(name, f"{took:.1f}", f"{budget:.0f}", str(df.height), str(ok.height),
                  "yes" if took <= budget else ("-" if budget != budget else "NO"))
        by = (ok.group_by("op").agg(pl.len().alias("n"), (pl.col("time_s") * pl.col("repeats")).sum().alias("s"))
              .sort("s", descending=True))
        for op, n, s in by.iter_rows():
            fam.add_row(name, op, str(n), f"{s:.2f}")
    Console().print(t)
    Console().print(fam)


if __name__ == "__main__":
    main()
