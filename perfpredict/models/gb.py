"""Gradient-boosted regressor on xgboost's native API, saved as xgboost JSON (plus its trees as numpy arrays).

Native rather than XGBRegressor: importing xgboost's scikit-learn layer pulls in scikit-learn (over a second of
a cold `perfpredict rank`), and the predictor needs none of it. xgboost itself is imported only to fit or to save:
a loaded model predicts with models.trees (the same numbers, bit for bit, without xgboost's import and load time).
scikit-learn contract: fit returns self, learned attributes end in `_`."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from pathlib import Path

import numpy as np

from perfpredict.models.trees import TreeEnsemble, trees_path


class _HideSklearn(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError("hidden while importing xgboost")
        return None


def xgboost_module():
    """xgboost, imported on first use (training, saving) with scikit-learn hidden from it."""
    if "xgboost" not in sys.modules and "sklearn" not in sys.modules:
        blocker = _HideSklearn()
        sys.meta_path.insert(0, blocker)
        try:
            import xgboost  # noqa: F401
        finally:
            sys.meta_path.remove(blocker)
    import xgboost

    return xgboost


def xgboost_version() -> str:
    """The installed xgboost's version without importing it (its package's VERSION file)."""
    if "xgboost" in sys.modules:
        return sys.modules["xgboost"].__version__
    from importlib.util import find_spec

    spec = find_spec("xgboost")
    if spec is None or spec.origin is None:
        return "0"
    version_file = Path(spec.origin).with_name("VERSION")
    return version_file.read_text().strip() if version_file.exists() else xgboost_module().__version__


DEFAULTS = dict(n_estimators=300, max_depth=6, learning_rate=0.06, subsample=0.9, colsample_bytree=0.9,
                min_child_weight=2.0, reg_lambda=1.0, tree_method="hist", n_jobs=2)


_UNREAD = object()  # GBRegressor.load_model: trees not read yet


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
        xgb = xgboost_module()
        d = xgb.DMatrix(np.asarray(X, dtype=np.float32), label=y, weight=sample_weight)
        self.booster_ = xgb.train(self._native(), d, num_boost_round=self.params["n_estimators"])
        self.trees_ = None
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        if getattr(self, "trees_", None) is _UNREAD:  # a loaded model's trees, read at its first prediction
            self.trees_ = TreeEnsemble.for_model(self.path_)
        if getattr(self, "trees_", None) is not None:
            return self.trees_.predict(np.asarray(X, dtype=np.float32))
        return self.booster_.inplace_predict(np.asarray(X, dtype=np.float32))

    def save_model(self, path: Path | str) -> None:
        """The booster's xgboost JSON at `path` and its trees beside it (models.trees.trees_path)."""
        self._booster().save_model(str(path))
        TreeEnsemble.from_json_bytes(Path(path).read_bytes()).save(trees_path(path))

    def _booster(self):
        if getattr(self, "booster_", None) is None:
            self.booster_ = xgboost_module().Booster(model_file=str(self.path_))
            self.booster_.set_param({"nthread": 2})
        return self.booster_

    @classmethod
    def load_model(cls, path: Path | str) -> GBRegressor:
        """A saved model that predicts with numpy trees, read at its first prediction (a bundle holds a dozen models
        and a ranking on GPUs asks none of the CPU kernel families); the xgboost booster is loaded only if asked
        for."""
        m = cls()
        m.path_ = Path(path)
        if not m.path_.is_file():
            raise FileNotFoundError(f"no saved model at {m.path_}")
        m.booster_ = None
        m.trees_ = _UNREAD
        return m
