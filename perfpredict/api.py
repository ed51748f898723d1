"""Keyword-only library functions behind the CLI."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import Cluster
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario, load_scenarios
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans


def make_cluster(*, gpu: str, gpus: int, gpus_per_node: int = 8, intra_node_bw: float = 0.0,
                 inter_node_bw: float = 0.0) -> Cluster:
    if not isinstance(gpus, int) or gpus <= 0:
        raise PerfPredictError(f"gpus must be a positive integer, got {gpus!r}")
    if gpus_per_node <= 0:
        raise PerfPredictError(f"gpus-per-node must be a positive integer, got {gpus_per_node!r}")
    gpn = min(gpus_per_node, gpus)
    if gpus % gpn:
        raise PerfPredictError(f"gpus ({gpus}) must be a multiple of gpus-per-node ({gpn})")
    return Cluster(gpu=get_gpu(gpu), gpus_per_node=gpn, nodes=gpus // gpn,
                   intra_node_bw_gb_per_s=intra_node_bw, inter_node_bw_gb_per_s=inter_node_bw)


def legal_plans(*, model: str, gpu: str, gpus: int, gpus_per_node: int = 8, global_batch: int = 64,
                seq_len: int = 2048, objective: str = "dpo", space: PlanSpace | None = None
                ) -> tuple[list[Plan], Rejections]:
    m = get_model(model)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node)
    w = Workload(objective=objective, seq_len=seq_len, global_batch=global_batch)
    rej = Rejections()
    return list(enumerate_plans(m, cluster, w, space, rej)), rej


def describe_scenarios(*, path: Path | str | None = None, scenarios: list[Scenario] | None = None) -> pl.DataFrame:
    if scenarios is None:
        if path is None:
            raise PerfPredictError("give a scenario file or scenarios")
        scenarios = [Scenario.from_dict(d) for d in load_scenarios(path)]
    return describe(pl.DataFrame([s.to_flat() for s in scenarios]))
