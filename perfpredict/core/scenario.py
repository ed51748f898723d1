"""A scenario is (model, cluster, workload, plan); it round-trips to a plain dict and to one flat row.

The flat row (stable column names, prefixes m_ g_ c_ w_ p_) is what datasets store and what the
features stage reads, so a measured run and a candidate plan are described the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfpredict.core.catalog import get_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan, parse_stage_layers, stage_layers_text
from perfpredict.core.workload import Workload


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    cluster: Cluster
    workload: Workload
    plan: Plan

    def __post_init__(self) -> None:
        m, p, w = self.model, self.plan, self.workload
        if p.gpus != self.cluster.gpus:
            raise PerfPredictError(f"plan uses tp*pp*dp*cp = {p.gpus} GPUs but the cluster has {self.cluster.gpus}")
        if m.heads % p.tp or m.kv_heads % p.tp:
            raise PerfPredictError(f"tp ({p.tp}) must divide heads ({m.heads}) and kv_heads ({m.kv_heads}); "
                                   f"accepted tp: {[t for t in range(1, m.kv_heads + 1) if m.kv_heads % t == 0]}")
        if p.stage_layers:
            if sum(p.stage_layers) != m.layers:
                raise PerfPredictError(f"stage_layers {list(p.stage_layers)} sum to {sum(p.stage_layers)} but the "
                                       f"model has {m.layers} layers")
            if any(n % p.virtual_stages for n in p.stage_layers):
                raise PerfPredictError(f"every stage's layers must be divisible by virtual_stages ({p.virtual_stages}),"
                                       f" got stage_layers {list(p.stage_layers)}")
        elif m.layers % (p.pp * p.virtual_stages):
            hint = ("" if p.pp > m.layers else
                    "; for an uneven split give plan stage_layers (layers per stage, first to last)")
            raise PerfPredictError(f"pp x virtual_stages ({p.pp * p.virtual_stages}) must divide layers ({m.layers})"
                                   + hint)
        if p.cp > 1 and w.seq_len % (2 * p.cp):
            raise PerfPredictError(f"cp ({p.cp}) needs seq_len ({w.seq_len}) divisible by 2 x cp (load-balanced "
                                   "context parallelism splits each sequence into 2 x cp chunks)")
        if p.sequence_parallel and w.seq_len % p.tp:
            raise PerfPredictError(f"sequence parallel needs seq_len ({w.seq_len}) divisible by tp ({p.tp})")
        if p.ep > 1:
            if not m.is_moe:
                raise PerfPredictError(f"ep={p.ep} needs a mixture-of-experts model ({m.name} is dense); use ep 1")
            if m.experts % p.ep or p.dp % p.ep:
                raise PerfPredictError(f"ep ({p.ep}) must divide the experts ({m.experts}) and dp ({p.dp})")
        if p.micro_batch * p.grad_accum * p.dp != w.global_batch:
            raise PerfPredictError(f"micro_batch ({p.micro_batch}) x grad_accum ({p.grad_accum}) x dp ({p.dp}) must "
                                   f"equal global_batch ({w.global_batch})")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "hardware": self.cluster.to_dict(),
                "workload": self.workload.to_dict(), "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scenario:
        """A user's scenario: every section type-checked, dp and grad_accum filled in when they are the only
        values that fit, an uneven pipeline split filled in as the plan's framework makes it, and the plan checked
        against the framework's capabilities (core.frameworks)."""
        from perfpredict.core.frameworks import CAPABILITIES, EVEN, FIRST_LAST, stage_layers, why_not

        if not isinstance(d, dict):
            raise PerfPredictError(f"a scenario must be a JSON object with model, hardware, workload, plan; got "
                                   f"{_kind(d)}")
        extra = set(d) - {"model", "hardware", "workload", "plan"}
        if extra:
            raise PerfPredictError(f"unknown scenario key(s) {sorted(map(str, extra))}; accepted: model, hardware, "
                                   "workload, plan")
        for k in ("model", "hardware"):
            if k not in d:
                raise PerfPredictError(f"scenario is missing {k!r}")
        for k in ("workload", "plan"):
            if k in d and not isinstance(d[k], dict):
                raise PerfPredictError(f"scenario {k} must be an object, got {_kind(d[k])}")
        m = d["model"]
        model = get_model(m) if isinstance(m, str) else ModelSpec.from_dict(m)
        cluster = Cluster.from_dict(d["hardware"])
        workload = Workload.from_dict(d.get("workload", {}))
        plan_d = dict(d.get("plan", {}))
        ints = all(isinstance(plan_d.get(k, 1), int) and not isinstance(plan_d.get(k, 1), bool) and plan_d.get(k, 1) > 0
                   for k in ("tp", "pp", "cp", "dp", "micro_batch"))
        if ints and "dp" not in plan_d:
            tp, pp, cp = plan_d.get("tp", 1), plan_d.get("pp", 1), plan_d.get("cp", 1)
            if cluster.gpus % (tp * pp * cp) == 0:
                plan_d["dp"] = cluster.gpus // (tp * pp * cp)
        if ints and "grad_accum" not in plan_d:
            dp, mb = plan_d.get("dp", 1), plan_d.get("micro_batch", 1)
            if workload.global_batch % (dp * mb) == 0:
                plan_d["grad_accum"] = workload.global_batch // (dp * mb)
        plan = Plan.from_dict(plan_d)
        if plan.pp > 1 and not plan.stage_layers and model.layers % plan.pp and plan.pp <= model.layers:
            cap = CAPABILITIES[plan.framework]
            if cap.stage_split not in (EVEN, FIRST_LAST):
                # What the framework itself does with these layers (nanotron balances its pipeline blocks).
                split = stage_layers(cap, model.layers, plan.pp)
                if split:
                    plan = Plan.from_dict({**plan_d, "stage_layers": list(split)})
        scenario = cls(model=model, cluster=cluster, workload=workload, plan=plan)
        reason = why_not(plan, model, objective=workload.objective, optimizer=workload.optimizer)
        if reason:
            raise PerfPredictError(f"{plan.framework} cannot run this plan: {reason}")
        return scenario

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_flat(self) -> dict[str, Any]:
        """Every column, the newer plan columns included (what the predictor reads)."""
        return {**model_columns(self.model), **cluster_columns(self.cluster), **workload_columns(self.workload),
                **plan_columns(self.plan)}


