"""core.schema is the one declaration of the tables' columns: the readers and writers draw on it."""

from __future__ import annotations

import inspect

import pytest

from perfpredict.core import schema


def test_prefixes_name_one_concept_each():
    # m_ is the model only: the ranking's memory parts are mem_*.
    assert not any(c.startswith("m_") for c in schema.RANK_COLUMNS)
    assert set(schema.MEMORY_PARTS) <= set(schema.RANK_COLUMNS)
    assert all(col.startswith("d_") for col in schema.DESCRIPTOR_COLUMNS)
    assert all(col.startswith("b_") for col in schema.STEP_TIME_PARTS)


def test_descriptor_and_rank_modules_read_the_schema():
    from perfpredict.features.descriptors import DESCRIPTOR_COLUMNS
    from perfpredict.predictor.rank import RANK_COLUMNS

    assert DESCRIPTOR_COLUMNS is schema.DESCRIPTOR_COLUMNS
    assert RANK_COLUMNS is schema.RANK_COLUMNS


def test_collect_writes_the_schema_tables():
    """collect declares no table of its own: what it writes is core.schema's."""
    store = pytest.importorskip("perfpredict.collect.store")
    assert store.runs_schema is schema.runs_schema and store.probes_schema is schema.probes_schema
    trl = pytest.importorskip("perfpredict.collect.trl.schema")
    # The TRL row module imports core.schema where it builds a row (the device session's workers import it without
    # polars), so it must hold no column list of its own.
    assert not hasattr(trl, "TRL_COLUMNS") and "from perfpredict.core.schema import trl_schema" in inspect.getsource(
        trl.trl_row)


def test_shipped_models_use_no_ranking_column_as_a_feature():
    import json
    from pathlib import Path

    import perfpredict.predictor as pred

    text = "\n".join(p.read_text() for p in Path(pred.__file__).parent.joinpath("default").glob("*.json"))
    for col in schema.RANK_COLUMNS:
        if col.startswith(("mem_", "b_")):
            assert f'"{col}"' not in text, col
    json.loads(Path(pred.__file__).parent.joinpath("default", "metadata.json").read_text())
