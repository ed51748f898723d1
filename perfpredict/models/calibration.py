"""The step-level terms fitted on measured steps over the kernel composition (models.compose), as scikit-learn
estimators: LaunchFloor (host dispatch and launch seconds per kernel, per device class and trainer runtime, and
whether it hides behind device time) and TrlCalibration (TRL's per-family efficiencies and DeepSpeed host terms
on CPU).

X is a described frame of measured runs (features.descriptors.describe, the rows train.data.time_rows keeps) and
y their measured step seconds; `kernels` is the fitted KernelModel the composition runs on. The fitted values
(`floors_`, `calibration_`) are plain dicts: a bundle stores them in its metadata and compose() takes them as
arguments, so a prediction needs neither this module nor scikit-learn (which costs a cold `perfpredict rank`
over a second)."""

from __future__ import annotations

import numpy as np
import polars as pl
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from perfpredict.core.errors import PerfPredictError
from perfpredict.features.compute import on_cpu
from perfpredict.models.compose import (
    LAUNCH_FLOOR_S,
    TRL_CALIBRATION,
    TRL_FAMILIES,
    _assemble,
    _compose,
    _deepspeed_steps,
    _kernel_parts,
    _trl_cpu,
    _zero3_hook_units,
    compose,
)
from perfpredict.models.kernels import KernelModel

# The launch floor's search: per-kernel seconds, and the share of device time dispatch may hide behind (0: added,
# 1: hidden; compose.launch_floor_s). A device class needs MIN_CLASS_ROWS measured steps to be fitted at all, a
# trainer runtime on GPUs MIN_RUNTIME_ROWS for its own floor and hiding mode (fewer: the pooled floor, added).
LAUNCH_GRID_S = (5e-6, 1e-5, 2e-5, 3e-5, 4e-5, 6e-5, 8e-5, 1.2e-4)
HIDDEN_GRID = (0.0, 1.0)
MIN_CLASS_ROWS = 20
MIN_RUNTIME_ROWS = 100
# Bounds of TRL's calibration (compose.TRL_CALIBRATION): each scale stays a physical efficiency, the host terms
# stay seconds a Python hook or an engine step can take. Fewer than MIN_TRL_ROWS measured TRL steps on CPU: the
# defaults.
TRL_SCALE_BOUNDS = (0.25, 8.0)
ZERO3_HOOK_BOUNDS_S = (0.0, 0.01)
DEEPSPEED_STEP_BOUNDS_S = (0.0, 0.5)
MIN_TRL_ROWS = 10
# The residual between a host's TRL-op probe ratios and its fitted step-level scales (TrlCalibration): what the
# composition counts beyond the probed ops, shared by every probed host.
RESIDUAL_BOUNDS = (0.1, 4.0)
MIN_PROBED_HOSTS = 2
TRL_SCALE_NAMES = tuple(f"{f}_scale" for f in TRL_FAMILIES) + ("fold_scale",)


def _kernels(est: BaseEstimator) -> KernelModel:
    if not isinstance(est.kernels, KernelModel) or not hasattr(est.kernels, "models_"):
        raise PerfPredictError(f"{type(est).__name__} needs fitted kernel models (kernels=KernelModel(...).fit(probes)), "
                               f"got {type(est.kernels).__name__}")
    return est.kernels


def _targets(X: pl.DataFrame, y) -> np.ndarray:
    y = np.asarray(y, dtype=float)
    if y.shape != (X.height,):
        raise PerfPredictError(f"y holds {y.size} step times for {X.height} runs; expected one per run")
    return y


