"""Keyword-only library functions behind the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError, check_int, check_number, check_str
from perfpredict.core.formatting import num
from perfpredict.core.hardware import MAX_GPUS_PER_NODE, MAX_NODES, Cluster, largest_prime_factor, node_shape
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario, ScenarioItem, read_scenarios
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans

if TYPE_CHECKING:
    from perfpredict.predictor.ties import Tie


def make_cluster(*, gpu: str, gpus: int, gpus_per_node: int = 8, intra_node_bw: float = 0.0,
                 inter_node_bw: float = 0.0, host_ram_gib: float = 0.0) -> Cluster:
    check_str("gpu", gpu)
    check_number("host-ram-gib (GiB per node; 0 = the GPU's node default)", host_ram_gib, 0.0, 1e7)
    check_int("gpus", gpus, 1, MAX_GPUS_PER_NODE * MAX_NODES)
    check_int("gpus-per-node", gpus_per_node, 1, MAX_GPUS_PER_NODE)
    check_number("intra-node-bw (GB/s; 0 = the GPU's)", intra_node_bw, 0.0, 1e5)
    check_number("inter-node-bw (GB/s; 0 = the GPU's)", inter_node_bw, 0.0, 1e5)
    gpn, nodes = node_shape(gpus, gpus_per_node, gpus_name="--gpus", per_node_name="--gpus-per-node")
    return Cluster(gpu=get_gpu(gpu), gpus_per_node=gpn, nodes=nodes,
                   intra_node_bw_gb_per_s=intra_node_bw, inter_node_bw_gb_per_s=inter_node_bw,
                   host_ram_gib_per_node=host_ram_gib)


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
    """Everything `perfpredict rank` prints, as text the library composes: the CLI only lays it out."""

    ranking: object
    notes: list[str] = field(default_factory=list)

    @property
    def headline(self) -> str:
        r = self.ranking
        unit = "pairs" if r.workload.is_preference else "samples"
        fit = r.fitting
        return (f"{r.model.name} on {r.cluster.gpus} x {r.cluster.gpu.name} ({r.cluster.nodes} node(s)), "
                f"{r.workload.objective}, seq {r.workload.seq_len}, global batch {r.workload.global_batch} {unit}, "
                f"reference {r.workload.reference}\n"
                f"{r.table.height:,} legal plans ({r.rejections.total:,} candidates rejected); {fit.height:,} "
                f"predicted to fit, {r.table.height - fit.height:,} dropped as out of memory")

    @property
    def misses(self) -> str:
        from perfpredict.predictor.rank import misses_line

        return misses_line(self.ranking)

    @property
    def explain(self) -> str:
        from perfpredict.predictor.rank import explain

        return explain(self.ranking)


def _bundle(predictor):
    from perfpredict.predictor.predict import load_predictor

    return load_predictor(predictor)


def rank_report(*, model: str, gpu: str, gpus: int | None, gpus_per_node: int = 8, intra_node_bw: float = 0.0,
                inter_node_bw: float = 0.0, objective: str = "dpo", dataset_size: int = 0, epochs: float = 1.0,
                seq_len: int = 2048, global_batch: int = 64, reference: str = "", precision: str = "bf16",
                frameworks: list[str] | None = None, target_samples_per_s: float = 0.0,
                predictor: Path | str | None = None, host_ram_gib: float = 0.0, optimizer: str = "",
                seq_len_cv: float = 0.0, peak_seq_len: int = 0) -> RankReport:
    """Everything `perfpredict rank` prints: the ranking plus notes (target met or not, what would fit).
    gpus=None: the fewest GPUs with a fitting plan (meeting target_samples_per_s when it is set). optimizer: the
    workload's (core.frameworks OPTIMIZERS), "" = each framework's own. seq_len_cv: padded batches' per-rank length
    spread (Workload.seq_len_cv), 0 = packed. peak_seq_len: the longest padded micro-batch (Workload.peak_seq_len),
    0 = every batch seq_len long."""
    from perfpredict.predictor.rank import fewest_gpus, host_ram_refused, rank_plans, ranking_notes, what_would_fit

    check_number("target pairs/s", target_samples_per_s, 0.0, 1e12)
    if gpus is not None:
        check_int("gpus", gpus, 1, MAX_GPUS_PER_NODE * MAX_NODES)
    m = _model(model)
    w = Workload(objective=objective, seq_len=seq_len, global_batch=global_batch, dataset_size=dataset_size,
                 epochs=epochs, precision=precision, reference=reference, optimizer=optimizer,
                 seq_len_cv=seq_len_cv, peak_seq_len=peak_seq_len)
    space = _space(frameworks)
    b = _bundle(predictor)
    notes: list[str] = []
    if gpus is None:
        base = make_cluster(gpu=gpu, gpus=gpus_per_node, gpus_per_node=gpus_per_node, intra_node_bw=intra_node_bw,
                            inter_node_bw=inter_node_bw, host_ram_gib=host_ram_gib)
        found = fewest_gpus(model=m, cluster=base, workload=w, target_samples_per_s=target_samples_per_s,
                            space=space, bundle=b)
        unit = "pairs" if w.is_preference else "samples"
        tried = f"{len(found.tried)} cluster sizes tried, {min(found.tried):,} to {max(found.tried):,} GPUs"
        if found.ranking is None:
            raise PerfPredictError(f"no plan fits on up to {max(found.tried):,} {gpu} GPUs ({tried})")
        r = found.ranking
        where = f"{r.cluster.gpus:,} ({r.cluster.nodes} node(s) of {r.cluster.gpus_per_node})"
        best = r.fitting["samples_per_s"][0]
        if found.met and target_samples_per_s > 0:
            notes.append(f"fewest GPUs meeting {target_samples_per_s:g} {unit}/s: {where}; best plan "
                         f"{num(best)} {unit}/s")
        elif found.met:
            notes.append(f"fewest GPUs with a plan that fits: {where}; best plan {num(best)} {unit}/s "
                         "(--target-pairs-per-s asks for a throughput)")
        else:
            notes.append(f"target {target_samples_per_s:g} {unit}/s NOT reached: the best found is {num(best)} "
                         f"{unit}/s on {where} GPUs ({tried}); {found.stopped}")
        return RankReport(ranking=r, notes=[*ranking_notes(r), *notes])
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, intra_node_bw=intra_node_bw,
                           inter_node_bw=inter_node_bw, host_ram_gib=host_ram_gib)
    try:
        r = rank_plans(model=m, cluster=cluster, workload=w, space=space, bundle=b)
    except PerfPredictError as e:
        count_note = gpu_count_note(model=m, cluster=cluster, workload=w, space=space, gpus_per_node=gpus_per_node)
        if count_note is None:
            raise
        raise PerfPredictError(f"{e}; {count_note}") from None
    notes += ranking_notes(r)  # offload plans refused for host RAM, #1's stall risk
    # The ranking's table holds every legal plan: the note need not enumerate them again.
    count_note = gpu_count_note(model=m, cluster=cluster, workload=w, space=space, gpus_per_node=gpus_per_node,
                                legal_plans=r.table.height)
    if count_note is not None:
        notes.append(count_note)
    if r.fitting.height == 0:
        tips = what_would_fit(model=m, cluster=cluster, workload=w, space=space, bundle=b, gpus_per_node=gpus_per_node,
                              more_host_ram=host_ram_refused(r) > 0)
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
        notes.append(f"target {target_samples_per_s:g}/s: the best plan ({num(best)}/s) {verdict} it"
                     + ("" if best >= target_samples_per_s else "; try --gpus auto"))
    return RankReport(ranking=r, notes=notes)


def gpu_count_note(*, model: ModelSpec, cluster: Cluster, workload: Workload, space: PlanSpace,
                   gpus_per_node: int, legal_plans: int | None = None) -> str | None:
    """Why a GPU count with a prime factor above 3 (5, 7, 10, 14, ...) ranks few plans: tp x pp x cp x dp must
    equal it, so every plan carries that factor in one degree, where heads, layers and the batch rarely divide by
    it. Compared with the nearest power-of-two count (plan enumeration alone is a fraction of a second), on the
    same nodes. None for a count of 2s and 3s."""
    n = cluster.gpus
    p = largest_prime_factor(n)
    if p <= 3:
        return None
    what = f"{n} GPUs is prime" if p == n else f"{n} GPUs has the prime factor {p}"
    degree = f"a degree of {p}" if p == n else f"a degree divisible by {p}"
    note = f"{what}: every plan must use {degree} in tp, pp, cp or dp"
    below = 1 << (n.bit_length() - 1)
    pow2 = below if n - below < 2 * below - n else 2 * below
    try:
        per_node, nodes = node_shape(pow2, gpus_per_node)
    except PerfPredictError:
        return note  # the power of two is no whole number of these nodes
    other = Cluster(gpu=cluster.gpu, gpus_per_node=per_node, nodes=nodes,
                    intra_node_bw_gb_per_s=cluster.intra_node_bw_gb_per_s,
                    inter_node_bw_gb_per_s=cluster.inter_node_bw_gb_per_s)
    here = legal_plans if legal_plans is not None else sum(
        1 for _ in enumerate_plans(model, cluster, workload, space, Rejections()))
    there = sum(1 for _ in enumerate_plans(model, other, workload, space, Rejections()))
    return f"{note} ({here} legal plans); {pow2} GPUs would have {there}"


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

    A `"phase": "generate"` scenario (core.generate) returns a GenerationPrediction: output_tokens_per_s,
    total_tokens_per_s, kv_capacity_tokens (per replica), time_to_generate_s, fits, with 90% intervals; both
    have `to_dict()`."""
    from perfpredict.core.generate import GenScenario, is_generate
    from perfpredict.predictor.predict import predict as _predict

    if is_generate(scenario) or isinstance(scenario, GenScenario):
        from perfpredict.predictor.generate.predict import predict_generations

        sc = scenario if isinstance(scenario, GenScenario) else GenScenario.from_dict(scenario)
        return predict_generations([sc])[0]

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


