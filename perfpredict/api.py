"""Keyword-only library functions behind the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError, check_int, check_number, check_str
from perfpredict.core.hardware import MAX_GPUS_PER_NODE, MAX_NODES, Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario, ScenarioItem, read_scenarios
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans


def make_cluster(*, gpu: str, gpus: int, gpus_per_node: int = 8, intra_node_bw: float = 0.0,
                 inter_node_bw: float = 0.0) -> Cluster:
    check_str("gpu", gpu)
    check_int("gpus", gpus, 1, MAX_GPUS_PER_NODE * MAX_NODES)
    check_int("gpus-per-node", gpus_per_node, 1, MAX_GPUS_PER_NODE)
    check_number("intra-node-bw (GB/s; 0 = the GPU's)", intra_node_bw, 0.0, 1e5)
    check_number("inter-node-bw (GB/s; 0 = the GPU's)", inter_node_bw, 0.0, 1e5)
    gpn = min(gpus_per_node, gpus)
    if gpus % gpn:
        raise PerfPredictError(f"gpus ({gpus}) must be a multiple of gpus-per-node ({gpn})")
    return Cluster(gpu=get_gpu(gpu), gpus_per_node=gpn, nodes=gpus // gpn,
                   intra_node_bw_gb_per_s=intra_node_bw, inter_node_bw_gb_per_s=inter_node_bw)


def legal_plans(*, model: str, gpu: str, gpus: int, gpus_per_node: int = 8, global_batch: int = 64,
                seq_len: int = 2048, objective: str = "dpo", space: PlanSpace | None = None,
                frameworks: list[str] | None = None) -> tuple[list[Plan], Rejections]:
    m = _model(model)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node)
    w = Workload(objective=objective, seq_len=seq_len, global_batch=global_batch)
    rej = Rejections()
    return list(enumerate_plans(m, cluster, w, space or _space(frameworks), rej)), rej


def _model(model: object) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, str):
        raise PerfPredictError(f"model must be a catalog name, a config.json path or a ModelSpec, got "
                               f"{type(model).__name__}")
    return get_model(model)


def _scenarios_or_raise(path: Path | str) -> list[Scenario]:
    """Every scenario of a file, or one error naming every bad entry."""
    items = read_scenarios(path)
    bad = [it for it in items if it.error]
    if bad:
        shown = "; ".join(f"{it.where} {it.at}: {it.error}" for it in bad[:5])
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise PerfPredictError(f"{path}: {len(bad)} of {len(items)} scenarios are invalid: {shown}{more}")
    return [it.scenario for it in items]


def describe_scenarios(*, path: Path | str | None = None, scenarios: list[Scenario] | None = None) -> pl.DataFrame:
    if scenarios is None:
        if path is None:
            raise PerfPredictError("give a scenario file or scenarios")
        scenarios = _scenarios_or_raise(path)
    if not isinstance(scenarios, list) or not all(isinstance(s, Scenario) for s in scenarios) or not scenarios:
        raise PerfPredictError("scenarios must be a non-empty list of Scenario objects")
    return describe(pl.DataFrame([s.to_flat() for s in scenarios]))


# --- ranking and prediction -------------------------------------------------------------------------------------


@dataclass
class RankReport:
    ranking: object
    notes: list[str] = field(default_factory=list)


def _bundle(predictor):
    from perfpredict.predictor.predict import load_predictor

    return load_predictor(predictor)


def rank_report(*, model: str, gpu: str, gpus: int | None, gpus_per_node: int = 8, intra_node_bw: float = 0.0,
                inter_node_bw: float = 0.0, objective: str = "dpo", dataset_size: int = 0, epochs: float = 1.0,
                seq_len: int = 2048, global_batch: int = 64, reference: str = "", precision: str = "bf16",
                frameworks: list[str] | None = None, target_samples_per_s: float = 0.0,
                predictor: Path | str | None = None) -> RankReport:
    """Everything `perfpredict rank` prints: the ranking plus notes (target met or not, what would fit)."""
    from perfpredict.predictor.rank import fewest_gpus, rank_plans, what_would_fit

    check_number("target pairs/s", target_samples_per_s, 0.0, 1e12)
    if gpus is not None:
        check_int("gpus", gpus, 1, MAX_GPUS_PER_NODE * MAX_NODES)
    m = _model(model)
    w = Workload(objective=objective, seq_len=seq_len, global_batch=global_batch, dataset_size=dataset_size,
                 epochs=epochs, precision=precision, reference=reference)
    space = _space(frameworks)
    b = _bundle(predictor)
    notes: list[str] = []
    if gpus is None:
        base = make_cluster(gpu=gpu, gpus=gpus_per_node, gpus_per_node=gpus_per_node, intra_node_bw=intra_node_bw,
                            inter_node_bw=inter_node_bw)
        r = fewest_gpus(model=m, cluster=base, workload=w, target_samples_per_s=target_samples_per_s, space=space,
                        bundle=b)
        if r is None:
            raise PerfPredictError(f"no cluster of up to 128 nodes of {gpu} reaches {target_samples_per_s:g} "
                                   "samples/s for this workload")
        notes.append(f"fewest GPUs meeting {target_samples_per_s:g}/s: {r.cluster.gpus} "
                     f"({r.cluster.nodes} node(s) of {r.cluster.gpus_per_node})")
        return RankReport(ranking=r, notes=notes)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, intra_node_bw=intra_node_bw,
                           inter_node_bw=inter_node_bw)
    r = rank_plans(model=m, cluster=cluster, workload=w, space=space, bundle=b)
    if r.fitting.height == 0:
        tips = what_would_fit(model=m, cluster=cluster, workload=w, space=space, bundle=b)
        if tips:
            notes.append("nothing fits on this cluster. What would:")
            notes += ["  " + t for t in tips]
        else:
            notes.append("nothing fits on this cluster, and no single change tried makes a plan fit (a precomputed or "
                         "offloaded reference, up to 8x the GPUs): shorten the sequence or the micro-batch, or pick "
                         "a larger GPU")
    if target_samples_per_s > 0 and r.fitting.height:
        best = r.fitting["samples_per_s"][0]
        verdict = "meets" if best >= target_samples_per_s else "does NOT meet"
        notes.append(f"target {target_samples_per_s:g}/s: the best plan ({best:.3g}/s) {verdict} it"
                     + ("" if best >= target_samples_per_s else "; try --gpus auto"))
    return RankReport(ranking=r, notes=notes)


def rank(*, model: ModelSpec | str, cluster: Cluster, workload: Workload, top: int | None = None,
         frameworks: list[str] | None = None, predictor: Path | str | None = None) -> pl.DataFrame:
    """Every legal plan that is predicted to fit, best predicted throughput first (top N if given), as a polars
    DataFrame: plan, p_* knobs, samples_per_s (pairs/s for preference objectives), tokens_per_s, step_time_s and
    its interval, time_to_finish_h, peak_memory_gib and its interval, mfu, dominant, and the breakdown
    (b_* seconds, mem_* GiB: core.schema.RANK_COLUMNS)."""
    from perfpredict.predictor.rank import rank_plans

    m = _model(model)
    if not isinstance(cluster, Cluster):
        raise PerfPredictError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    if not isinstance(workload, Workload):
        raise PerfPredictError(f"workload must be a Workload, got {type(workload).__name__}")
    if top is not None:
        check_int("top", top, 1, 1 << 30)
    r = rank_plans(model=m, cluster=cluster, workload=workload, space=_space(frameworks), bundle=_bundle(predictor))
    return r.fitting.head(top) if top else r.fitting


def _space(frameworks: object) -> PlanSpace:
    if not frameworks:
        return PlanSpace()
    if isinstance(frameworks, str) or not isinstance(frameworks, (list, tuple)) or not all(
            isinstance(f, str) for f in frameworks):
        raise PerfPredictError(f"frameworks must be a list of framework names, got {frameworks!r}")
    return PlanSpace(frameworks=tuple(frameworks))


def predict(scenario: Scenario | dict, *, predictor: Path | str | None = None):
    """One Prediction (step_time_s, tokens_per_s, samples_per_s, peak_memory_gib, fits, intervals, breakdown).

    A `"phase": "generate"` scenario (core.generate) returns a dict instead: output_tokens_per_s,
    total_tokens_per_s, kv_capacity_tokens (per replica), time_to_generate_s, fits, with 90% intervals."""
    from perfpredict.core.generate import GenScenario, is_generate
    from perfpredict.predictor.predict import predict as _predict

    if is_generate(scenario) or isinstance(scenario, GenScenario):
        from perfpredict.predictor.generate import predict_generation

        sc = scenario if isinstance(scenario, GenScenario) else GenScenario.from_dict(scenario)
        return predict_generation([sc]).to_dicts()[0]

    return _predict(scenario, bundle=_bundle(predictor))


def predict_many(scenarios: list, *, predictor: Path | str | None = None, errors: str = "raise") -> list:
    """Predictions in order. errors="raise" (default): any invalid scenario -> one PerfPredictError naming every bad
    index, nothing predicted; errors="return": a PredictionError(error, index) in each bad one's place."""
    from perfpredict.predictor.predict import predict_many as _many

    return _many(scenarios, bundle=_bundle(predictor), errors=errors)


