"""GPU and model catalogs: one JSON file per entry under perfpredict/catalog/, read on first use."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

from perfpredict.core.errors import PerfPredictError, unknown
from perfpredict.core.hardware import GPUSpec
from perfpredict.core.model import ModelSpec


def _entries(kind: str) -> dict[str, dict]:
    root = resources.files("perfpredict") / "catalog" / kind
    out = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            out[data["name"]] = data
    return out


@cache
def gpu_catalog() -> dict[str, GPUSpec]:
    return {n: GPUSpec.from_dict(d) for n, d in _entries("gpus").items()}


@cache
def model_catalog_raw() -> dict[str, dict]:
    return _entries("models")


@cache
def model_catalog() -> dict[str, ModelSpec]:
    return {n: ModelSpec.from_dict(d) for n, d in model_catalog_raw().items()}


def get_gpu(name: str) -> GPUSpec:
    if not isinstance(name, str):
        raise PerfPredictError(f"gpu must be a catalog name, got {type(name).__name__}")
    cat = gpu_catalog()
    key = name.strip().lower()
    if key not in cat:
        raise unknown("GPU", name, cat)
    return cat[key]


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog name, or a path to a Hugging Face config.json (or a folder holding one)."""
    if not isinstance(name_or_path, str):
        raise PerfPredictError(f"model must be a catalog name or a config.json path, got {type(name_or_path).__name__}")
    cat = model_catalog()
    key = name_or_path.strip().lower()
    if key in cat:
        return cat[key]
    if not key or "\0" in name_or_path or len(name_or_path) > 4096:
        raise unknown("model", name_or_path[:60], cat)
    p = Path(name_or_path)
    try:
        if p.is_dir():
            p = p / "config.json"
        exists = p.exists()
    except OSError:
        exists = False
    if p.suffix == ".json" or exists:
        if not p.exists():
            raise PerfPredictError(f"model config {str(p)!r} does not exist")
        from perfpredict.core.hf_config import model_from_hf_config

        return model_from_hf_config(p)
    raise unknown("model", name_or_path, cat)


@cache
def cpu_names() -> frozenset[str]:
    """Catalog names of CPU hosts (vendor "cpu"): where the CPU rules (launch floor, latency, TRL's torch head)
    apply, whichever host it is."""
    return frozenset(n for n, g in gpu_catalog().items() if g.is_cpu)


def cpu_hardware_for(fingerprint: dict) -> str | None:
    """The catalog entry describing the CPU host a hardware fingerprint (collect.fingerprint) came from: same
    cpu_model and the same vector ISA flags. None when no entry describes it."""
    if not isinstance(fingerprint, dict) or fingerprint.get("device") != "cpu":
        return None
    isa = tuple(sorted(fingerprint.get("cpu_flags") or ()))
    for n, g in sorted(gpu_catalog().items()):
        if g.is_cpu and g.host_cpu_model == fingerprint.get("cpu_model") and g.host_isa == isa:
            return n
    return None
