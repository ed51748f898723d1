"""What is trained: objective, sequence length, batch, dataset, precision, reference-model handling."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, check_bool, check_choice, check_int, check_number, require
from perfpredict.core.objectives import OBJECTIVE_TABLE, OBJECTIVES, PREFERENCE, Objective, sequences_per_sample

# What each objective is (preference pairs, reference, sequences per sample) is core.objectives' table; the names
# stay importable from here.
__all__ = ["OBJECTIVES", "PREFERENCE", "Workload", "sequences_per_sample"]
REFERENCE_MODES = ("live", "precomputed", "offloaded", "none")
PRECISIONS = ("bf16", "fp16", "fp32")
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MAX_SEQ_LEN = 1 << 24  # 16M tokens: beyond any context window trained today
MAX_BATCH = 1 << 24
MAX_DATASET = 10**13


@dataclass(frozen=True)
class Workload:
    objective: str = "dpo"
    seq_len: int = 2048  # prompt + response, per sequence
    global_batch: int = 64  # pairs for preference objectives, sequences otherwise
    dataset_size: int = 0  # pairs or samples; 0 = unknown
    epochs: float = 1.0
    precision: str = "bf16"
    master_weights_fp32: bool = True
    reference: str = ""  # "" = the objective's default: live if it needs one, else none
    # The optimizer implementation, as transformers' `optim` names it (core.frameworks OPTIMIZERS: adamw_torch,
    # adamw_torch_fused, adamw_bnb_8bit, paged_adamw_8bit ...); "" = the framework's own, what predictions assumed
    # before this field.
    optimizer: str = ""
    # Padded batches: the coefficient of variation (standard deviation / mean) of the padded length a rank's
    # micro-batch gets, where each rank pads its own micro-batch to its longest sample (seq_len is then the mean
    # padded length). Synchronous data-parallel ranks wait for the slowest each micro-batch (features.compute
    # slowest_rank_factor). 0: packed or fixed-length sequences, what predictions assumed before this field.
    seq_len_cv: float = 0.0
    # The padded length of the longest micro-batch when batches are padded to their longest sample (variable-length
    # data, no packing); 0 = every micro-batch is seq_len long (packed or fixed-length data). Step time follows the
    # mean length (seq_len); the peak memory belongs to the step whose batch is longest, so memory is composed at
    # this length (features.memory.memory_seq_len).
    peak_seq_len: int = 0

    def __post_init__(self) -> None:
        check_choice("objective", self.objective, OBJECTIVES)
        check_int("seq_len", self.seq_len, 1, MAX_SEQ_LEN)
        check_int("peak_seq_len", self.peak_seq_len, 0, MAX_SEQ_LEN)
        require(self.peak_seq_len == 0 or self.peak_seq_len >= self.seq_len,
                f"peak_seq_len ({self.peak_seq_len}) is the longest micro-batch's padded length: 0 (every batch "
                f"seq_len long) or at least seq_len ({self.seq_len})")
        check_int("global_batch", self.global_batch, 1, MAX_BATCH)
        check_int("dataset_size", self.dataset_size, 0, MAX_DATASET)
        check_number("epochs", self.epochs, 0.0, 1e4, lo_open=True)
        check_choice("precision", self.precision, PRECISIONS)
        check_bool("master_weights_fp32", self.master_weights_fp32)
        check_number("seq_len_cv", self.seq_len_cv, 0.0, 2.0)
        require(isinstance(self.reference, str), f"reference must be a string, got {self.reference!r}")
        ref = self.reference or self.spec.default_reference
        check_choice("reference mode", ref, REFERENCE_MODES)
        if self.needs_reference:
            require(ref != "none", f"objective {self.objective} needs a reference model: use live, precomputed or offloaded")
        else:
            require(ref == "none", f"objective {self.objective} has no reference model; reference must be none, got {ref!r}")
        object.__setattr__(self, "reference", ref)
        from perfpredict.core.frameworks import OPTIMIZERS

        require(isinstance(self.optimizer, str) and self.optimizer in OPTIMIZERS,
                f"unknown optimizer {self.optimizer!r}; accepted: {', '.join(n for n in OPTIMIZERS if n)} "
                "(or leave it out for the framework's own)")

    @property
    def spec(self) -> Objective:
        """The objective's row of core.objectives' table."""
        return OBJECTIVE_TABLE[self.objective]

    @property
    def needs_reference(self) -> bool:
        return self.spec.needs_reference

    @property
    def is_preference(self) -> bool:
        return self.spec.is_preference

    @property
    def seqs_per_sample(self) -> int:
        return self.spec.seqs_per_sample

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seqs_per_sample * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("optimizer", "seq_len_cv", "peak_seq_len"):  # left out at their defaults, so a workload's dict
            if not d[k]:  # (and run ids hashed from it) stays
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        if not isinstance(d, dict):
            raise PerfPredictError(f"workload must be an object, got {d!r}")
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise PerfPredictError(f"unknown workload field(s) {sorted(extra)}; accepted: {sorted(names)}")
        return cls(**d)
