"""TRL's per-host efficiencies read from the host's own TRL-op probes (collect.probes.trl_ops), instead of constants
fitted on one host's TRL steps.

For each kernel family the composition scales on TRL CPU plans (compose.TRL_FAMILIES, and the fused head's fold),
the scale is measured time / the generic kernel models' time for the same work, summed over the host's TRL-op
probes (a sum, so the ratio weighs each probe as the step time does):
- attention_scale: trl_sdpa (masked SDPA over repeated K/V) against the `attention` model at the same (batch, heads,
  kv_heads, seq, head_dim) and pass;
- gemm_scale: trl_linears (seven nn.Linear) against the composition's four GEMMs of the layer (qkv, o, gate+up,
  down: compose._gemms' shapes), forward, or forward and both backward GEMMs;
- membound_scale: trl_elementwise (eager norms, rotary, SiLU product, residuals) against the composition's
  elementwise work of the layer (two rmsnorm, one swiglu, two adds; the backward counted as two more forwards, as
  compose._membound does);
- fold_scale: trl_head (TRL's ChunkedLogProbFunction) minus its tile GEMMs at gemm_scale, against the fold units
  features.trl charges (CPU_FOLD_POLICY_CE forward and backward, CPU_FOLD_NOGRAD_CE a no-grad forward) of the
  cross_entropy fwd_bwd model.
The composition reads them per hardware (compose: calibration keys "<scale>@<hardware>"); a host without TRL-op
probes keeps the fitted constants (calibration.TrlCalibration), and only CPU hosts get any: on a GPU TRL plans are
composed from the GPU runtime model, never from CPU constants."""

from __future__ import annotations

import numpy as np
import polars as pl

from perfpredict.core.schema import TRL_OPS
from perfpredict.features.trl import CPU_FOLD_NOGRAD_CE, CPU_FOLD_POLICY_CE
from perfpredict.models.kernels import KernelModel

c = pl.col
SCALES = ("gemm_scale", "attention_scale", "membound_scale", "fold_scale")
# A host's scales need every family probed at MIN_PROBES configurations (forward and backward rows count apart).
MIN_PROBES = 2
# The bounds calibration.TrlCalibration keeps its fitted scales in: a measured ratio outside them is a broken probe.
SCALE_BOUNDS = (0.25, 8.0)
SEP = "@"


def scale_key(scale: str, hardware: str) -> str:
    """The calibration key of one host's measured scale (compose reads "<scale>@<hardware>")."""
    return f"{scale}{SEP}{hardware}"


def _gemm_queries(r: dict) -> list[dict]:
    """compose._gemms' four layer GEMMs at T tokens, each pass as the composition asks it."""
    T, h, a, kv, d, f = r["m"], r["k"], r["heads"], r["kv_heads"], r["head_dim"], r["n"]
    shapes = ((T, h, (a + 2 * kv) * d), (T, a * d, h), (T, h, 2 * f), (T, f, h))  # (m, k, n): qkv, o, gate+up, down
    out = []
    for m, k, n in shapes:
        out.append(dict(op="gemm", pass_="fwd", m=m, n=n, k=k))
        if r["pass_"] == "fwd_bwd":
            out += [dict(op="gemm", pass_="bwd_input", m=m, n=k, k=n), dict(op="gemm", pass_="bwd_weight", m=k, n=n, k=m)]
    return out


def _membound_queries(r: dict) -> list[dict]:
    T, h, f = r["m"], r["k"], r["n"]
    mult = 3.0 if r["pass_"] == "fwd_bwd" else 1.0  # compose._membound: backward = two forwards
    return [dict(op="rmsnorm", numel=T * h, count=2.0 * mult), dict(op="swiglu", numel=T * f, count=mult),
            dict(op="add", numel=T * h, count=2.0 * mult)]


def _head_queries(r: dict) -> tuple[list[dict], list[dict]]:
    """(tile GEMMs, fold units) of the fused head at N tokens, V vocabulary, h hidden (features.trl.head_passes)."""
    N, h, V = r["m"], r["k"], r["n"]
    gemms = [dict(op="gemm", pass_="fwd", m=N, n=V, k=h)]
    if r["pass_"] == "fwd_bwd":
        gemms += [dict(op="gemm", pass_="fwd", m=N, n=V, k=h), dict(op="gemm", pass_="bwd_input", m=N, n=h, k=V),
                  dict(op="gemm", pass_="bwd_weight", m=h, n=V, k=N)]
    units = CPU_FOLD_POLICY_CE if r["pass_"] == "fwd_bwd" else CPU_FOLD_NOGRAD_CE
    return gemms, [dict(op="cross_entropy", pass_="fwd_bwd", numel=N * V, count=units)]


