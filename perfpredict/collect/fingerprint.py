"""Hardware and software fingerprints of the machine a measurement ran on.

Both are plain dicts, JSON-stringified into the `hardware_fingerprint` and `software` provenance columns, so a
row can be traced to the box and the stack that produced it. `short_hash` names the dataset folder
(datasets/ours/<hash>/): it hashes only the hardware fields that change what is measured (device, count, memory,
CPU model, cores, and on CPUs the vector ISA), not versions, so upgrading torch keeps writing into the same folder
(the software column still tells the rows apart). The ISA is in the hash because "Intel(R) Xeon(R) Processor" under
KVM names hosts with and without AVX512-BF16/AMX: generate.parquet in cpu-1c363b9f53 came from an AMX host (2.6 GHz)
while that folder's probes and runs came from an AVX-512F one (2.3 GHz), and vLLM's CPU kernels differ by several
times between them."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

# torch.cuda.get_device_name -> GPU catalog name (every value is a catalog entry; tests check it). Unknown names
# fall back to a slug of the device name, which the catalog does not hold: collecting then asks for the entry.
GPU_CATALOG_NAMES = {
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA B200": "b200",
}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """ISA extensions that change kernel speed (AVX-512, AMX, BF16)."""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            keep = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "fma")
            return sorted(f for f in flags if f in keep)
    return []


def cpu_cores() -> int:
    """Cores this process may use (cgroup/affinity aware), which is what the ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_gib() -> float:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def cpu_mhz() -> float | None:
    mhz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if mhz:
        return int(mhz) / 1000.0
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":", 1)[1])
    return None


def gpu_info() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        d: dict[str, Any] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                             "sms": p.multi_processor_count, "capability": f"{p.major}.{p.minor}"}
        # Clocks are not in the properties; nvidia-smi's figures would need a subprocess per call: read them via
        # pynvml when present, else leave them out.
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d["sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
            d["mem_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
            d["power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0
        except Exception:  # noqa: BLE001 - optional figures
            pass
        out.append(d)
    return out


@cache
def hardware_fingerprint() -> dict[str, Any]:
    gpus = gpu_info()
    return {
        "device": gpus[0]["name"] if gpus else "cpu",
        "device_count": len(gpus) if gpus else 1,
        "gpus": gpus,
        "cpu_model": cpu_model(),
        "cpu_cores": cpu_cores(),
        "cpu_flags": cpu_flags(),
        "cpu_max_mhz": cpu_mhz(),
        "memory_gib": memory_gib(),
        "machine": platform.machine(),
    }


@cache
def software_fingerprint() -> dict[str, Any]:
    import torch.distributed as dist

    try:
        from importlib.metadata import version

        pp_version = version("perfpredict")
    except Exception:  # noqa: BLE001 - running from a checkout
        pp_version = "dev"
    d: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                         "perfpredict": pp_version, "platform": platform.platform(),
                         "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                         "gloo": dist.is_available() and dist.is_gloo_available()}
    if torch.cuda.is_available():
        d["cuda"] = torch.version.cuda
        try:
            d["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            d["nccl"] = None
    return d


def hardware_name() -> str:
    """The GPU catalog name for the device measurements run on. On a CPU, the catalog entry that describes this
    host (same cpu_model and vector ISA: core.catalog.cpu_hardware_for), else the generic "cpu"."""
    if not torch.cuda.is_available():
        from perfpredict.core.catalog import cpu_hardware_for

        return cpu_hardware_for(hardware_fingerprint()) or "cpu"
    name = torch.cuda.get_device_name(0)
    if name in GPU_CATALOG_NAMES:
        return GPU_CATALOG_NAMES[name]
    return name.lower().replace("nvidia ", "").replace(" ", "-")


def machine_facts() -> dict[str, Any]:
    """What provenance records about this machine, as plain JSON: taken where the measurement runs (a lent GPU
    machine writes it beside its raw results, collect.device) and turned into provenance columns where the rows are
    written (`provenance(..., facts=)`), so both name the measuring machine, not the importing one."""
    return {"source": "ours-gpu" if torch.cuda.is_available() else "ours-cpu", "hardware": hardware_name(),
            "hardware_fingerprint": hardware_fingerprint(), "software": software_fingerprint(),
            "short_hash": short_hash(), "collected_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


def provenance(command: str, *, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The provenance columns every collected row carries (core.dataset.PROVENANCE), of this machine now or of the
    machine_facts() another one recorded."""
    from perfpredict.core.dataset import PROVENANCE, SCHEMA_VERSION

    f = facts or machine_facts()
    prov = {"source": f["source"], "hardware": f["hardware"], "hardware_fingerprint": dumps(f["hardware_fingerprint"]),
            "software": dumps(f["software"]), "collected_at": f["collected_at"], "command": command,
            "license": "Apache-2.0", "schema_version": SCHEMA_VERSION}
    assert set(prov) == set(PROVENANCE)
    return prov


def short_hash(fp: dict[str, Any] | None = None) -> str:
    fp = fp or hardware_fingerprint()
    keys = ("device", "device_count", "cpu_model", "cpu_cores", "memory_gib")
    stable = {k: fp.get(k) for k in keys}
    if fp.get("device") == "cpu":
        stable["cpu_flags"] = sorted(fp.get("cpu_flags") or [])
    stable["gpu_memory"] = [g.get("memory_gib") for g in fp.get("gpus", [])]
    text = json.dumps(stable, sort_keys=True)
    return f"{hardware_name()}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def dumps(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)