def check_emit_target(*, target: str, frameworks: list[str] | None = None) -> None:
    """Before any ranking: the target exists, and the frameworks ranked include one whose plans it can run."""
    from perfpredict.predictor.emit import TARGETS
    from perfpredict.predictor.emit.common import frameworks_for

    if target not in TARGETS:
        if target == "vllm":
            raise PerfPredictError("--emit vllm writes generation layouts: use `perfpredict generate rank --emit vllm`")
        raise PerfPredictError(f"unknown --emit target {target!r}; accepted: {', '.join(TARGETS)}")
    ranked = _space(frameworks).frameworks
    runnable = frameworks_for(target)
    if not set(ranked) & runnable:
        raise PerfPredictError(f"--emit {target} writes plans of {', '.join(sorted(runnable))}, and the frameworks "
                               f"ranked ({', '.join(ranked)}) hold none: add --framework {target}")


def catalog_rows(*, kind: str) -> list[dict[str, str]]:
    """The GPU or model catalog as the rows `perfpredict catalog` prints."""
    from perfpredict.core.catalog import gpu_catalog, model_catalog

    if kind == "gpus":
        return [{"name": g.name, "memory GiB": f"{g.memory_gib:g}", "bf16 TFLOP/s": f"{g.bf16_tflops:g}",
                 "HBM TB/s": f"{g.hbm_tb_per_s:g}", "intra GB/s": f"{g.intra_node_bw_gb_per_s:g}",
                 "inter GB/s": f"{g.inter_node_bw_gb_per_s:g}",
                 "node host RAM GiB": f"{g.node_host_ram_gib:,.0f}" if g.node_host_ram_gib else "-"}
                for g in sorted(gpu_catalog().values(), key=lambda g: g.name)]
    if kind == "models":
        return [{"name": m.name, "params (B)": f"{m.param_count / 1e9:.2f}", "layers": str(m.layers),
                 "hidden": str(m.hidden), "heads/kv": f"{m.heads}/{m.kv_heads}", "ffn": str(m.ffn),
                 "vocab": str(m.vocab), "experts": f"{m.experts_per_token}/{m.experts}" if m.experts else "-"}
                for m in sorted(model_catalog().values(), key=lambda m: m.name)]
    raise PerfPredictError(f"unknown catalog {kind!r}; accepted: gpus, models")