def _predict(kernels: KernelModel, hardware: str, dtype: str, queries: list[dict]) -> float:
    """Summed seconds (x each query's count) of kernel queries, with compose.kernel_queries' columns."""
    from perfpredict.models.compose import KERNEL_KEYS

    if not queries:
        return 0.0
    base = {k: None for k in KERNEL_KEYS}
    q = pl.DataFrame([{**base, "hardware": hardware, "dtype": dtype, "count": 1.0, **x} for x in queries],
                     schema_overrides={k: pl.Float64 if k == "link_gb_per_s" else pl.Utf8
                                       if k in ("hardware", "op", "pass_", "dtype") else pl.Int64
                                       for k in KERNEL_KEYS})
    return float((kernels.predict(q.drop("count")) * q["count"].to_numpy()).sum())


def probe_ratios(probes: pl.DataFrame, kernels: KernelModel) -> pl.DataFrame:
    """One row per ok TRL-op probe on a CPU host: measured seconds and the generic kernel models' seconds for the
    same work (`generic_s`; for trl_head the tile GEMMs `gemm_s` and the fold units `fold_s` apart)."""
    from perfpredict.models.hardware_frame import with_hardware

    if probes.is_empty() or "op" not in probes.columns:
        return pl.DataFrame()
    p = probes.filter(c("op").is_in(list(TRL_OPS)) & (c("outcome").fill_null("ok") == "ok") & (c("time_s") > 0))
    if p.is_empty():
        return pl.DataFrame()
    cpu = with_hardware(p.select("hardware").unique()).filter(c("hw_is_cpu"))["hardware"].to_list()
    rows = []
    for r in p.filter(c("hardware").is_in(cpu)).to_dicts():
        hw, dt = r["hardware"], r["dtype"]
        gemm_s = fold_s = 0.0
        if r["op"] == "trl_sdpa":
            generic = _predict(kernels, hw, dt, [dict(op="attention", pass_=r["pass_"], batch=r["batch"],
                                                      heads=r["heads"], kv_heads=r["kv_heads"],
                                                      seq_len=r["seq_len"], head_dim=r["head_dim"])])
        elif r["op"] == "trl_linears":
            generic = _predict(kernels, hw, dt, _gemm_queries(r))
        elif r["op"] == "trl_elementwise":
            generic = _predict(kernels, hw, dt, _membound_queries(r))
        else:
            gq, fq = _head_queries(r)
            gemm_s, fold_s = _predict(kernels, hw, dt, gq), _predict(kernels, hw, dt, fq)
            generic = gemm_s + fold_s
        rows.append(dict(hardware=hw, op=r["op"], pass_=r["pass_"], time_s=float(r["time_s"]), generic_s=generic,
                         gemm_s=gemm_s, fold_s=fold_s))
    return pl.DataFrame(rows)


def trl_probe_scales(probes: pl.DataFrame, kernels: KernelModel, *, min_probes: int = MIN_PROBES
                     ) -> dict[str, dict[str, float]]:
    """{hardware: {scale: measured ratio}} for every CPU host whose TRL-op probes cover all four ops at least
    `min_probes` times each; other hosts are absent (they keep the fitted constants)."""
    ratios = probe_ratios(probes, kernels)
    out: dict[str, dict[str, float]] = {}
    if ratios.is_empty():
        return out
    lo, hi = SCALE_BOUNDS
    for (hw,), g in sorted(ratios.group_by("hardware"), key=lambda t: str(t[0])):
        n = dict(g.group_by("op").len().iter_rows())
        if any(n.get(op, 0) < min_probes for op in TRL_OPS):
            continue

        def ratio(op: str, g: pl.DataFrame = g) -> float:
            s = g.filter(c("op") == op)
            return float(s["time_s"].sum() / s["generic_s"].sum())

        gemm = float(np.clip(ratio("trl_linears"), lo, hi))
        head = g.filter(c("op") == "trl_head")
        fold = (head["time_s"].sum() - gemm * head["gemm_s"].sum()) / head["fold_s"].sum()
        out[hw] = {"gemm_scale": gemm, "attention_scale": float(np.clip(ratio("trl_sdpa"), lo, hi)),
                   "membound_scale": float(np.clip(ratio("trl_elementwise"), lo, hi)),
                   "fold_scale": float(np.clip(fold, lo, hi))}
    return out


def flat_scales(scales: dict[str, dict[str, float]]) -> dict[str, float]:
    """The calibration keys ("<scale>@<hardware>") of trl_probe_scales' result."""
    return {scale_key(k, hw): v for hw, d in scales.items() for k, v in d.items()}
