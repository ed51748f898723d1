"""One parallel plan: how a step is split over GPUs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, require

RECOMPUTE = ("none", "selective", "full")
FRAMEWORKS = ("megatron", "deepspeed", "fsdp", "nanotron")
SCHEDULES = ("1f1b", "gpipe", "interleaved")


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

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "cp", "micro_batch", "grad_accum", "virtual_stages"):
            v = getattr(self, f)
            require(isinstance(v, int) and not isinstance(v, bool) and v > 0,
                    f"plan {f} must be a positive integer, got {v!r}")
        require(self.zero in (0, 1, 2, 3), f"plan zero must be 0, 1, 2 or 3, got {self.zero!r}")
        require(self.recompute in RECOMPUTE, f"unknown recompute {self.recompute!r}; accepted: {', '.join(RECOMPUTE)}")
        require(self.framework in FRAMEWORKS, f"unknown framework {self.framework!r}; accepted: {', '.join(FRAMEWORKS)}")
        require(self.schedule in SCHEDULES, f"unknown schedule {self.schedule!r}; accepted: {', '.join(SCHEDULES)}")
        require(not (self.sequence_parallel and self.tp == 1), "sequence_parallel needs tp > 1")
        require(self.schedule == "interleaved" or self.virtual_stages == 1,
                "virtual_stages > 1 needs the interleaved schedule")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.sequence_parallel:
            parts.append("sp")
        parts += [f"z{self.zero}", f"mb{self.micro_batch}", f"ga{self.grad_accum}"]
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.optimizer_offload:
            parts.append("offload")
        if self.pp > 1:
            parts.append(self.schedule + (f"v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        return f"{self.framework}:" + " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict):
            raise PerfPredictError(f"plan must be an object, got {d!r}")
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise PerfPredictError(f"unknown plan field(s) {sorted(extra)}; accepted: {sorted(names)}")
        return cls(**d)
