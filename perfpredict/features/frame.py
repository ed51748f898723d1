"""Build the flat scenario frame (one row per plan) that the descriptors read."""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario, cluster_columns, model_columns, plan_columns, workload_columns


def plans_frame(model: ModelSpec, cluster: Cluster, workload, plans: Iterable[Plan] | pl.DataFrame) -> pl.DataFrame:
    """Plans (Plan objects, or their plan columns as features.plans.plan_columns_frame builds them) as columns; the
    model/cluster/workload columns are constants broadcast over them."""
    base = {**model_columns(model), **cluster_columns(cluster), **workload_columns(workload)}
    if isinstance(plans, pl.DataFrame):
        df = plans
    else:
        rows = [plan_columns(p) for p in plans]
        df = pl.DataFrame(rows) if rows else pl.DataFrame()
    if not df.height:
        return pl.DataFrame([{**base, **plan_columns(Plan())}]).clear()
    return df.with_columns([pl.lit(v).alias(k) for k, v in base.items()]).select(list(base) + df.columns)


def scenarios_frame(scenarios: Iterable[Scenario]) -> pl.DataFrame:
    return pl.DataFrame([s.to_flat() for s in scenarios])