def _kind(v: Any) -> str:
    """A short description of a wrong value for an error message (never the whole of a huge value)."""
    text = json.dumps(v) if isinstance(v, (bool, int, float, str, type(None))) else type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class ScenarioItem:
    """One entry of a scenario file: where it is (JSON Lines: its line; a JSON list: its index), and either its
    Scenario or why it is not one."""

    where: str  # "line" (JSON Lines, or the line a single object starts on) | "index" (0-based, a JSON list)
    at: int
    scenario: Scenario | None = None
    error: str | None = None

    def location(self) -> dict[str, int]:
        return {self.where: self.at}


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PerfPredictError(f"cannot read scenario file {str(path)!r}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PerfPredictError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); scenario "
                               "files are JSON") from None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


def _item(where: str, at: int, raw: Any) -> ScenarioItem:
    try:
        return ScenarioItem(where, at, scenario=Scenario.from_dict(raw))
    except PerfPredictError as e:
        return ScenarioItem(where, at, error=str(e))
    except RecursionError:
        return ScenarioItem(where, at, error="scenario nested too deeply")


def read_scenarios(path: Path | str) -> list[ScenarioItem]:
    """Every scenario of a file, in order: one JSON object, a JSON list, or JSON Lines. A bad entry (not JSON, not
    a valid scenario) is an item with its error, so callers can answer every good one; a file that cannot be read,
    is not UTF-8 or holds no scenario at all raises PerfPredictError."""
    path = Path(path)
    text = _read_text(path)
    obj = _whole_document(path, text)
    if obj is not _NOT_JSON:
        if isinstance(obj, list):
            if not obj:
                raise PerfPredictError(f"{path} holds an empty list: no scenario to read")
            return [_item("index", i, x) for i, x in enumerate(obj)]
        first = next((i for i, line in enumerate(text.splitlines(), 1) if line.strip()), 1)
        return [_item("line", first, obj)]
    items = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = _loads(line)
        except json.JSONDecodeError as e:
            items.append(ScenarioItem("line", i, error=f"not valid JSON ({e.msg}); expected one scenario object per "
                                                         "line"))
            continue
        items.append(_item("line", i, raw))
    if not items:
        raise PerfPredictError(f"{path} holds no scenario")
    return items