def scenario_file_phase(*, path: Path | str) -> str:
    """"generate" when a scenario file holds generation scenarios, "train" otherwise; a file mixing both is refused.
    An unreadable entry counts as training: predict_file_items answers it with its error."""
    from perfpredict.core.generate import is_generate
    from perfpredict.core.scenario import load_scenarios

    try:
        dicts = load_scenarios(path)
    except PerfPredictError:
        return "train"
    gen = [isinstance(d, dict) and is_generate(d) for d in dicts]
    if any(gen) and not all(gen):
        raise PerfPredictError(f"{path} mixes generation and training scenarios; put them in separate files")
    return "generate" if any(gen) else "train"


def predict_generation_file(*, path: Path | str, predictor: Path | str | None = None) -> list:
    """A GenerationPrediction for every scenario of a generation scenario file, in order."""
    from perfpredict.core.generate import GenScenario
    from perfpredict.core.scenario import load_scenarios
    from perfpredict.predictor.generate.predict import load_generation_model, predict_generations

    scs = [GenScenario.from_dict(d) for d in load_scenarios(path)]
    return predict_generations(scs, model=load_generation_model(predictor))


def _generation_setup(*, model, gpu: str, gpus: int, gpus_per_node: int, prompts: int, samples_per_prompt: int,
                      input_len: int, output_len: int, precision: str):
    from perfpredict.core.generate import GenWorkload

    check_int("prompts", prompts, 1, 1 << 40)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node)
    w = GenWorkload(prompts=prompts, samples_per_prompt=samples_per_prompt, input_len=input_len, output_len=output_len,
                    precision=precision)
    return _model(model), cluster, w


