"""GPU and model catalogs: one JSON file per entry under perfpredict/catalog/, read on first use."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path

from perfpredict.core.errors import PerfPredictError, unknown
from perfpredict.core.hardware import GPUSpec
from perfpredict.core.model import ModelSpec

# Where a user sees the names an unknown-name error refers to.
GPUS_LISTED_BY = "perfpredict catalog gpus"
MODELS_LISTED_BY = "perfpredict catalog models"


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
        raise unknown("GPU", name, cat, listed_by=GPUS_LISTED_BY)
    return cat[key]


@cache
def _by_hf_id() -> dict[str, str]:
    """Lower-cased Hugging Face id -> catalog name, for the entries that name their id."""
    return {d["hf_id"].lower(): n for n, d in model_catalog_raw().items() if isinstance(d.get("hf_id"), str)}


def hf_id(model: ModelSpec) -> str | None:
    """The Hugging Face id of a catalog model (what vLLM, transformers and TRL load), None for any other model."""
    raw = model_catalog_raw().get(model.name)
    return raw.get("hf_id") if raw else None


# An "owner/name" Hugging Face id: one slash, no path-only characters; told apart from a config.json path by the
# caller (a path that exists, or one ending in .json, is read as a config).
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog name, a catalog model's Hugging Face id (any case), or a path to a Hugging Face config.json (or a
    folder holding one)."""
    if not isinstance(name_or_path, str):
        raise PerfPredictError(f"model must be a catalog name or a config.json path, got {type(name_or_path).__name__}")
    cat = model_catalog()
    key = name_or_path.strip().lower()
    if key in cat:
        return cat[key]
    if not key or "\0" in name_or_path or len(name_or_path) > 4096:
        raise unknown("model", name_or_path[:60], cat, listed_by=MODELS_LISTED_BY)
    p = Path(name_or_path)
    try:
        if p.is_dir():
            p = p / "config.json"
        exists = p.exists()
    except OSError:
        exists = False
    # A local folder wins over a catalog id of the same spelling, as it does for transformers and vLLM.
    if not exists and key in _by_hf_id():
        return cat[_by_hf_id()[key]]
    if p.suffix == ".json" or exists:
        if not p.exists():
            raise PerfPredictError(f"model config {str(p)!r} does not exist")
        from perfpredict.core.hf_config import model_from_hf_config

        return model_from_hf_config(p)
    if _HF_ID.fullmatch(name_or_path.strip()):
        raise PerfPredictError(f"model {name_or_path!r} looks like a Hugging Face id but is not in the catalog "
                               f"({len(cat)} known: `{MODELS_LISTED_BY}` lists them); give the path of "
                               "its config.json (or of a folder holding one) instead")
    raise unknown("model", name_or_path, cat, listed_by=MODELS_LISTED_BY)


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
