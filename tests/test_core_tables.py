"""The runtime and objective tables in core are the one place framework behaviour and objectives are decided."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.frameworks import (
    CAPABILITIES,
    FAMILY,
    RANKABLE,
    RUNTIME,
    RUNTIMES,
    TRL_FRAMEWORKS,
    Runtime,
    runtime_of,
)
from perfpredict.core.objectives import OBJECTIVE_TABLE, OBJECTIVES, objective
from perfpredict.core.workload import Workload

PKG = Path(__file__).resolve().parents[1] / "perfpredict"


def test_every_ranked_framework_has_a_runtime_row():
    for fw in RANKABLE:
        assert runtime_of(fw).name == RUNTIME[fw]
    assert set(TRL_FRAMEWORKS) == {n for n, c in CAPABILITIES.items() if FAMILY[n] == "trl"}


def test_runtime_rows_check_their_stages():
    with pytest.raises(PerfPredictError, match="ZeRO stage"):
        Runtime("x", reference_sharded_from_zero=4)


def test_behaviour_modules_test_no_framework_names():
    """features/, models/ and emit decide framework behaviour through core.frameworks' tables, not names."""
    names = "|".join(sorted(RUNTIMES))
    pattern = re.compile(rf'(==|!=)\s*"({names})"|d_runtime"\)\s*==\s*"|is_in\(\[\s*"({names})"')
    files = [*(PKG / "features").rglob("*.py"), *(PKG / "models").rglob("*.py"),
             *(PKG / "predictor" / "emit").rglob("*.py")]
    assert len(files) > 20  # the folders exist: a renamed package must not leave this test checking nothing
    bad = [f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
           if pattern.search(line)]
    assert not bad, bad


def test_objective_table_drives_the_workload():
    for name in OBJECTIVES:
        o = objective(name)
        w = Workload(objective=name)
        assert w.spec is o and w.is_preference == o.is_preference and w.needs_reference == o.needs_reference
        assert w.seqs_per_sample == (2 if o.is_preference else 1)
        assert w.reference == o.default_reference
    assert OBJECTIVE_TABLE["kto"].needs_reference and not OBJECTIVE_TABLE["kto"].is_preference
    with pytest.raises(PerfPredictError, match="unknown objective"):
        objective("ppo")