class LaunchFloor(BaseEstimator):
    """The per-kernel launch cost of each device class that best explains measured steps: the grid point of least
    median |log10(measured / composed)|; on GPUs pooled (added) and per trainer runtime with enough steps, with
    whether it hides behind device time. A class without enough measured steps keeps compose.LAUNCH_FLOOR_S.

    `floors_` is the mapping compose(launch_floor=...) reads: "cpu", "gpu", "gpu:<runtime>" seconds per kernel and
    their "_hidden" shares."""

    def __init__(self, kernels: KernelModel | None = None, *, grid_s: tuple[float, ...] = LAUNCH_GRID_S,
                 hidden_grid: tuple[float, ...] = HIDDEN_GRID, min_class_rows: int = MIN_CLASS_ROWS,
                 min_runtime_rows: int = MIN_RUNTIME_ROWS):
        self.kernels = kernels
        self.grid_s = grid_s
        self.hidden_grid = hidden_grid
        self.min_class_rows = min_class_rows
        self.min_runtime_rows = min_runtime_rows

    def fit(self, X: pl.DataFrame, y) -> LaunchFloor:
        kernels = _kernels(self)
        y_s = _targets(X, y)
        floors = dict(LAUNCH_FLOOR_S)
        cpu = X.select(on_cpu()).to_series().to_numpy()
        if cpu.sum() >= self.min_class_rows:
            floors = self._best(X.filter(pl.Series(cpu)), kernels, y_s[cpu], floors, "cpu", (0.0,))
        if (~cpu).sum() >= self.min_class_rows:
            gpu = X.filter(pl.Series(~cpu))
            # The pooled floor is what a runtime without steps of its own gets: a launch cost, so an optimum on the
            # grid's last point (the search found none: the pooled steps want more time than any launch cost, and
            # one runtime's unmodelled slowness would be lent to every other) keeps the prior. Held out by
            # hardware, A100 took Megatron's only GPU steps (vTrain) with it and the pool left was the playbook's
            # nanotron steps, still 1.5x slower than composed at 120 us: Megatron was charged 120 us per kernel,
            # its composed steps 2.1x the measured (101.9 % error; 24.7 % at the prior, 11.3 % at its own 40 us).
            floors = self._best(gpu, kernels, y_s[~cpu], floors, "gpu", (0.0,), interior=True)
            rts = gpu["d_runtime"].to_numpy()
            for rt in sorted(set(rts)):
                idx = rts == rt
                if idx.sum() >= self.min_runtime_rows:
                    floors = self._best(gpu.filter(pl.Series(idx)), kernels, y_s[~cpu][idx], floors, f"gpu:{rt}",
                                        tuple(self.hidden_grid))
        self.floors_ = floors
        return self

    def _best(self, desc: pl.DataFrame, kernels: KernelModel, y_s: np.ndarray, floors: dict[str, float],
              key: str, hidden: tuple[float, ...], interior: bool = False) -> dict[str, float]:
        """floors with `key` (and `key`'s hidden share) set to the grid point of least median |log10 ratio|. The
        kernels are predicted once per subset; only the assembly of the step is redone per grid point. `interior`:
        an optimum at the grid's largest floor leaves `floors` as they were."""
        parts = _kernel_parts(desc, kernels)
        best, out = np.inf, floors
        for h in hidden:
            for f in self.grid_s:
                trial = {**floors, key: f, key.replace(":", "_hidden:", 1) if ":" in key else f"{key}_hidden": h}
                err = np.median(np.abs(np.log10(y_s / _assemble(parts, trial)["k_step_s"].to_numpy())))
                if err < best:
                    best, out = err, trial
        if interior and out is not floors and out[key] >= max(self.grid_s):
            return floors
        return out

    def predict(self, X: pl.DataFrame) -> np.ndarray:
        """Composed step seconds with this floor and the default TRL calibration (what the fit scored)."""
        check_is_fitted(self, "floors_")
        return compose(X, _kernels(self), launch_floor=self.floors_, canonical=False)["k_step_s"].to_numpy()


