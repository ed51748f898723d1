"""Will a plan run out of GPU memory? A three-way verdict (fits / at risk / does not fit) with a probability, from
the predicted peak's 90 % interval, the memory outside PyTorch's allocator (features.reserve) and a margin per
(framework family, GPU memory class) calibrated on held-out OOM outcomes.

Per plan, with `usable` = GPU memory minus the reserve, the peak's point prediction p and its interval [lo, hi]:
- fits when hi x (1 + a) <= usable: the interval's upper end, widened by the cell's calibrated a, fits;
- does not fit when lo x (1 + b) > usable: the lower end, moved by the cell's calibrated b, does not;
- at risk in between.
The margin stated for a plan is m = hi x (1 + a) / p - 1: it fits exactly when p x (1 + m) <= usable. A cell
without enough OOM outcomes keeps a = b = 0: its interval alone decides (no global constant stands in).

The probability of running out, P(peak > usable), reads the interval as a log-normal whose 95th percentile is the
fit bound hi x (1 + a) (and 5th lo x (1 + b)), so fits <=> P(OOM) <= 5 %.

Calibration (fit): over out-of-fold predictions with a known outcome, a is the smallest value in [0, A_MAX]
whose missed-OOM rate (failed, called "fits") is at most MAX_MISSED_OOM, or, where no a reaches that, within
MISSED_SLACK of the rate A_MAX reaches; b the largest in [-0.3, 0] whose false-OOM rate (ran, called "does not
fit") stays at most MAX_FALSE_OOM: "does not fit" needs at least the interval's lower end above usable memory. A b
above 0 met the cap on the playbook's 1B failures and called 16 % of its held-out 8B runs that ran "does not fit".
Only failures a source reports as out of memory are OOM outcomes: the playbook's "crashed or out of memory, cause
not given" are `failed_unknown` (core.schema), outside this calibration, so no cell has OOM outcomes today and every
cell keeps a = b = 0. (Scored as OOM they had set a = 0.18 for nanotron on 80 GiB GPUs, and 15 % of them are
predicted below 30 % of the GPU: no margin reaches a crash.) The history below was measured while they counted.
Past A_MAX (30 % over the interval's upper end) each point of missed OOM caught hid ~4 points of runs that ran
(playbook, out of fold: a 0.3 -> 1.0 took missed OOM from 16.6 % to 14.6 % and runs called "fits" from 82 % to
66 %)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from perfpredict.core.frameworks import FAMILY
from perfpredict.features.compute import on_cpu

FITS, AT_RISK, NO_FIT = "fits", "at risk", "does not fit"
# GPU memory classes (upper bound GiB, label): how much a few GiB outside the allocator matter and which cards
# share an allocator regime (consumer 24 GiB, 40-48 GiB, 80-96 GiB datacenter, 141 GiB and up).
MEMORY_CLASSES = ((24.5, "<=24GiB"), (48.5, "32-48GiB"), (96.5, "64-96GiB"), (math.inf, ">96GiB"))
MIN_RAN, MIN_OOM = 30, 20  # outcomes a cell needs on each side to be calibrated
MAX_FALSE_OOM = 0.02
MAX_MISSED_OOM = 0.05
MISSED_SLACK = 0.01
A_MAX = 0.3
GRID = np.round(np.arange(-0.3, 1.0001, 0.01), 4)
# a is never below 0: the interval's upper end is already the peak's 95th percentile, and a margin that tightens it
# is learned in the calibration rows' regime. Held out by scale (the playbook's multi-node runs), the a = -0.16 its
# single-node runs allowed called 58 % of the multi-node failures "fits"; a >= 0: 51 %, the runs that ran called
# "fits" 99 -> 97 %.
A_GRID = GRID[(GRID >= -1e-9) & (GRID <= A_MAX + 1e-9)]
B_GRID = GRID[GRID <= 1e-9]
Z95 = 1.6448536269514722  # one-sided 95 % normal quantile: the fit bound is the 95th percentile


def memory_class(gib: float, cpu: bool) -> str:
    if cpu:
        return "host"
    return next(label for bound, label in MEMORY_CLASSES if gib <= bound)


def margin_cells(df: pl.DataFrame) -> list[str]:
    """(framework family, GPU memory class) per row, e.g. "3d|64-96GiB", "trl|host"."""
    names, ids = _cell_codes(df)
    return names[ids].tolist()


def _cell_codes(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The distinct cells of df's rows and, per row, the index of its cell: a ranking holds thousands of plans
    but a handful of (framework, GPU memory, CPU or not) triples, so each is named once."""
    triples = df.select(c_fw=pl.col("p_framework"), c_mem=pl.col("g_memory_gib").cast(pl.Float64), c_cpu=on_cpu())
    distinct = triples.unique(maintain_order=True).with_row_index("c_id")
    ids = triples.join(distinct, on=["c_fw", "c_mem", "c_cpu"], how="left", maintain_order="left",
                       nulls_equal=True)["c_id"].to_numpy()
    names = np.array([f"{FAMILY.get(fw, fw)}|{memory_class(float(g), bool(x))}"
                      for fw, g, x in distinct.select("c_fw", "c_mem", "c_cpu").iter_rows()], dtype=object)
    return names, ids


