"""Accelerators and the clusters built from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, require


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet figures of one accelerator. Dense (no sparsity) peak rates."""

    name: str
    vendor: str
    memory_gib: float
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    hbm_tb_per_s: float
    intra_node_bw_gb_per_s: float  # per GPU, one direction: NVLink/xGMI/PCIe, what a ring sees
    inter_node_bw_gb_per_s: float  # per GPU, one direction: a typical NIC per GPU for that class of machine
    fp8_tflops: float = 0.0  # 0 = not supported
    sms: int = 0
    l2_mib: float = 0.0
    pcie_gb_per_s: float = 0.0
    sources: tuple[str, ...] = field(default=())
    notes: str = ""

    def __post_init__(self) -> None:
        for f in ("memory_gib", "bf16_tflops", "fp32_tflops", "hbm_tb_per_s",
                  "intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s"):
            v = getattr(self, f)
            require(isinstance(v, (int, float)) and v > 0, f"gpu {self.name!r}: {f} must be positive, got {v!r}")
        object.__setattr__(self, "sources", tuple(self.sources))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = list(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPUSpec:
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise PerfPredictError(f"unknown gpu field(s) {sorted(extra)}; accepted: {sorted(names)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise PerfPredictError(f"bad gpu fields: {e}") from None


@dataclass(frozen=True)
class Cluster:
    gpu: GPUSpec
    gpus_per_node: int = 8
    nodes: int = 1
    intra_node_bw_gb_per_s: float = 0.0  # 0 = the GPU's default
    inter_node_bw_gb_per_s: float = 0.0

    def __post_init__(self) -> None:
        require(isinstance(self.gpus_per_node, int) and self.gpus_per_node > 0,
                f"gpus_per_node must be a positive integer, got {self.gpus_per_node!r}")
        require(isinstance(self.nodes, int) and self.nodes > 0, f"nodes must be a positive integer, got {self.nodes!r}")
        for f in ("intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s"):
            require(getattr(self, f) >= 0, f"{f} must be >= 0 GB/s, got {getattr(self, f)!r}")
        if not self.intra_node_bw_gb_per_s:
            object.__setattr__(self, "intra_node_bw_gb_per_s", self.gpu.intra_node_bw_gb_per_s)
        if not self.inter_node_bw_gb_per_s:
            object.__setattr__(self, "inter_node_bw_gb_per_s", self.gpu.inter_node_bw_gb_per_s)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.name, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
                "intra_node_bw_gb_per_s": self.intra_node_bw_gb_per_s,
                "inter_node_bw_gb_per_s": self.inter_node_bw_gb_per_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        from perfpredict.core.catalog import get_gpu

        if not isinstance(d, dict):
            raise PerfPredictError(f"hardware must be an object with 'gpu', got {d!r}")
        allowed = {"gpu", "gpus_per_node", "nodes", "gpus", "intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s"}
        extra = set(d) - allowed
        if extra:
            raise PerfPredictError(f"unknown hardware field(s) {sorted(extra)}; accepted: {sorted(allowed)}")
        if "gpu" not in d:
            raise PerfPredictError("hardware needs 'gpu' (a catalog name or an object of GPU figures)")
        gpu = get_gpu(d["gpu"]) if isinstance(d["gpu"], str) else GPUSpec.from_dict(d["gpu"])
        gpn = d.get("gpus_per_node", 8)
        nodes = d.get("nodes")
        if "gpus" in d:
            total = d["gpus"]
            require(isinstance(total, int) and total > 0, f"gpus must be a positive integer, got {total!r}")
            gpn = min(gpn, total)
            require(total % gpn == 0, f"gpus ({total}) must be a multiple of gpus_per_node ({gpn})")
            require(nodes is None or nodes * gpn == total, f"gpus ({total}) != nodes ({nodes}) x gpus_per_node ({gpn})")
            nodes = total // gpn
        return cls(gpu=gpu, gpus_per_node=gpn, nodes=nodes or 1,
                   intra_node_bw_gb_per_s=d.get("intra_node_bw_gb_per_s", 0.0),
                   inter_node_bw_gb_per_s=d.get("inter_node_bw_gb_per_s", 0.0))
