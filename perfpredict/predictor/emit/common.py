"""What every target shares: the fit rules (so emit can refuse a plan and name the targets that do fit),
the plan context and the header/comment and YAML writers."""

from __future__ import annotations

import json
import re
from typing import Any

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload

RDZV_PORT = 29500


# --------------------------------------------------------------------------------------------------------------------
# fit checks: None when the target can run the plan, else a reason (one clause, no newline)


def _hf_reason(plan: Plan, who: str) -> str | None:
    """What TRL / HF Trainer driven through accelerate cannot do, for DeepSpeed and FSDP alike."""
    if plan.tp > 1:
        return f"{who} (as TRL/accelerate drive it) has no tensor parallelism (tp={plan.tp})"
    if plan.pp > 1:
        return f"{who} (as TRL/accelerate drive it) has no pipeline parallelism (pp={plan.pp})"
    if plan.cp > 1:
        return f"{who} (as TRL/accelerate drive it here) has no context parallelism (cp={plan.cp})"
    if plan.recompute == "selective":
        return ("selective recompute is Megatron/nanotron only; HF gradient checkpointing recomputes whole layers "
                "(use recompute full)")
    return None


def _fit_deepspeed(plan: Plan, model: ModelSpec) -> str | None:
    if plan.framework != "deepspeed":
        return f"it writes DeepSpeed ZeRO configs and this is a {plan.framework} plan"
    reason = _hf_reason(plan, "DeepSpeed")
    if reason:
        return reason
    if plan.optimizer_offload and plan.zero == 0:
        return "DeepSpeed optimizer offload needs ZeRO stage 1 or more (plan has zero 0)"
    return None


def _fit_fsdp(plan: Plan, model: ModelSpec) -> str | None:
    if plan.framework != "fsdp":
        return f"it writes an accelerate FSDP config and this is a {plan.framework} plan"
    reason = _hf_reason(plan, "FSDP")
    if reason:
        return reason
    if plan.zero not in (2, 3):
        return f"FSDP shards gradients and optimizer state at least: zero must be 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD), got {plan.zero}"
    return None


def _fit_megatron(plan: Plan, model: ModelSpec) -> str | None:
    if plan.framework != "megatron":
        return f"it writes Megatron-LM arguments and this is a {plan.framework} plan"
    if plan.pp > 1 and plan.schedule == "gpipe":
        return "Megatron-LM has no GPipe schedule (use 1f1b or interleaved)"
    if model.layers % plan.pp:
        return f"pp={plan.pp} does not divide the model's {model.layers} layers"
    if plan.schedule == "interleaved" and plan.virtual_stages > 1 and model.layers % (plan.pp * plan.virtual_stages):
        return (f"interleaved schedule needs layers ({model.layers}) divisible by pp x virtual stages "
                f"({plan.pp} x {plan.virtual_stages})")
    return None


# The config-writing targets, each named after the framework whose plans it can run (with the same signature).
_FIT = {"deepspeed": _fit_deepspeed, "fsdp": _fit_fsdp, "megatron": _fit_megatron}


def _fit_torchrun(plan: Plan, workload: Workload, model: ModelSpec) -> str | None:
    if plan.framework not in _FIT:
        return f"{plan.framework} plans are not emitted (nanotron reads its own YAML config)"
    reason = _FIT[plan.framework](plan, model)
    if reason or plan.framework != "megatron" or not workload.is_preference:
        return reason
    if workload.objective not in ("dpo", "ipo"):
        return (f"NeMo-Aligner (the Megatron preference trainer launched here) has no {workload.objective} loss; "
                "its preference_loss accepts dpo, ipo and rpo variants")
    if plan.zero >= 2 or plan.optimizer_offload:
        return ("NeMo-Aligner's optimizer is distributed_fused_adam (ZeRO-1-like sharding): no ZeRO-2/3 or "
                "optimizer offload")
    return None


def fit(target: str, plan: Plan, workload: Workload, model: ModelSpec) -> str | None:
    """None when `target` can run the plan, else why not."""
    if target == "torchrun":
        return _fit_torchrun(plan, workload, model)
    if target not in _FIT:
        raise PerfPredictError(f"unknown emit target {target!r}; accepted: {', '.join([*_FIT, 'torchrun'])}")
    return _FIT[target](plan, model)


# --------------------------------------------------------------------------------------------------------------------
# shared context


class Ctx:
    def __init__(self, model: ModelSpec, cluster: Cluster, workload: Workload, plan: Plan, model_id: str | None):
        self.model, self.cluster, self.workload, self.plan = model, cluster, workload, plan
        self.model_id = model_id or _catalog_hf_id(model) or "<hf-model-id-or-path>"
        self.label = plan.label()
        unit = "pairs" if workload.is_preference else "sequences"
        self.header = [
            f"Generated by perfpredict for plan {self.label}",
            f"model {model.name}, objective {workload.objective}, seq_len {workload.seq_len}, global batch "
            f"{workload.global_batch} {unit}, {workload.precision}, cluster {cluster.nodes} x {cluster.gpus_per_node} "
            f"{cluster.gpu.name}",
        ]

    @property
    def pref(self) -> bool:
        return self.workload.is_preference


def _catalog_hf_id(model: ModelSpec) -> str | None:
    from perfpredict.core.catalog import model_catalog_raw

    raw = model_catalog_raw().get(model.name)
    return raw.get("hf_id") if raw else None


def check_common(ctx: Ctx) -> None:
    p, c, w = ctx.plan, ctx.cluster, ctx.workload
    if p.gpus != c.gpus:
        raise PerfPredictError(f"plan {ctx.label} uses {p.gpus} GPUs (tp x pp x dp x cp) but the cluster has "
                               f"{c.gpus} ({c.nodes} x {c.gpus_per_node})")
    if p.micro_batch * p.grad_accum * p.dp != w.global_batch:
        raise PerfPredictError(f"plan {ctx.label}: micro_batch x grad_accum x dp = "
                               f"{p.micro_batch * p.grad_accum * p.dp} but the workload's global batch is "
                               f"{w.global_batch}")


# --------------------------------------------------------------------------------------------------------------------
# tiny YAML writer (keeps pyyaml out of the runtime dependencies); values are scalars or nested dicts

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "~"}


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _YAML_WORDS:
        return s
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def yaml_lines(d: dict[str, Any], comments: dict[str, list[str]] | None = None, indent: int = 0,
          prefix: str = "") -> list[str]:
    comments = comments or {}
    out: list[str] = []
    pad = " " * indent
    for k, v in d.items():
        path = f"{prefix}{k}"
        out += [f"{pad}# {line}" for line in comments.get(path, [])]
        if isinstance(v, dict):
            if v:
                out.append(f"{pad}{k}:")
                out += yaml_lines(v, comments, indent + 2, path + ".")
            else:
                out.append(f"{pad}{k}: {{}}")
        else:
            out.append(f"{pad}{k}: {_yaml_scalar(v)}")
    return out


def comment_block(lines: list[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)
