"""A generation scenario: (model, hardware, workload, layout) for producing samples with vLLM.

JSON keys: `"phase": "generate"`, `model` and `hardware` as for training (on a CPU each core bound to an
engine rank counts as one device), `workload` {prompts, samples_per_prompt = 1, input_len, output_len,
precision = bf16, shared_prefix_len = 0}, `layout` {tp, pp = 1, replicas, max_num_seqs = engine default,
gpu_memory_utilization = 0.9 (GPUs), kv_space_gib (CPUs; VLLM_CPU_KVCACHE_SPACE), kv_cache_memory_bytes,
max_model_len = input + output, prefix_caching = true (vLLM V1's default), max_num_batched_tokens = engine default,
kv_cache_dtype = auto, engine = vllm (or sglang, trtllm), engine_version, expert_parallel = false}."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perfpredict.core.catalog import get_model
from perfpredict.core.errors import PerfPredictError, require
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec

PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
# Serving engines a generation layout can name. Kernels are measured (datasets/public/aiconfigurator) under vLLM;
# SGLang and TensorRT-LLM are composed from those kernels with their measured end-to-end ratio (see
# models.generate.engine.ENGINE_SCALE), and the output says so.
ENGINES = ("vllm", "sglang", "trtllm")
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2")


def _from(cls, d: Any, what: str):
    if not isinstance(d, dict):
        raise PerfPredictError(f"{what} must be an object, got {d!r}")
    names = {f.name for f in fields(cls)}
    extra = set(d) - names
    if extra:
        raise PerfPredictError(f"unknown {what} field(s) {sorted(extra)}; accepted: {sorted(names)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise PerfPredictError(f"bad {what} fields: {e}") from None


@dataclass(frozen=True)
class GenWorkload:
    prompts: int
    input_len: int
    output_len: int
    samples_per_prompt: int = 1
    precision: str = "bf16"
    shared_prefix_len: int = 0

    def __post_init__(self) -> None:
        for f in ("prompts", "input_len", "output_len", "samples_per_prompt"):
            v = getattr(self, f)
            require(isinstance(v, int) and v > 0, f"workload {f} must be a positive integer, got {v!r}")
        require(self.precision in PRECISIONS, f"workload precision {self.precision!r} unknown; accepted: "
                f"{', '.join(PRECISIONS)}")
        require(0 <= self.shared_prefix_len <= self.input_len,
                f"shared_prefix_len must be in 0..input_len ({self.input_len}), got {self.shared_prefix_len}")

    @property
    def output_tokens(self) -> int:
        return self.prompts * self.samples_per_prompt * self.output_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> GenWorkload:
        return _from(cls, d, "workload")


@dataclass(frozen=True)
class GenLayout:
    tp: int = 1
    replicas: int = 1
    pp: int = 1
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_space_gib: float | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype: auto (the model data type), fp8, fp8_e4m3, fp8_e5m2, ...
    engine: str = "vllm"          # vllm | sglang | trtllm
    engine_version: str | None = None  # None = the version the prediction describes by default (named in the output)
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel: a MoE layer's experts split over the TP ranks

    def __post_init__(self) -> None:
        if not isinstance(self.expert_parallel, bool):
            raise PerfPredictError(f"layout expert_parallel must be true or false, got {self.expert_parallel!r}")
        if self.engine not in ENGINES:
            raise PerfPredictError(f"layout engine {self.engine!r} unknown; accepted: {', '.join(ENGINES)}")
        if self.engine_version is not None and not (isinstance(self.engine_version, str) and self.engine_version
                                                    .strip()):
            raise PerfPredictError(f"layout engine_version must be a version string, got {self.engine_version!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PerfPredictError(f"layout kv_cache_dtype {self.kv_cache_dtype!r} unknown; accepted: "
                                   f"{', '.join(KV_CACHE_DTYPES)}")
        for f in ("tp", "replicas", "pp"):
            v = getattr(self, f)
            require(isinstance(v, int) and v > 0, f"layout {f} must be a positive integer, got {v!r}")
        for f in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"):
            v = getattr(self, f)
            require(v is None or (isinstance(v, int) and v > 0), f"layout {f} must be a positive integer, got {v!r}")
        require(0 < self.gpu_memory_utilization <= 1,
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        require(self.kv_space_gib is None or self.kv_space_gib > 0, f"kv_space_gib must be > 0, got {self.kv_space_gib}")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    def label(self) -> str:
        s = f"TP{self.tp}" + ("(EP)" if self.expert_parallel else "") + (f"xPP{self.pp}" if self.pp > 1 else "") \
            + f" x{self.replicas}"
        return s + (f" mns{self.max_num_seqs}" if self.max_num_seqs else "")

    def to_dict(self) -> dict[str, Any]:
        # "auto" is vLLM's default: left out, like the None fields, so a layout's dict names only what was set.
        return {k: v for k, v in asdict(self).items() if v is not None and not (k == "kv_cache_dtype" and v == "auto")
                and not (k == "engine" and v == "vllm") and not (k == "expert_parallel" and v is False)}

    @classmethod
    def from_dict(cls, d: Any) -> GenLayout:
        return _from(cls, d, "layout")


@dataclass(frozen=True)
class GenScenario:
    model: ModelSpec
    cluster: Cluster
    workload: GenWorkload
    layout: GenLayout

    def __post_init__(self) -> None:
        m, lay = self.model, self.layout
        if lay.gpus > self.cluster.gpus:
            raise PerfPredictError(f"layout uses tp*pp*replicas = {lay.gpus} devices but the hardware has "
                                   f"{self.cluster.gpus}")
        if m.heads % lay.tp:
            raise PerfPredictError(f"tp ({lay.tp}) must divide the attention heads ({m.heads}); accepted tp: "
                                   f"{[t for t in range(1, m.heads + 1) if m.heads % t == 0]}")
        if lay.pp > m.layers:
            raise PerfPredictError(f"pp ({lay.pp}) exceeds the layers ({m.layers})")

    @property
    def max_model_len(self) -> int:
        return self.layout.max_model_len or (self.workload.input_len + self.workload.output_len)

    def to_dict(self) -> dict[str, Any]:
        return {"phase": "generate", "model": self.model.to_dict(), "hardware": self.cluster.to_dict(),
                "workload": self.workload.to_dict(), "layout": self.layout.to_dict()}

    @classmethod
    def from_dict(cls, d: Any) -> GenScenario:
        if not isinstance(d, dict):
            raise PerfPredictError("a generation scenario must be a JSON object with model, hardware, workload, layout")
        extra = set(d) - {"phase", "model", "hardware", "workload", "layout"}
        if extra:
            raise PerfPredictError(f"unknown generation scenario key(s) {sorted(extra)}; accepted: phase, model, "
                                   "hardware, workload, layout")
        for k in ("model", "hardware", "workload"):
            if k not in d:
                raise PerfPredictError(f"generation scenario is missing {k!r}")
        m = d["model"]
        model = get_model(m) if isinstance(m, str) else ModelSpec.from_dict(m)
        cluster = Cluster.from_dict(d["hardware"])
        lay = dict(d.get("layout") or {})
        if "replicas" not in lay:
            per = lay.get("tp", 1) * lay.get("pp", 1) if isinstance(lay.get("tp", 1), int) and isinstance(
                lay.get("pp", 1), int) else 1
            lay["replicas"] = max(1, cluster.gpus // max(per, 1))
        return cls(model=model, cluster=cluster, workload=GenWorkload.from_dict(d["workload"]),
                   layout=GenLayout.from_dict(lay))


def is_generate(d: Any) -> bool:
    return isinstance(d, dict) and d.get("phase") == "generate"
