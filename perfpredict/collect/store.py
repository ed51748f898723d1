"""The column types of collect's tables, imposed by core.dataset.append_rows so every file has the same column
types from its first row on. The tables themselves are declared once, in core.schema."""

from __future__ import annotations

from perfpredict.core.schema import PROBE_EXTRAS, RUN_EXTRAS, probes_schema, runs_schema

__all__ = ["PROBE_EXTRAS", "RUN_EXTRAS", "probes_schema", "runs_schema"]