def rank_generation(*, model: str, gpu: str, gpus: int, gpus_per_node: int = 8, prompts: int,
                    samples_per_prompt: int = 1, input_len: int = 512, output_len: int = 512, precision: str = "bf16",
                    max_num_seqs: list[int] | None = None, kv_space_gib: float | None = None,
                    gpu_memory_utilization: float = 0.9, kv_cache_dtype: str = "auto",
                    predictor: Path | str | None = None, engine: str = "vllm", engine_version: str | None = None):
    """Serving-engine layouts (TP, PP, replicas, max_num_seqs) of a generation workload, best predicted throughput
    first; `engine` vllm (default), sglang or trtllm and its version are named in the answer."""
    from perfpredict.predictor.generate.predict import load_generation_model
    from perfpredict.predictor.generate.rank import rank_generate

    m, cluster, w = _generation_setup(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, prompts=prompts,
                                      samples_per_prompt=samples_per_prompt, input_len=input_len,
                                      output_len=output_len, precision=precision)
    if kv_space_gib is not None and not cluster.gpu.is_cpu:
        raise PerfPredictError("--kv-space-gib is VLLM_CPU_KVCACHE_SPACE, for CPU hosts; on GPUs the KV pool follows "
                               "--gpu-memory-utilization")
    return rank_generate(model=m, cluster=cluster, workload=w, max_num_seqs=max_num_seqs, kv_space_gib=kv_space_gib,
                         gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
                         gen_model=load_generation_model(predictor), engine=engine, engine_version=engine_version)


def rank_iteration(*, model: str, gpu: str, gpus: int, gpus_per_node: int = 8, prompts: int,
                   samples_per_prompt: int = 1, input_len: int = 512, output_len: int = 512, precision: str = "bf16",
                   global_batch: int = 64, seq_len: int | None = None, modes: tuple[str, ...] | None = None,
                   predictor: Path | str | None = None):
    """One online-DPO iteration (generate, hand the weights over, train) over every way of running it: colocated
    (time-shared, with the engine's memory hand-over), split and split-async; fastest first. Returns an
    IterationReport (table, headline, tie, explain)."""
    from perfpredict.predictor.generate import iteration as it
    from perfpredict.predictor.generate.predict import load_generation_model

    m, cluster, w = _generation_setup(model=model, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, prompts=prompts,
                                      samples_per_prompt=samples_per_prompt, input_len=input_len,
                                      output_len=output_len, precision=precision)
    if seq_len is not None:
        check_int("seq_len", seq_len, 1, 1 << 20)
    # --predictor names the training predictor; its generation model is used when the folder has one (generate/).
    has_gen = predictor is not None and (Path(predictor) / "generate" / "metadata.json").is_file()
    r = it.rank_iteration(model=m, cluster=cluster, workload=w, global_batch=global_batch, seq_len=seq_len,
                          modes=tuple(modes) if modes else it.MODES, predictor=predictor,
                          gen_model=load_generation_model(predictor if has_gen else None))
    return IterationReport(table=r.table, headline=it.headline(r), tie=r.tie, explain=it.explain(r))


@dataclass(frozen=True)
class IterationReport:
    table: pl.DataFrame  # one row per option (mode, split or memory hand-over), fastest iteration first
    headline: str
    tie: Tie | None = None  # predictor.ties.Tie: the options tied with #1 within their 90 % intervals
    explain: str = ""      # why #1 wins, term by term (`iteration --explain`)
