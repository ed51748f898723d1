"""One parallel plan: how a step is split over GPUs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, require
from perfpredict.core.frameworks import CAPABILITIES, RANKABLE

RECOMPUTE = ("none", "selective", "full")
FRAMEWORKS = RANKABLE  # what the predictor models; the capability table (core.frameworks) lists more
SCHEDULES = ("1f1b", "gpipe", "interleaved")
# Fields added after datasets were collected: left out of to_dict() at their defaults so a plan's dict (and the
# run_ids hashed from it) stays what it was.
_NEW_FIELDS = {"ep": 1, "param_offload": False, "stage_layers": (), "fused_head": False, "eager_attention": False,
               "reentrant_checkpoint": False}
MAX_DEGREE = 1 << 20  # no parallel degree, batch or accumulation count beyond this (a million GPUs)


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    zero: int = 0  # 0..3; FSDP full sharding is 3, SHARD_GRAD_OP is 2
    recompute: str = "none"
    micro_batch: int = 1  # pairs for preference objectives, sequences otherwise
    grad_accum: int = 1
    optimizer_offload: bool = False
    framework: str = "megatron"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    ep: int = 1  # expert parallelism (MoE): expert groups carved out of dp
    param_offload: bool = False  # ZeRO-3 offload_param (ZeRO-Infinity): parameters live in host memory
    # layers per pipeline stage, first to last; () = the framework's default: even, nanotron's own cost rule
    # (core.frameworks.nanotron_stage_layers)
    stage_layers: tuple[int, ...] = ()
    # The LM head and its loss run fused in chunks (Liger-Kernel's fused linear cross entropy: TRL/transformers
    # `use_liger_kernel`, ms-swift `--use_liger_kernel`): the full-vocabulary logits are never materialised.
    fused_head: bool = False
    # Attention runs as transformers' eager path (attn_implementation "eager", or a model without SDPA/flash classes
    # in the transformers that ran it): the [b, heads, s, s] scores are materialised, the softmax upcast to fp32
    # (core.frameworks EAGER_ATTENTION). False: a fused (flash / SDPA) kernel, what the ranking assumes.
    eager_attention: bool = False
    # Recompute runs as transformers' gradient_checkpointing with use_reentrant true (its default when no
    # gradient_checkpointing_kwargs are given) rather than accelerate's fsdp_activation_checkpointing: FSDP1 then
    # gathers each block once more for the recompute (core.frameworks REENTRANT_REGATHER_FRAMEWORKS). False: what
    # `--emit` writes and the ranking assumes.
    reentrant_checkpoint: bool = False

    def __post_init__(self) -> None:
        if not self._plainly_valid():
            self._check()
        sl = self.stage_layers
        object.__setattr__(self, "stage_layers", tuple(sl))
        if sl and len(set(sl)) == 1:
            object.__setattr__(self, "stage_layers", ())  # an even split, said explicitly
        # Megatron turns sequence parallelism off when tp is 1 (it has nothing to split over); so do we.
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)

    def _plainly_valid(self) -> bool:
        """_check's rules, without building its messages: plan enumeration creates thousands of plans, and
        formatting every message of every check cost more than the enumeration itself."""
        for v in (self.tp, self.pp, self.dp, self.cp, self.micro_batch, self.grad_accum, self.virtual_stages,
                  self.ep):
            if type(v) is not int or not 0 < v <= MAX_DEGREE:
                return False
        sl = self.stage_layers
        return (type(self.zero) is int and self.zero in (0, 1, 2, 3)
                and type(self.sequence_parallel) is bool and type(self.optimizer_offload) is bool
                and type(self.param_offload) is bool and type(self.fused_head) is bool
                and type(self.eager_attention) is bool and type(self.reentrant_checkpoint) is bool
                and self.recompute in RECOMPUTE and type(self.recompute) is str
                and self.schedule in SCHEDULES and type(self.schedule) is str
                and type(self.framework) is str and self.framework in FRAMEWORKS
                and type(sl) in (tuple, list) and (not sl or all(type(n) is int and 0 < n <= MAX_DEGREE for n in sl))
                and (not sl or len(sl) == self.pp)
                and (self.schedule == "interleaved" or self.virtual_stages == 1))

    def _check(self) -> None:
        """Every rule a plan's fields obey, each failing with its own one-line message."""
        for f in ("tp", "pp", "dp", "cp", "micro_batch", "grad_accum", "virtual_stages", "ep"):
            v = getattr(self, f)
            require(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DEGREE,
                    f"plan {f} must be an integer in 1..{MAX_DEGREE}, got {v!r}")
        require(isinstance(self.zero, int) and not isinstance(self.zero, bool) and self.zero in (0, 1, 2, 3),
                f"plan zero must be 0, 1, 2 or 3, got {self.zero!r}")
        for f in ("sequence_parallel", "optimizer_offload", "param_offload", "fused_head", "eager_attention",
                  "reentrant_checkpoint"):
            require(isinstance(getattr(self, f), bool), f"plan {f} must be true or false, got {getattr(self, f)!r}")
        for f, accepted in (("recompute", RECOMPUTE), ("schedule", SCHEDULES)):
            v = getattr(self, f)
            require(isinstance(v, str) and v in accepted, f"unknown {f} {v!r}; accepted: {', '.join(accepted)}")
        fw = self.framework
        require(isinstance(fw, str) and fw in CAPABILITIES,
                f"unknown framework {fw!r}; accepted: {', '.join(FRAMEWORKS)}")
        require(fw in FRAMEWORKS, f"framework {fw!r} is in the capability table but not modelled: "
                                  f"{CAPABILITIES[fw].unrankable_why}; accepted: {', '.join(FRAMEWORKS)}")
        sl = self.stage_layers
        require(isinstance(sl, (tuple, list)) and all(isinstance(n, int) and not isinstance(n, bool) and
                                                       0 < n <= MAX_DEGREE for n in sl),
                f"plan stage_layers must be a list of positive integers (layers per pipeline stage), got {sl!r}")
        require(not sl or len(sl) == self.pp,
                f"plan stage_layers lists {len(sl)} stage(s) but pp is {self.pp}")
        require(self.schedule == "interleaved" or self.virtual_stages == 1,
                "virtual_stages > 1 needs the interleaved schedule")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.sequence_parallel:
            parts.append("sp")
        parts += [f"z{self.zero}", f"mb{self.micro_batch}", f"ga{self.grad_accum}"]
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.optimizer_offload:
            parts.append("offload" + ("+params" if self.param_offload else ""))
        if self.pp > 1:
            parts.append(self.schedule + (f"v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        if self.stage_layers:
            parts.append("stages[" + ",".join(map(str, self.stage_layers)) + "]")
        if self.fused_head:
            parts.append("fused-head")
        if self.eager_attention:
            parts.append("eager-attention")
        if self.reentrant_checkpoint:
            parts.append("reentrant-checkpoint")
        return f"{self.framework}:" + " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, default in _NEW_FIELDS.items():
            if d[k] == default:
                del d[k]
        if "stage_layers" in d:
            d["stage_layers"] = list(d["stage_layers"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict):
            raise PerfPredictError(f"plan must be an object, got {d!r}")
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise PerfPredictError(f"unknown plan field(s) {sorted(extra)}; accepted: {sorted(names)}")
        return cls(**d)


def stage_layers_text(stages: tuple[int, ...]) -> str:
    """The flat-row form of stage_layers: "" for an even split, else "3,4,4,3"."""
    return ",".join(map(str, stages))


def parse_stage_layers(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()
