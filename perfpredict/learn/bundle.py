"""A trained predictor: kernel models, plan-level time and memory models, conformal bounds and the OOM margin.

Saved as xgboost JSON files plus metadata.json (feature lists, schema version, data hash, library versions,
evaluation). Loading checks the metadata and refuses a mismatch; no pickle anywhere."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.learn.gb import GBRegressor, xgb
from perfpredict.learn.kernels import KernelModel
from perfpredict.learn.plan_model import RatioRegressor

MODEL_SCHEMA_VERSION = 1


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import numpy

    import perfpredict

    return {"perfpredict": perfpredict.__version__, "xgboost": xgb.__version__, "polars": pl.__version__,
            "numpy": numpy.__version__, "scikit-learn": version("scikit-learn")}


@dataclass
class Bundle:
    kernels: KernelModel
    time: RatioRegressor
    memory: RatioRegressor
    time_interval: tuple[float, float]  # log10 residual quantiles
    memory_interval: tuple[float, float]
    oom_margin: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def save(self, out: Path | str) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        files = {}
        for fam, model in self.kernels.models_.items():
            name = f"kernel_{fam}.json"
            model.save_model(out / name)
            files[f"kernel_{fam}"] = name
        self.time.model_.save_model(out / "plan_time.json")
        self.memory.model_.save_model(out / "plan_memory.json")
        meta = {
            **self.metadata,
            "model_schema_version": MODEL_SCHEMA_VERSION,
            "versions": versions(),
            "files": {**files, "plan_time": "plan_time.json", "plan_memory": "plan_memory.json"},
            "features": {"kernel": self.kernels.feature_names_, "time": self.time.feature_names_,
                         "memory": self.memory.feature_names_},
            "kernel_families": self.kernels.families_,
            "domains": {"time": self.time.domains_, "memory": self.memory.domains_},
            "time_interval_log10": list(self.time_interval),
            "memory_interval_log10": list(self.memory_interval),
            "oom_margin": self.oom_margin,
        }
        (out / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
        return out

    @classmethod
    def load(cls, path: Path | str) -> Bundle:
        path = Path(path)
        meta_p = path / "metadata.json"
        if not meta_p.exists():
            raise PerfPredictError(f"no trained predictor at {str(path)!r} (metadata.json missing); run `perfpredict train`")
        meta = json.loads(meta_p.read_text())
        if meta.get("model_schema_version") != MODEL_SCHEMA_VERSION:
            raise PerfPredictError(f"predictor at {str(path)!r} has schema {meta.get('model_schema_version')}, this "
                                   f"perfpredict reads {MODEL_SCHEMA_VERSION}; retrain with `perfpredict train`")
        saved_xgb = meta.get("versions", {}).get("xgboost", "0").split(".")[0]
        if saved_xgb != xgb.__version__.split(".")[0]:
            raise PerfPredictError(f"predictor at {str(path)!r} was saved by xgboost {meta['versions']['xgboost']}, "
                                   f"this is {xgb.__version__}; retrain with `perfpredict train`")
        kernels = KernelModel()
        kernels.models_ = {}
        for key, name in meta["files"].items():
            if not (path / name).exists():
                raise PerfPredictError(f"predictor at {str(path)!r} lacks {name}; retrain with `perfpredict train`")
            if key.startswith("kernel_"):
                kernels.models_[key.removeprefix("kernel_")] = GBRegressor.load_model(path / name)
        kernels.feature_names_ = meta["features"]["kernel"]
        kernels.families_ = meta.get("kernel_families", {})
        regs = {}
        for kind, base in (("time", "k_step_s"), ("memory", "d_mem_gib")):
            r = RatioRegressor(featurizer=kind, baseline=base, domain="framework" if kind == "time" else "device")
            r.model_ = GBRegressor.load_model(path / meta["files"][f"plan_{kind}"])
            r.feature_names_ = meta["features"][kind]
            r.domains_ = [tuple(d) for d in meta.get("domains", {}).get(kind, [])]
            regs[kind] = r
        return cls(kernels=kernels, time=regs["time"], memory=regs["memory"],
                   time_interval=tuple(meta["time_interval_log10"]),
                   memory_interval=tuple(meta["memory_interval_log10"]),
                   oom_margin=float(meta["oom_margin"]), metadata=meta)

    def check_features(self, df: pl.DataFrame) -> None:
        """The code's feature lists must be the ones the models were trained with."""
        for kind, reg in (("time", self.time), ("memory", self.memory)):
            now = reg.feature_names(df)
            if now != reg.feature_names_:
                raise PerfPredictError(f"the {kind} model was trained on other features than this code builds; "
                                       "retrain with `perfpredict train`")


def default_path() -> Path:
    return Path(str(resources.files("perfpredict") / "predictor" / "default"))
