"""models.trees: numpy evaluation of xgboost's trees, bit for bit equal to xgboost's own predict."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from perfpredict.models.bundle import BOOSTER, bundle_files, default_path
from perfpredict.models.gb import GBRegressor, xgboost_module, xgboost_version
from perfpredict.models.generate.model import BOOSTER_FILE, MODEL_DIR
from perfpredict.models.trees import TreeEnsemble, export_folder, trees_path

# The shipped xgboost models, as the bundles' metadata name them (the plan bundle's file_kinds: its stall.json is
# JSON but no booster), and the generation model's one.
SHIPPED = [*bundle_files(default_path(), BOOSTER), MODEL_DIR / BOOSTER_FILE]


def _inputs(trees: TreeEnsemble, n: int = 3000, seed: int = 0) -> np.ndarray:
    """Random rows, rows made of the ensemble's own split values (ties: x == split goes right), repeated rows and
    missing values (NaN: the default child)."""
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n, trees.n_features)) * 3).astype(np.float32)
    X[: n // 3] = rng.choice(trees.threshold, size=(n // 3, trees.n_features))
    X[n // 3: n // 2] = X[:1]
    X[n // 2: n // 2 + 100, : max(1, trees.n_features // 3)] = np.nan
    X[-5:] = np.inf
    return X


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(default_path())))
def test_shipped_models_predict_bit_identically_to_xgboost(path):
    booster = xgboost_module().Booster(model_file=str(path))
    trees = TreeEnsemble.for_model(path)
    X = _inputs(trees)
    assert np.array_equal(trees.predict(X), booster.inplace_predict(X))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(default_path())))
def test_shipped_exports_are_those_of_their_json(path):
    npz = TreeEnsemble.load(trees_path(path))
    assert npz.source_crc32 == zlib.crc32(path.read_bytes()), (
        f"{trees_path(path).name} was exported from another {path.name} (a retrained or merged bundle); refresh the "
        "exports: python -m perfpredict.models.trees perfpredict/predictor/default")
    fresh = TreeEnsemble.from_json_bytes(path.read_bytes())
    for name in ("roots", "feature", "threshold", "left", "right", "default_left", "value"):
        assert np.array_equal(getattr(npz, name), getattr(fresh, name)), name


def test_fit_save_load_round_trip_without_the_booster(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 6))
    y = X[:, 0] * 2 + np.sin(X[:, 1]) + rng.normal(scale=0.1, size=400)
    X[::17, 2] = np.nan
    m = GBRegressor(seed=0, n_estimators=40, max_depth=5).fit(X, y)
    m.save_model(tmp_path / "m.json")
    assert trees_path(tmp_path / "m.json").exists()
    loaded = GBRegressor.load_model(tmp_path / "m.json")
    assert loaded.booster_ is None  # predicts from the numpy trees
    assert np.array_equal(loaded.predict(X), m.predict(X))
    loaded.save_model(tmp_path / "again.json")  # the booster comes back when it is needed
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "m.json").read_bytes()


def test_a_stale_export_is_ignored(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 3))
    a = GBRegressor(seed=0, n_estimators=10).fit(X, X[:, 0])
    b = GBRegressor(seed=0, n_estimators=10).fit(X, X[:, 1])
    a.save_model(tmp_path / "a.json")
    b.save_model(tmp_path / "b.json")
    # b's JSON under a's name (a merge, a hand copy): a's export no longer matches and is not used.
    (tmp_path / "a.json").write_bytes((tmp_path / "b.json").read_bytes())
    assert np.array_equal(GBRegressor.load_model(tmp_path / "a.json").predict(X), b.predict(X))
    assert export_folder(tmp_path) == [trees_path(tmp_path / "a.json"), trees_path(tmp_path / "b.json")]
    assert TreeEnsemble.load(trees_path(tmp_path / "a.json")).source_crc32 == zlib.crc32((tmp_path / "a.json").read_bytes())


def test_version_without_import_matches_the_module():
    assert xgboost_version() == xgboost_module().__version__


def test_refuses_what_it_cannot_evaluate():
    raw = b'{"learner": {"objective": {"name": "binary:logistic"}, "learner_model_param": {}}}'
    with pytest.raises(ValueError, match="reg:squarederror"):
        TreeEnsemble.from_json_bytes(raw)


def test_bundle_file_kinds_come_from_metadata_and_older_bundles_read_by_key(tmp_path):
    import json

    from perfpredict.models.bundle import DOMAIN_MATRIX, STALL

    files = {"kernel_gemm": "kernel_gemm.json", "plan_time": "plan_time.json", "plan_time_domain": "plan_time_domain.npy",
             "stall": "stall.json"}
    (tmp_path / "metadata.json").write_text(json.dumps({"files": files}))  # saved before "file_kinds"
    assert bundle_files(tmp_path, BOOSTER) == [tmp_path / "kernel_gemm.json", tmp_path / "plan_time.json"]
    assert bundle_files(tmp_path, STALL) == [tmp_path / "stall.json"]
    assert bundle_files(tmp_path, DOMAIN_MATRIX) == [tmp_path / "plan_time_domain.npy"]
    shipped = json.loads((default_path() / "metadata.json").read_text())["file_kinds"]
    assert shipped["stall.json"] == STALL and all(shipped[p.name] == BOOSTER for p in bundle_files(default_path(), BOOSTER))
    with pytest.raises(ValueError, match="unknown bundle file kind"):
        bundle_files(tmp_path, "pickle")
