"""A trained predictor: kernel models, the launch floor and TRL calibration fitted over their composition
(models.calibration), plan-level time and memory corrections with their applicability domains, per-domain
conformal intervals and the OOM margins per (framework family, GPU memory class) (models.oom).

Saved as xgboost JSON files (each with its trees as numpy arrays beside it, models.trees), the corrections' training
matrices as .npy (no pickle), and metadata.json (feature lists, the fitted launch floor and TRL calibration, options,
domains, bounds, schema version, data hash, library versions). Loading checks the metadata and refuses a mismatch.
The pipeline-stall regime model (models.stall) is stall.json beside them: its logistic coefficients and checked
metadata; a bundle without one predicts one regime. metadata.json names each file's kind (FILE_KINDS; bundle_files),
so a reader never guesses a JSON file's format from its name: stall.json is JSON but no xgboost model."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.features.reserve import with_reserve
from perfpredict.models.compose import TRL_CALIBRATION, compose
from perfpredict.models.gb import GBRegressor, xgboost_version
from perfpredict.models.kernels import KernelModel, kernel_features
from perfpredict.models.oom import FITS, OomMargins, verdict
from perfpredict.models.plan_model import (
    Correction,
    Intervals,
    correction_from_meta,
    correction_meta,
)
from perfpredict.models.stall import (
    STALL_FILE,
    StallModel,
    expected_steps_per_s,
    load_stall,
    mixture_bounds,
    point_time,
    stall_free,
)

MODEL_SCHEMA_VERSION = 3

# What a bundle's files hold (metadata.json "file_kinds": {file: kind}): xgboost JSON models (with their numpy trees
# beside them, models.trees), the corrections' training matrices (.npy) and the stall model (models.stall).
BOOSTER, DOMAIN_MATRIX, STALL = "xgboost", "domain matrix", "stall model"
FILE_KINDS = (BOOSTER, DOMAIN_MATRIX, STALL)


def _kind_of_key(key: str) -> str:
    """A file's kind from its key in metadata "files": how Bundle.save names them, and how a bundle saved before
    "file_kinds" existed is read."""
    if key == "stall":
        return STALL
    return DOMAIN_MATRIX if key.endswith("_domain") else BOOSTER


def bundle_files(path: Path | str, kind: str) -> list[Path]:
    """The files of a saved bundle that hold `kind` (FILE_KINDS), as its metadata.json lists them."""
    if kind not in FILE_KINDS:
        raise ValueError(f"unknown bundle file kind {kind!r}; known: {', '.join(FILE_KINDS)}")
    path = Path(path)
    meta = json.loads((path / "metadata.json").read_text())
    kinds = meta.get("file_kinds") or {name: _kind_of_key(key) for key, name in meta["files"].items()}
    return [path / name for name, k in sorted(kinds.items()) if k == kind]


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import numpy

    import perfpredict

    return {"perfpredict": perfpredict.__version__, "xgboost": xgboost_version(), "polars": pl.__version__,
            "numpy": numpy.__version__, "scikit-learn": version("scikit-learn")}


# A launch floor's keys: device class, "_hidden" for the share of device time dispatch hides behind, and on GPUs
# ":<runtime>" where one was fitted per trainer runtime (compose.launch_floor_s).
_FLOOR_CLASSES = ("cpu", "gpu")


def check_launch_floor(floors: Any, where: str) -> dict[str, float]:
    """A fitted launch floor (calibration.LaunchFloor.floors_) as compose reads it, or one clear error."""
    if not isinstance(floors, Mapping) or not floors:
        raise PerfPredictError(f"{where}: launch_floor_s is {floors!r}; expected a mapping of 'cpu'/'gpu'[_hidden]"
                               "[:runtime] to seconds per kernel; retrain with `perfpredict train`")
    for key, v in floors.items():
        cls = str(key).split(":", 1)[0].removesuffix("_hidden")
        hidden = str(key).split(":", 1)[0].endswith("_hidden")
        ok_value = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0.0
        if cls not in _FLOOR_CLASSES or not ok_value or (hidden and v > 1.0):
            raise PerfPredictError(f"{where}: launch_floor_s[{key!r}] = {v!r}; expected keys 'cpu'/'gpu'[_hidden]"
                                   "[:runtime] with seconds >= 0 (a _hidden share in [0, 1]); retrain with "
                                   "`perfpredict train`")
    return dict(floors)


def check_trl_calibration(cal: Any, where: str) -> dict[str, float] | None:
    """A fitted TRL calibration (calibration.TrlCalibration.calibration_), None where a bundle predates TRL rows, or
    one clear error."""
    if cal is None:
        return None
    if not isinstance(cal, Mapping):
        raise PerfPredictError(f"{where}: trl_calibration is {cal!r}; expected a mapping of "
                               f"{', '.join(TRL_CALIBRATION)} to numbers; retrain with `perfpredict train`")
    for key, v in cal.items():
        # "<scale>@<hardware>": a host's scale measured by its TRL-op probes (models.trl_scales).
        base, _, hw = str(key).partition("@")
        per_host = bool(hw) and base.endswith("_scale")
        if (base not in TRL_CALIBRATION or ("@" in str(key) and not per_host)) or not isinstance(v, int | float) \
                or isinstance(v, bool) or not math.isfinite(v) or v < 0.0:
            raise PerfPredictError(f"{where}: trl_calibration[{key!r}] = {v!r}; expected keys among "
                                   f"{', '.join(TRL_CALIBRATION)} (a scale also as <scale>@<hardware>) with finite "
                                   "values >= 0; retrain with `perfpredict train`")
    return dict(cal)


@dataclass(frozen=True)
class Bundle:
    """`launch_floor_s` and `trl_calibration` are the fitted values of calibration.LaunchFloor and
    calibration.TrlCalibration (None: TRL_CALIBRATION's defaults); compose() reads them from here, never from
    attributes of the kernel models."""

    kernels: KernelModel
    launch_floor_s: dict[str, float]
    trl_calibration: dict[str, float] | None
    time: Correction
    memory: Correction
    time_intervals: Intervals
    memory_intervals: Intervals
    # Calibrated per (framework family, GPU memory class) on held-out OOM outcomes; a cell without them (and a
    # bundle saved before they existed) is judged by its memory interval alone.
    oom_margins: OomMargins = field(default_factory=lambda: OomMargins.from_dict({}))
    metadata: dict[str, Any] = field(default_factory=dict)
    # P(stall) and the stall's size (models.stall), saved as stall.json beside the bundle; None: a bundle saved
    # without one, whose cross-node pipelines keep the stall-free guard alone.
    stall: StallModel | None = None

    def compose(self, desc: pl.DataFrame, *, canonical: bool = True,
                canon: tuple[pl.DataFrame, np.ndarray] | None = None) -> pl.DataFrame:
        """compose.compose with this bundle's kernels, launch floor and TRL calibration."""
        return compose(desc, self.kernels, launch_floor=self.launch_floor_s, trl_calibration=self.trl_calibration,
                       canonical=canonical, canon=canon)

    def apply(self, df: pl.DataFrame) -> dict[str, np.ndarray]:
        """Predictions for composed rows: corrected time and memory, their intervals, applicability weights, the
        memory outside the allocator (r_*_gib) and the OOM verdict (models.oom.verdict; pred_fits: "fits")."""
        wt = self.time.weight(df)
        k = df["k_step_s"].to_numpy()
        t = k * 10.0 ** (wt * self.time.predict_log_ratio(df, where=wt > 0))
        keys = self.time.interval_keys(df)
        tlo, thi = self.time_intervals.bounds(keys, wt, self.unseen_hardware(df))
        free = stall_free(t, k, keys, self.time_intervals.outside_keys_)
        t_lo, t_hi = t * 10**tlo, t * 10**thi
        p_stall, stalled, expected = np.zeros(df.height), free, t  # one regime: the correction as it is
        rate = 1.0 / t
        if self.stall is not None:
            # Two regimes: stall-free (the correction, its interval) and stalled (plus micro-batches x the stall's
            # size, its spread added to the stall-free bounds). The point is the regime that minimises the expected
            # relative error (models.stall.point_time: the stall-free step unless a stall is likely), the interval
            # the mixture's 5th-95th percentiles, and the expected throughput is what `rank` orders by.
            # Outside the stall model's scope (one node, a family without measured stalls) the correction stands
            # as it is: no regime split is known there.
            scope = self.stall.in_scope(df)
            free = np.where(scope, free, t)
            p_stall = self.stall.proba(df, scope)
            s, s_lo, s_hi = (np.where(scope, v, 0.0) for v in self.stall.stall_s(df))
            stalled = free + s
            expected = free + p_stall * s
            rate = expected_steps_per_s(free, stalled, p_stall)  # what `rank` orders by
            t = point_time(free, stalled, p_stall)
            f_lo, f_hi = free * 10**tlo, free * 10**thi
            t_lo, t_hi = mixture_bounds(free, f_lo, f_hi, stalled, f_lo + s_lo, f_hi + s_hi, p_stall)
            # the point is inside by construction; this only absorbs the bisection's last-bit rounding
            t_lo, t_hi = np.minimum(t_lo, t), np.maximum(t_hi, t)
        wm = self.memory.weight(df)
        analytic = df["d_mem_gib"].to_numpy()
        mem = analytic * 10.0 ** (wm * self.memory.predict_log_ratio(df, where=wm > 0))
        mlo, mhi = self.memory_intervals.bounds(self.memory.interval_keys(df), wm)
        mem_lo, mem_hi = mem * 10**mlo, mem * 10**mhi
        res = with_reserve(df.select("g_name", "g_memory_gib", "p_tp", "p_dp", "p_cp", "p_ep", "p_pp"))
        usable = res["r_usable_gib"].to_numpy()
        a, b, _ = self.oom_margins.ab_of(df)
        v = verdict(mem, mem_lo, mem_hi, usable, a, b)
        return {"pred_time_s": t, "pred_time_lo_s": t_lo, "pred_time_hi_s": t_hi, "time_weight": wt,
                "pred_free_time_s": free, "pred_stalled_time_s": stalled, "pred_stall_p": p_stall,
                "pred_expected_time_s": expected, "pred_expected_steps_per_s": rate,
                "pred_mem_gib": mem, "pred_mem_lo_gib": mem_lo, "pred_mem_hi_gib": mem_hi, "mem_weight": wm,
                **{k: res[k].to_numpy() for k in ("r_context_gib", "r_nccl_gib", "r_hidden_gib", "r_usable_gib")},
                **v, "pred_fits": v["fit_verdict"] == FITS}

    def unseen_hardware(self, df: pl.DataFrame) -> np.ndarray:
        """Rows on a hardware none of the kernel models saw a probe of (its kernels are extrapolated)."""
        seen = {h for fam in self.kernels.families_.values() for h in fam.get("hardware", [])}
        return ~df["g_name"].is_in(sorted(seen)).to_numpy() if seen else np.zeros(df.height, dtype=bool)

    def save(self, out: Path | str) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        files = {}
        for fam, model in self.kernels.models_.items():
            name = f"kernel_{fam}.json"
            model.save_model(out / name)
            files[f"kernel_{fam}"] = name
        for kind, reg in (("time", self.time), ("memory", self.memory)):
            reg.model_.save_model(out / f"plan_{kind}.json")
            np.save(out / f"plan_{kind}_domain.npy", reg.train_X_.astype(np.float32), allow_pickle=False)
            files[f"plan_{kind}"] = f"plan_{kind}.json"
            files[f"plan_{kind}_domain"] = f"plan_{kind}_domain.npy"
        meta = {
            **self.metadata,
            "model_schema_version": MODEL_SCHEMA_VERSION,
            "versions": versions(),
            "files": files,
            "features": {"kernel": self.kernels.feature_names_},
            "kernel_families": self.kernels.families_,
            "launch_floor_s": self.launch_floor_s,
            "trl_calibration": self.trl_calibration,
            "corrections": {"time": correction_meta(self.time), "memory": correction_meta(self.memory)},
            "intervals_log10": {"time": self.time_intervals.to_dict(), "memory": self.memory_intervals.to_dict()},
            "oom_margins": self.oom_margins.to_dict(),
        }
        if self.stall is not None:
            self.stall.save(out / STALL_FILE)
            meta["files"]["stall"] = STALL_FILE
        meta["file_kinds"] = {name: _kind_of_key(key) for key, name in meta["files"].items()}
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
        if saved_xgb != xgboost_version().split(".")[0]:
            raise PerfPredictError(f"predictor at {str(path)!r} was saved by xgboost {meta['versions']['xgboost']}, "
                                   f"this is {xgboost_version()}; retrain with `perfpredict train`")
        for name in meta["files"].values():
            if not (path / name).exists():
                raise PerfPredictError(f"predictor at {str(path)!r} lacks {name}; retrain with `perfpredict train`")
        kernels = KernelModel()
        kernels.models_ = {key.removeprefix("kernel_"): GBRegressor.load_model(path / name)
                           for key, name in meta["files"].items() if key.startswith("kernel_")}
        kernels.feature_names_ = meta["features"]["kernel"]
        kernels.families_ = meta.get("kernel_families", {})
        regs = {kind: correction_from_meta(meta["corrections"][kind],
                                           GBRegressor.load_model(path / meta["files"][f"plan_{kind}"]),
                                           np.load(path / meta["files"][f"plan_{kind}_domain"], allow_pickle=False))
                for kind in ("time", "memory")}
        iv = meta["intervals_log10"]
        where = f"predictor at {str(path)!r}"
        return cls(kernels=kernels, launch_floor_s=check_launch_floor(meta.get("launch_floor_s"), where),
                   # absent in bundles trained before TRL rows
                   trl_calibration=check_trl_calibration(meta.get("trl_calibration"), where),
                   time=regs["time"], memory=regs["memory"],
                   time_intervals=Intervals.from_dict(iv["time"]), memory_intervals=Intervals.from_dict(iv["memory"]),
                   oom_margins=OomMargins.from_dict(meta.get("oom_margins")), metadata=meta,
                   # beside the bundle even where metadata.json predates it (fitted for a shipped bundle)
                   stall=load_stall(path))

    def check_features(self, df: pl.DataFrame) -> None:
        """The code's feature lists must be the ones the models were trained with (checked once per set of columns:
        the lists are the code's, the frame only says which optional columns exist)."""
        checked = self.__dict__.setdefault("_features_checked", set())
        cols = tuple(df.columns)
        if cols in checked:
            return
        for kind, reg in (("time", self.time), ("memory", self.memory)):
            if reg.feature_names(df) != reg.feature_names_:
                raise PerfPredictError(f"the {kind} model was trained on other features than this code builds; "
                                       "retrain with `perfpredict train`")
        checked.add(cols)

    def check_kernel_features(self, prepared: pl.DataFrame) -> None:
        for fam, names in self.kernels.feature_names_.items():
            kernel_features(prepared.head(1), fam, names)  # raises naming the features this code no longer builds


def default_path() -> Path:
    return Path(str(resources.files("perfpredict") / "predictor" / "default"))


@cache
def default_bundle() -> Bundle:
    """The shipped predictor (loaded once)."""
    return Bundle.load(default_path())


def default_kernels() -> KernelModel:
    """The shipped predictor's kernel models."""
    return default_bundle().kernels
