"""Gradient-boosted regressor on xgboost's native API, saved as xgboost JSON.

Native rather than XGBRegressor: importing xgboost's scikit-learn layer pulls in scikit-learn (over a second of
a cold `perfpredict rank`), and the predictor needs none of it. scikit-learn contract: fit returns self, learned
attributes end in `_`."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from pathlib import Path

import numpy as np


class _HideSklearn(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError("hidden while importing xgboost")
        return None


def _xgboost():
    if "xgboost" not in sys.modules and "sklearn" not in sys.modules:
        blocker = _HideSklearn()
        sys.meta_path.insert(0, blocker)
        try:
            import xgboost  # noqa: F401
        finally:
            sys.meta_path.remove(blocker)
    import xgboost

    return xgboost


xgb = _xgboost()

DEFAULTS = dict(n_estimators=300, max_depth=6, learning_rate=0.06, subsample=0.9, colsample_bytree=0.9,
                min_child_weight=2.0, reg_lambda=1.0, tree_method="hist", n_jobs=2)


class GBRegressor:
    def __init__(self, *, seed: int = 0, **params):
        self.seed = seed
        self.params = {**DEFAULTS, **params}

    def _native(self) -> dict:
        p = self.params
        return {"max_depth": p["max_depth"], "eta": p["learning_rate"], "subsample": p.get("subsample", 1.0),
                "colsample_bytree": p.get("colsample_bytree", 1.0), "min_child_weight": p.get("min_child_weight", 1.0),
                "lambda": p.get("reg_lambda", 1.0), "tree_method": p.get("tree_method", "hist"),
                "nthread": p.get("n_jobs", 2), "seed": self.seed, "objective": "reg:squarederror",
                **({"monotone_constraints": p["monotone_constraints"]} if p.get("monotone_constraints") else {})}

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> GBRegressor:
        d = xgb.DMatrix(np.asarray(X, dtype=np.float32), label=y, weight=sample_weight)
        self.booster_ = xgb.train(self._native(), d, num_boost_round=self.params["n_estimators"])
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.booster_.inplace_predict(np.asarray(X, dtype=np.float32))

    def save_model(self, path: Path | str) -> None:
        self.booster_.save_model(str(path))

    @classmethod
    def load_model(cls, path: Path | str) -> GBRegressor:
        m = cls()
        m.booster_ = xgb.Booster(model_file=str(path))
        m.booster_.set_param({"nthread": 2})
        return m