def _rates(lo, hi, usable, ran, a, b):
    fit = hi * (1.0 + a) <= usable
    nofit = (lo * (1.0 + b) > usable) & ~fit
    missed = float(fit[~ran].mean()) if (~ran).any() else math.nan
    false = float(nofit[ran].mean()) if ran.any() else math.nan
    return missed, false


class OomMargins:
    """Per-cell margins (a, b) of the verdict above. scikit-learn style: fit returns self; `cells_` maps a cell to
    {"a", "b", "ran", "oom", "missed_oom", "false_oom"} (rates on the calibration rows)."""

    def fit(self, cells: list[str], lo_gib: np.ndarray, hi_gib: np.ndarray, usable_gib: np.ndarray,
            ran: np.ndarray) -> OomMargins:
        cells_a = np.array(cells, dtype=object)
        lo, hi = np.asarray(lo_gib, dtype=float), np.asarray(hi_gib, dtype=float)
        usable, ran = np.asarray(usable_gib, dtype=float), np.asarray(ran, dtype=bool)
        self.cells_ = {}
        for cell in sorted(set(cells)):
            sel = (cells_a == cell) & np.isfinite(lo) & np.isfinite(hi)
            n_ran, n_oom = int((sel & ran).sum()), int((sel & ~ran).sum())
            if n_ran < MIN_RAN or n_oom < MIN_OOM:
                continue
            args = (lo[sel], hi[sel], usable[sel], ran[sel])
            missed = np.array([_rates(*args, a, -1.0)[0] for a in A_GRID])
            target = max(missed[-1] + MISSED_SLACK, MAX_MISSED_OOM)
            a = float(A_GRID[np.argmax(missed <= target)])
            falses = np.array([_rates(*args, a, b)[1] for b in B_GRID])
            allowed = np.flatnonzero(falses <= MAX_FALSE_OOM)
            b = float(B_GRID[allowed[-1]]) if allowed.size else float(B_GRID[0])
            m, f = _rates(*args, a, b)
            self.cells_[cell] = {"a": a, "b": b, "ran": n_ran, "oom": n_oom, "missed_oom": m, "false_oom": f}
        return self

    def to_dict(self) -> dict:
        return {k: dict(v) for k, v in self.cells_.items()}

    @classmethod
    def from_dict(cls, d: dict | None) -> OomMargins:
        m = cls()
        m.cells_ = {k: dict(v) for k, v in (d or {}).items()}
        return m

    def ab(self, cells: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, calibrated) per row; an uncalibrated cell: 0, 0, False."""
        got = [self.cells_.get(k) for k in cells]
        return (np.array([g["a"] if g else 0.0 for g in got]), np.array([g["b"] if g else 0.0 for g in got]),
                np.array([g is not None for g in got], dtype=bool))

    def ab_of(self, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """ab(margin_cells(df)), looked up once per distinct cell (the ranking's hot path)."""
        names, ids = _cell_codes(df)
        a, b, known = self.ab(names.tolist())
        return a[ids], b[ids], known[ids]


def _erfc(x: np.ndarray) -> np.ndarray:
    """math.erfc elementwise (no scipy on the ranking path), evaluated once per distinct value: a ranking's plans
    share few memory predictions (many differ only in knobs that move no byte)."""
    x = np.asarray(x, dtype=float)
    if not x.size:
        return np.zeros(0)
    u, inv = np.unique(x, return_inverse=True)
    return np.array([math.erfc(v) for v in u])[inv.reshape(x.shape)]


def verdict(pred_gib: np.ndarray, lo_gib: np.ndarray, hi_gib: np.ndarray, usable_gib: np.ndarray,
            a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """fit_verdict (fits / at risk / does not fit), oom_risk (P(peak > usable)), oom_margin (m: fits exactly when
    pred x (1 + m) <= usable) and fit_limit_gib (usable / (1 + m): the largest predicted peak that fits)."""
    pred, lo, hi, usable = (np.asarray(x, dtype=float) for x in (pred_gib, lo_gib, hi_gib, usable_gib))
    up, down = hi * (1.0 + a), lo * (1.0 + b)
    fit = up <= usable
    nofit = (down > usable) & ~fit
    # Log-normal around the point: the fit bound is its 95th percentile, the no-fit bound its 5th.
    s_hi = np.maximum(np.log(np.maximum(up, 1e-12) / np.maximum(pred, 1e-12)), 1e-3) / Z95
    s_lo = np.maximum(np.log(np.maximum(pred, 1e-12) / np.maximum(down, 1e-12)), 1e-3) / Z95
    z = np.log(np.maximum(usable, 1e-12) / np.maximum(pred, 1e-12))
    z = np.where(z >= 0, z / s_hi, z / s_lo)
    risk = 0.5 * _erfc(z / math.sqrt(2.0))
    # The verdict and the probability say the same: clip where log-normal tails and the bounds disagree by rounding.
    risk = np.where(fit, np.minimum(risk, 0.05), np.where(nofit, np.maximum(risk, 0.95), risk))
    margin = up / np.maximum(pred, 1e-12) - 1.0
    v = np.where(fit, FITS, np.where(nofit, NO_FIT, AT_RISK))
    return {"fit_verdict": v, "oom_risk": risk, "oom_margin": margin, "fit_limit_gib": usable / (1.0 + margin)}