_NOT_JSON = object()


def _whole_document(path: Path, text: str) -> Any:
    """The file read as one JSON document, or _NOT_JSON when it is JSON Lines (one scenario per line, each answered
    on its own). A file that is neither, whose first value spans several lines (a pretty-printed object or list), is
    one broken document: read line by line, each of its lines would be reported as a bad scenario, so the error
    names the JSON problem where the whole-file parse found it."""
    try:
        return _loads(text)
    except json.JSONDecodeError as e:
        error = e
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return _NOT_JSON
    try:
        _loads(lines[first])
        return _NOT_JSON  # the first line is a value of its own: JSON Lines, a later line is bad
    except json.JSONDecodeError:
        pass
    start = len(text) - len(text.lstrip())
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
        spans_lines = "\n" in text[start:end]  # the first value parsed, across lines: something follows it
    except json.JSONDecodeError as e:
        spans_lines = e.lineno > first + 1  # the first value ran on past its line before it broke
    except RecursionError:
        spans_lines = False
    if not spans_lines:
        return _NOT_JSON
    what = "text after the end of the JSON value" if error.msg == "Extra data" else error.msg
    raise PerfPredictError(f"{path} is not valid JSON: {what} at line {error.lineno}, column {error.colno} "
                           "(a scenario file is one JSON object, a JSON list, or JSON Lines: one object per line)")


def load_scenarios(path: Path | str) -> list[dict[str, Any]]:
    """One JSON object, a JSON list, or JSON Lines: returns the raw dicts, in order (the first bad line raises)."""
    path = Path(path)
    text = _read_text(path)
    obj = _whole_document(path, text)
    if obj is not _NOT_JSON:
        if isinstance(obj, list) and not obj:
            raise PerfPredictError(f"{path} holds an empty list: no scenario to read")
        return obj if isinstance(obj, list) else [obj]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(_loads(line))
            except json.JSONDecodeError as e:
                raise PerfPredictError(f"{path}: line {i} is not valid JSON ({e.msg}); expected one scenario "
                                       "object, a list, or JSON Lines") from None
    if not out:
        raise PerfPredictError(f"{path} holds no scenario")
    return out


def model_columns(m: ModelSpec) -> dict[str, Any]:
    return {"m_name": m.name, "m_layers": m.layers, "m_hidden": m.hidden, "m_heads": m.heads,
            "m_kv_heads": m.kv_heads, "m_head_dim": m.head_dim, "m_ffn": m.ffn, "m_vocab": m.vocab,
            "m_tied": m.tied_embeddings, "m_gated": m.gated_mlp, "m_experts": m.experts,
            "m_experts_per_token": m.experts_per_token, "m_expert_ffn": m.expert_ffn,
            "m_params": float(m.param_count), "m_active_params": float(m.active_param_count),
            "m_layer_params": float(m.layer_params), "m_matmul_params": float(m.matmul_params_per_token),
            "m_logit_softcap": float(m.final_logit_softcapping)}


def cluster_columns(c: Cluster) -> dict[str, Any]:
    g = c.gpu
    return {"g_name": g.name, "g_memory_gib": float(g.memory_gib), "g_bf16_tflops": float(g.bf16_tflops),
            "g_fp32_tflops": float(g.fp32_tflops), "g_hbm_tb_per_s": float(g.hbm_tb_per_s),
            "c_gpus_per_node": c.gpus_per_node, "c_nodes": c.nodes, "c_gpus": c.gpus,
            "c_intra_bw_gb_per_s": float(c.intra_node_bw_gb_per_s),
            "c_inter_bw_gb_per_s": float(c.inter_node_bw_gb_per_s)}