class TrlCalibration(BaseEstimator):
    """compose.TRL_CALIBRATION's scales and host terms that best explain measured TRL steps on CPU: bounded least
    squares on relative error (each step weighted by 1/measured) over the composition with `launch_floor` (a
    LaunchFloor's `floors_`; None: compose.LAUNCH_FLOOR_S); the defaults without at least `min_rows` such steps.

    `probe_scales` ({hardware: {scale: ratio}}, models.trl_scales.trl_probe_scales) are the hosts whose TRL-op probes
    measured their TRL efficiency per family. A probed host's scale is its measured ratio times a residual shared by
    every host (`residuals_`: what the step-level composition counts beyond the probed ops; fitted on the TRL steps
    of probed hosts), so a new host's TRL efficiency comes from its own probes. The constants (the fallback of every
    host without TRL-op probes) are fitted on the other hosts' steps (on all steps where every host is probed).
    The residuals need the TRL steps of at least `min_probed_hosts` probed hosts: over one host, ratio x residual is
    that host's own refit and the probes add nothing (on our data that refit was worse on held-out shapes than the
    constants pooled over both hosts: 12.6 vs 11.8 % on the AVX-512 EPYC, 13.6 vs 12.6 % on the AVX2 one). Until
    then every host falls back to the constants, and `probe_fallback_` says why.

    `calibration_` is the mapping compose(trl_calibration=...) reads: the constants, the host terms and each probed
    host's scales as "<scale>@<hardware>". `measured_hosts_` names the hosts read from probes."""

    def __init__(self, kernels: KernelModel | None = None, *, launch_floor: dict[str, float] | None = None,
                 scale_bounds: tuple[float, float] = TRL_SCALE_BOUNDS,
                 zero3_hook_bounds_s: tuple[float, float] = ZERO3_HOOK_BOUNDS_S,
                 deepspeed_step_bounds_s: tuple[float, float] = DEEPSPEED_STEP_BOUNDS_S, min_rows: int = MIN_TRL_ROWS,
                 probe_scales: dict[str, dict[str, float]] | None = None,
                 residual_bounds: tuple[float, float] = RESIDUAL_BOUNDS,
                 min_probed_hosts: int = MIN_PROBED_HOSTS):
        self.kernels = kernels
        self.launch_floor = launch_floor
        self.scale_bounds = scale_bounds
        self.zero3_hook_bounds_s = zero3_hook_bounds_s
        self.deepspeed_step_bounds_s = deepspeed_step_bounds_s
        self.min_rows = min_rows
        self.probe_scales = probe_scales
        self.residual_bounds = residual_bounds
        self.min_probed_hosts = min_probed_hosts

    def fit(self, X: pl.DataFrame, y) -> TrlCalibration:
        kernels = _kernels(self)
        y_s = _targets(X, y)
        probed = {hw: dict(v) for hw, v in (self.probe_scales or {}).items()
                  if all(k in v for k in TRL_SCALE_NAMES)}
        trl = X.select(_trl_cpu().fill_null(False)).to_series().to_numpy()
        self.n_rows_ = int(trl.sum())
        self.measured_hosts_: list[str] = []
        self.residuals_: dict[str, float] = {}
        self.probe_fallback_ = None if probed else "no host has TRL-op probes (collect probes --families trl)"
        if trl.sum() < self.min_rows:
            self.calibration_ = dict(TRL_CALIBRATION)
            if probed:
                self.probe_fallback_ = f"fewer than {self.min_rows} TRL steps on CPU to fit the residuals on"
            return self
        sub = X.filter(pl.Series(trl))
        ident = {**TRL_CALIBRATION, "fold_scale": 0.0}
        base = _compose(sub, kernels, self.launch_floor or LAUNCH_FLOOR_S, ident)
        fam = np.column_stack([base[f"k_{f}_s"].to_numpy() for f in TRL_FAMILIES]
                              + [base["k_trlfold_unit_s"].to_numpy(),
                                 sub.select(_zero3_hook_units()).to_series().to_numpy(),
                                 sub.select(_deepspeed_steps()).to_series().to_numpy()])
        y = y_s[trl]
        rest = base["k_step_s"].to_numpy() - fam[:, :3].sum(axis=1)  # launch, optimizer, host: kept as composed
        x = self._solve(fam, y, rest)  # every step's fit: the constants where every host is probed
        hw = sub["g_name"].to_numpy()
        is_probed = np.isin(hw, list(probed))
        n_hosts = len(set(hw[is_probed]))
        if probed and n_hosts < self.min_probed_hosts:
            self.probe_fallback_ = (f"TRL steps of {n_hosts} host(s) with TRL-op probes in training, "
                                    f"{self.min_probed_hosts} needed to tell the residual between probed ops and "
                                    "composed steps from one host's own efficiency: the fitted constants apply")
        elif is_probed.any():
            # One solve: the constants on unprobed hosts' steps, the residuals on probed hosts' steps (their
            # families times their measured ratios), the host terms on all.
            ratio = np.array([[probed.get(h, {}).get(k, 0.0) for k in TRL_SCALE_NAMES] for h in hw])
            design = np.column_stack([fam[:, :4] * ~is_probed[:, None], fam[:, :4] * ratio * is_probed[:, None],
                                      fam[:, 4:]])
            r_lo, r_hi = self.residual_bounds
            lo, hi = self.scale_bounds
            xx = self._solve(design, y, rest, bounds=([lo] * 4 + [r_lo] * 4, [hi] * 4 + [r_hi] * 4))
            # A term no training step exercises (no unprobed host, no DeepSpeed step) keeps the every-step fit.
            seen = design.any(axis=0)
            x = np.where(np.r_[seen[:4], seen[8:]], np.r_[xx[:4], xx[8:]], x)
            self.residuals_ = {k: float(v) for k, v in zip(TRL_SCALE_NAMES, xx[4:8], strict=True)}
            self.measured_hosts_ = sorted(probed)
        own = {f"{k}@{h}": float(np.clip(d[k] * self.residuals_[k], *self.scale_bounds))
               for h, d in probed.items() for k in TRL_SCALE_NAMES} if self.residuals_ else {}
        self.calibration_ = {"gemm_scale": float(x[0]), "attention_scale": float(x[1]),
                             "membound_scale": float(x[2]), "fold_scale": float(x[3]), "zero3_hook_s": float(x[4]),
                             "deepspeed_step_s": float(x[5]), **own}
        return self

    def _solve(self, fam: np.ndarray, y: np.ndarray, rest: np.ndarray,
               bounds: tuple[list[float], list[float]] | None = None) -> np.ndarray:
        """Bounded least squares of (y - rest) on fam's columns, relative error: the scale columns (`bounds`, default
        four scales), then the two host terms."""
        from scipy.optimize import lsq_linear

        w = 1.0 / y
        lo, hi = self.scale_bounds
        lo_s, hi_s = bounds or ([lo] * 4, [hi] * 4)
        bnd = (list(lo_s) + [self.zero3_hook_bounds_s[0], self.deepspeed_step_bounds_s[0]],
               list(hi_s) + [self.zero3_hook_bounds_s[1], self.deepspeed_step_bounds_s[1]])
        return lsq_linear(fam * w[:, None], (y - rest) * w, bounds=bnd).x

    def predict(self, X: pl.DataFrame) -> np.ndarray:
        """Composed step seconds with `launch_floor` and this calibration."""
        check_is_fitted(self, "calibration_")
        return compose(X, _kernels(self), launch_floor=self.launch_floor, trl_calibration=self.calibration_,
                       canonical=False)["k_step_s"].to_numpy()
