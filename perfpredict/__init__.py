"""perfpredict: a learned performance predictor for distributed LLM training and preference tuning.

Library entry points (keyword-only): `perfpredict.rank(model=..., cluster=..., workload=..., top=...)` returns a
polars DataFrame of the ranking; `perfpredict.predict(scenario)` returns one Prediction;
`perfpredict.predict_many(scenarios, errors="raise"|"return")` predicts a list in one batch: by default an invalid
entry raises one PerfPredictError naming every bad index (nothing predicted), with errors="return" each bad entry
gets a PredictionError(error, index) in its place. None of them imports torch."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: `import perfpredict` stays cheap; the predictor loads on first use.
    if name in ("rank", "predict", "predict_many", "predict_file", "rank_report"):
        from perfpredict import api

        return getattr(api, name)
    if name in ("Cluster", "GPUSpec", "ModelSpec", "Plan", "Scenario", "Workload", "PerfPredictError", "get_gpu",
                "get_model"):
        from perfpredict import core

        return getattr(core, name)
    raise AttributeError(f"module 'perfpredict' has no attribute {name!r}")
