"""Accelerators and the clusters built from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, check_int, check_number, check_str, require

MAX_GPUS_PER_NODE = 1024
MAX_NODES = 1 << 20
# How a node's GPUs reach each other (NCCL's topology search tells the same kinds apart: NVLink through NVSwitch or
# point to point, or PCIe through the host; src/graph/topo.h LINK_NVL / LINK_PCI). "none": a CPU host.
INTRA_NODE_FABRICS = ("nvswitch", "nvlink", "xgmi", "pcie", "none")
GPU_LIMITS = {"memory_gib": 1e5, "bf16_tflops": 1e6, "fp16_tflops": 1e6, "fp32_tflops": 1e6, "hbm_tb_per_s": 1e4,
              "intra_node_bw_gb_per_s": 1e5, "inter_node_bw_gb_per_s": 1e5}


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
    # Host RAM of the node this accelerator usually comes in (DGX H100: 2 TiB), the default a cluster's offload
    # plans are checked against (Cluster.host_ram_gib_per_node overrides it); 0 on CPU hosts, whose "device" memory
    # already is host memory.
    node_host_ram_gib: float = 0.0
    # Datasheet maximum boost clock of the SMs (0 = not stated: CPU hosts, a user's GPU object). Fixed per-kernel costs
    # are counted in cycles, so they scale with it (models.kernels: GEMM launch floor, NCCL's per-step latency).
    boost_clock_mhz: float = 0.0
    # The fabric between the GPUs of one node in the configuration the entry describes (INTRA_NODE_FABRICS; "" = not
    # stated, read from the bandwidths: intra_node_link) and the NVLink generation it runs (0 = no NVLink there).
    intra_node_fabric: str = ""
    nvlink_generation: int = 0
    sources: tuple[str, ...] = field(default=())
    notes: str = ""
    # CPU hosts only: which measuring machine this entry describes (the fingerprint's cpu_model and its vector ISA
    # flags), so rows from different hosts are told apart by what measured them (core.catalog.cpu_hardware_for).
    host_cpu_model: str = ""
    host_isa: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        check_str("gpu name", self.name)
        require(isinstance(self.vendor, str), f"gpu {self.name!r}: vendor must be a string")
        for f, hi in GPU_LIMITS.items():
            check_number(f"gpu {self.name!r}: {f}", getattr(self, f), 0.0, hi, lo_open=True)
        for f in ("fp8_tflops", "l2_mib", "pcie_gb_per_s", "node_host_ram_gib"):
            check_number(f"gpu {self.name!r}: {f}", getattr(self, f), 0.0, 1e6)
        check_int(f"gpu {self.name!r}: sms", self.sms, 0, 1 << 20)
        check_number(f"gpu {self.name!r}: boost_clock_mhz (0 = not stated)", self.boost_clock_mhz, 0.0, 1e4)
        require(self.intra_node_fabric in ("", *INTRA_NODE_FABRICS),
                f"gpu {self.name!r}: intra_node_fabric must be one of {', '.join(INTRA_NODE_FABRICS)} (or empty), "
                f"got {self.intra_node_fabric!r}")
        check_int(f"gpu {self.name!r}: nvlink_generation (0 = none)", self.nvlink_generation, 0, 16)
        nvl = self.intra_node_fabric in ("nvswitch", "nvlink") and self.vendor == "nvidia"
        require(not self.intra_node_fabric or nvl == (self.nvlink_generation > 0),
                f"gpu {self.name!r}: intra_node_fabric {self.intra_node_fabric!r} "
                + ("needs an nvlink_generation" if nvl else "runs no NVLink, so nvlink_generation must be 0"))
        require(isinstance(self.sources, (list, tuple)), f"gpu {self.name!r}: sources must be a list")
        object.__setattr__(self, "sources", tuple(self.sources))
        require(isinstance(self.host_isa, (list, tuple)), f"gpu {self.name!r}: host_isa must be a list")
        object.__setattr__(self, "host_isa", tuple(sorted(self.host_isa)))

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "cpu"

    @property
    def intra_node_link(self) -> str:
        """"nvlink" (NVLink, xGMI: a GPU-to-GPU fabric) or "pcie": the entry's intra_node_fabric where stated (every
        catalog entry), else a card whose intra-node rate is no better than its own PCIe link has no fabric, so its
        collectives cross PCIe (the catalog's L40S, RTX PRO 6000, A10G). NCCL charges each hop of the two its own
        latency (models.kernels.NCCL_HOP_LATENCY_US); "none" on CPU hosts."""
        if self.is_cpu or self.intra_node_fabric == "none":
            return "none"
        if self.intra_node_fabric:
            return "pcie" if self.intra_node_fabric == "pcie" else "nvlink"
        return "pcie" if self.pcie_gb_per_s and self.intra_node_bw_gb_per_s <= self.pcie_gb_per_s else "nvlink"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = list(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPUSpec:
        if not isinstance(d, dict):
            raise PerfPredictError(f"gpu must be a catalog name or an object of GPU figures, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise PerfPredictError(f"unknown gpu field(s) {sorted(extra)}; accepted: {sorted(names)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise PerfPredictError(f"bad gpu fields: {e}") from None


def node_shape(gpus: int, gpus_per_node: int, *, gpus_name: str = "gpus",
               per_node_name: str = "gpus_per_node") -> tuple[int, int]:
    """(gpus_per_node, nodes) of a cluster of `gpus`: one node of any size up to gpus_per_node, or whole nodes of
    gpus_per_node. A count between (12 on 8-GPU nodes) would need a partial node, which no launcher here sets up,
    so it is refused naming the counts around it. The names are how the caller's user spells the two counts."""
    check_int(gpus_name, gpus, 1, MAX_GPUS_PER_NODE * MAX_NODES)
    check_int(per_node_name, gpus_per_node, 1, MAX_GPUS_PER_NODE)
    if gpus <= gpus_per_node:
        return gpus, 1
    if gpus % gpus_per_node == 0:
        return gpus_per_node, gpus // gpus_per_node
    below = gpus // gpus_per_node * gpus_per_node
    raise PerfPredictError(f"{gpus_name} {gpus} is not a whole number of {gpus_per_node}-GPU nodes: use {below} or "
                           f"{below + gpus_per_node}, or set {per_node_name}")


def largest_prime_factor(n: int) -> int:
    p, big = 2, 1
    while p * p <= n:
        while n % p == 0:
            big, n = p, n // p
        p += 1
    return max(big, n) if n > 1 else big


@dataclass(frozen=True)
class Cluster:
    gpu: GPUSpec
    gpus_per_node: int = 8
    nodes: int = 1
    intra_node_bw_gb_per_s: float = 0.0  # 0 = the GPU's default
    inter_node_bw_gb_per_s: float = 0.0
    host_ram_gib_per_node: float = 0.0  # 0 = the GPU's catalog default (GPUSpec.node_host_ram_gib)

    def __post_init__(self) -> None:
        require(isinstance(self.gpu, GPUSpec), f"gpu must be a GPUSpec, got {type(self.gpu).__name__}")
        check_int("gpus_per_node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE)
        check_int("nodes", self.nodes, 1, MAX_NODES)
        for f in ("intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s"):
            check_number(f"{f} (0 = the GPU's)", getattr(self, f), 0.0, 1e5)
        check_number("host_ram_gib_per_node (0 = the GPU's node default)", self.host_ram_gib_per_node, 0.0, 1e7)
        if not self.host_ram_gib_per_node:
            object.__setattr__(self, "host_ram_gib_per_node", float(self.gpu.node_host_ram_gib))
        if not self.intra_node_bw_gb_per_s:
            object.__setattr__(self, "intra_node_bw_gb_per_s", self.gpu.intra_node_bw_gb_per_s)
        if not self.inter_node_bw_gb_per_s:
            object.__setattr__(self, "inter_node_bw_gb_per_s", self.gpu.inter_node_bw_gb_per_s)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def to_dict(self) -> dict[str, Any]:
        d = {"gpu": self.gpu.name, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
             "intra_node_bw_gb_per_s": self.intra_node_bw_gb_per_s,
             "inter_node_bw_gb_per_s": self.inter_node_bw_gb_per_s}
        # Written only when overridden, so scenarios written before the field existed read back the same.
        if self.host_ram_gib_per_node != self.gpu.node_host_ram_gib:
            d["host_ram_gib_per_node"] = self.host_ram_gib_per_node
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        from perfpredict.core.catalog import get_gpu

        if not isinstance(d, dict):
            raise PerfPredictError(f"hardware must be an object with 'gpu', got {d!r}")
        allowed = {"gpu", "gpus_per_node", "nodes", "gpus", "intra_node_bw_gb_per_s", "inter_node_bw_gb_per_s",
                   "host_ram_gib_per_node"}
        extra = set(d) - allowed
        if extra:
            raise PerfPredictError(f"unknown hardware field(s) {sorted(extra)}; accepted: {sorted(allowed)}")
        if "gpu" not in d:
            raise PerfPredictError("hardware needs 'gpu' (a catalog name or an object of GPU figures)")
        gpu = get_gpu(d["gpu"]) if isinstance(d["gpu"], str) else GPUSpec.from_dict(d["gpu"])
        gpn = check_int("gpus_per_node", d.get("gpus_per_node", 8), 1, MAX_GPUS_PER_NODE)
        nodes = d.get("nodes")
        if "nodes" in d:  # absent: from gpus, else one node; present, it must be a count (null is not one)
            check_int("nodes", nodes, 1, MAX_NODES)
        if "gpus" in d:
            total = check_int("gpus", d["gpus"], 1, MAX_GPUS_PER_NODE * MAX_NODES)
            gpn, from_gpus = node_shape(total, gpn)
            require(nodes is None or nodes == from_gpus,
                    f"gpus ({total}) != nodes ({nodes}) x gpus_per_node ({gpn})")
            nodes = from_gpus
        return cls(gpu=gpu, gpus_per_node=gpn, nodes=1 if nodes is None else nodes,
                   intra_node_bw_gb_per_s=d.get("intra_node_bw_gb_per_s", 0.0),
                   inter_node_bw_gb_per_s=d.get("inter_node_bw_gb_per_s", 0.0),
                   host_ram_gib_per_node=d.get("host_ram_gib_per_node", 0.0))