def workload_columns(w: Workload) -> dict[str, Any]:
    return {"w_objective": w.objective, "w_seq_len": w.seq_len, "w_global_batch": w.global_batch,
            "w_dataset_size": w.dataset_size, "w_epochs": float(w.epochs), "w_precision": w.precision,
            "w_master_fp32": w.master_weights_fp32, "w_reference": w.reference,
            "w_seqs_per_sample": w.seqs_per_sample, "w_optimizer": w.optimizer,
            "w_seq_len_cv": float(w.seq_len_cv), "w_peak_seq_len": w.peak_seq_len}


# Plan field -> flat column, one mapping for both directions.
PLAN_COLUMNS = {"tp": "p_tp", "pp": "p_pp", "dp": "p_dp", "cp": "p_cp", "sequence_parallel": "p_sp", "zero": "p_zero",
                "recompute": "p_recompute", "micro_batch": "p_micro_batch", "grad_accum": "p_grad_accum",
                "optimizer_offload": "p_offload", "framework": "p_framework", "schedule": "p_schedule",
                "virtual_stages": "p_vstages", "ep": "p_ep", "param_offload": "p_param_offload",
                "stage_layers": "p_stage_layers", "fused_head": "p_fused_head",
                "eager_attention": "p_eager_attention", "reentrant_checkpoint": "p_reentrant_checkpoint"}
# Plan columns added after the datasets were written (expert parallelism, parameter offload, uneven stages, a fused
# head). Dataset rows (flat_row) carry them only when a plan uses them, so committed datasets keep their schema; the
# features stage fills these defaults where a frame lacks them (features.memory.plan_defaults).
PLAN_COLUMN_DEFAULTS = {"p_ep": 1, "p_param_offload": False, "p_stage_layers": "", "p_fused_head": False,
                        "p_eager_attention": False, "p_reentrant_checkpoint": False}
# The same for workload and model columns added later (Workload.optimizer, .seq_len_cv, .peak_seq_len;
# ModelSpec.final_logit_softcapping): the features stage fills them where a frame lacks them
# (features.memory.plan_defaults); dataset rows carry them only where they differ.
LATER_COLUMN_DEFAULTS = {"w_optimizer": "", "m_logit_softcap": 0.0, "w_seq_len_cv": 0.0, "w_peak_seq_len": 0}


def plan_columns(p: Plan, *, all_columns: bool = True) -> dict[str, Any]:
    out = {col: getattr(p, f) for f, col in PLAN_COLUMNS.items()}
    out["p_stage_layers"] = stage_layers_text(p.stage_layers)
    if not all_columns:
        out = {k: v for k, v in out.items() if k not in PLAN_COLUMN_DEFAULTS or v != PLAN_COLUMN_DEFAULTS[k]}
    return out


def plan_from_columns(row: dict[str, Any]) -> Plan:
    """The Plan of a flat row (a ranking row, a dataset row)."""
    kw = {f: row.get(col, PLAN_COLUMN_DEFAULTS.get(col)) for f, col in PLAN_COLUMNS.items()}
    kw["stage_layers"] = parse_stage_layers(kw["stage_layers"])
    return Plan(**kw)


def flat_row(m: ModelSpec, c: Cluster, w: Workload, p: Plan) -> dict[str, Any]:
    """A dataset row's scenario columns (the newer plan, workload and model columns only where they differ from
    their defaults, so committed datasets keep their schema)."""
    out = {**model_columns(m), **cluster_columns(c), **workload_columns(w), **plan_columns(p, all_columns=False)}
    return {k: v for k, v in out.items() if k not in LATER_COLUMN_DEFAULTS or v != LATER_COLUMN_DEFAULTS[k]}