def predict_file(*, path: Path | str, predictor: Path | str | None = None) -> list:
    """Predictions for every scenario of a file; any invalid entry raises one error naming each bad line."""
    from perfpredict.predictor.predict import predict_many as _many

    return _many(_scenarios_or_raise(path), bundle=_bundle(predictor))


def predict_file_items(*, path: Path | str, predictor: Path | str | None = None) -> list[tuple[ScenarioItem, object]]:
    """(item, Prediction or None) for every entry of a file, in order: an invalid entry carries its error and gets
    no prediction, the valid ones are predicted in one batch."""
    from perfpredict.predictor.predict import predict_many as _many

    items = read_scenarios(path)
    good = [it.scenario for it in items if it.scenario is not None]
    preds = iter(_many(good, bundle=_bundle(predictor)) if good else [])
    return [(it, next(preds) if it.scenario is not None else None) for it in items]


def emit_winner(*, ranking, target: str, out_dir: Path | str) -> tuple[int, list[Path]]:
    """Write what runs the best-ranked fitting plan that `target` can run; returns its rank and the files."""
    from perfpredict.core.scenario import plan_from_columns
    from perfpredict.predictor.emit import TARGETS, emit, write_emitted
    from perfpredict.predictor.emit.common import fit

    if target not in TARGETS:
        raise PerfPredictError(f"unknown emit target {target!r}; accepted: {', '.join(TARGETS)}")
    for row in ranking.fitting.iter_rows(named=True):
        plan = plan_from_columns(row)
        if fit(target, plan, ranking.workload, ranking.model) is None:
            files = emit(target, model=ranking.model, cluster=ranking.cluster, workload=ranking.workload, plan=plan)
            return row["rank"], write_emitted(files, out_dir)
    raise PerfPredictError(f"no fitting plan can be run by {target}; try --framework to rank its plans only")
