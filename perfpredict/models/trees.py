"""xgboost's tree ensembles evaluated in numpy, bit for bit as xgboost's own predict, without importing xgboost.

Why: importing xgboost (and the scipy it pulls in) cost a cold `perfpredict rank` more than all of its ranking
work, and loading ten boosters from JSON half a second more. A saved model is the booster's xgboost JSON (the
format of record) plus `<name>.trees.npz`: the same trees as flat arrays, written beside it at save time and read
in a few milliseconds. The npz carries the CRC-32 of the JSON it was made from; where they differ (a JSON replaced
by hand or by a merge) the JSON is read instead, so a stale export is never used.

Evaluation follows xgboost's CPU predictor (src/predictor/cpu_predictor.cc, src/tree/tree_model.h GetNext): a
float32 feature goes left when `x < split_condition` and to the default child when missing (NaN); the margin starts
at base_score and adds each tree's float32 leaf value in tree order, in float32. Rows that fall on the same side of
every split of the ensemble (the same rank among each feature's thresholds, the same missing pattern) reach the
same leaves, so each such group is evaluated once: plan frames hold thousands of rows that differ only in features
the trees never split finely."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TREES_SUFFIX = ".trees.npz"


def trees_path(json_path: Path | str) -> Path:
    """Where the numpy export of an xgboost JSON model lives: `kernel_gemm.json` -> `kernel_gemm.trees.npz`."""
    p = Path(json_path)
    return p.with_name(p.name.removesuffix(".json") + TREES_SUFFIX)


@dataclass(frozen=True)
class TreeEnsemble:
    """All trees of one single-output regression booster as flat node arrays (node i of tree t at roots[t] + i).

    Leaves point to themselves (left = right = own index) so every row can take the same number of steps."""

    base_score: np.float32
    roots: np.ndarray  # int32 [n_trees]: index of each tree's root
    feature: np.ndarray  # int32 [n_nodes]: split feature (0 at leaves)
    threshold: np.ndarray  # float32 [n_nodes]: split condition
    left: np.ndarray  # int32 [n_nodes]
    right: np.ndarray  # int32 [n_nodes]
    default_left: np.ndarray  # bool [n_nodes]: where a missing value goes
    value: np.ndarray  # float32 [n_nodes]: leaf value (split condition at leaves, as xgboost stores it)
    depth: int  # longest root-to-leaf path
    n_features: int
    source_crc32: int  # CRC-32 of the xgboost JSON these came from

    def __post_init__(self) -> None:
        n = len(self.feature)
        for name in ("threshold", "left", "right", "default_left", "value"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"tree arrays disagree: {name} has {len(getattr(self, name))} nodes, feature {n}")

    @classmethod
    def from_json_bytes(cls, raw: bytes) -> TreeEnsemble:
        """The trees of an xgboost JSON model (Booster.save_model / save_raw("json"))."""
        model = json.loads(raw)
        learner = model["learner"]
        obj = learner["objective"]["name"]
        if obj != "reg:squarederror":  # an identity link: the margin is the prediction
            raise ValueError(f"numpy trees support reg:squarederror models, not {obj}")
        params = learner["learner_model_param"]
        if int(params.get("num_target", "1")) != 1 or int(params.get("num_class", "0")) > 1:
            raise ValueError("numpy trees support single-output regression models")
        base = np.float32(float(params["base_score"].strip("[]")))
        booster = learner["gradient_booster"]
        if booster["name"] != "gbtree":
            raise ValueError(f"numpy trees support gbtree boosters, not {booster['name']}")
        trees = booster["model"]["trees"]
        roots, feats, thr, lefts, rights, dleft, depth = [], [], [], [], [], [], 0
        offset = 0
        for t in trees:
            if any(t.get("split_type", [])) or t.get("categories"):
                raise ValueError("numpy trees do not support categorical splits")
            left = np.asarray(t["left_children"], dtype=np.int64)
            right = np.asarray(t["right_children"], dtype=np.int64)
            leaf = left == -1
            own = np.arange(len(left), dtype=np.int64)
            roots.append(offset)
            lefts.append(np.where(leaf, own, left) + offset)
            rights.append(np.where(leaf, own, right) + offset)
            feats.append(np.where(leaf, 0, np.asarray(t["split_indices"], dtype=np.int64)))
            thr.append(np.asarray(t["split_conditions"], dtype=np.float64).astype(np.float32))
            dleft.append(np.asarray(t["default_left"], dtype=bool))
            depth = max(depth, _depth(left, right))
            offset += len(left)
        threshold = _cat(thr, np.float32)
        return cls(base_score=base, roots=np.asarray(roots, dtype=np.int32), feature=_cat(feats, np.int32),
                   threshold=threshold, left=_cat(lefts, np.int32), right=_cat(rights, np.int32),
                   default_left=_cat(dleft, bool), value=threshold.copy(), depth=depth,
                   n_features=int(params["num_feature"]), source_crc32=zlib.crc32(raw))

    def save(self, path: Path | str) -> None:
        np.savez(path, base_score=np.asarray([self.base_score], dtype=np.float32), roots=self.roots,
                 feature=self.feature, threshold=self.threshold, left=self.left, right=self.right,
                 default_left=self.default_left,  # leaf values are the leaves' split conditions, as in the JSON
                 meta=np.asarray([self.depth, self.n_features, self.source_crc32], dtype=np.int64))

    @classmethod
    def load(cls, path: Path | str) -> TreeEnsemble:
        with np.load(path, allow_pickle=False) as z:
            depth, n_features, crc = (int(v) for v in z["meta"])
            return cls(base_score=np.float32(z["base_score"][0]), roots=z["roots"], feature=z["feature"],
                       threshold=z["threshold"], left=z["left"], right=z["right"], default_left=z["default_left"],
                       value=z["threshold"], depth=depth, n_features=n_features, source_crc32=crc)

    @classmethod
    def for_model(cls, json_path: Path | str) -> TreeEnsemble:
        """The trees of a saved xgboost JSON model: its npz export where that was made from this very JSON, else
        the JSON itself (slower, same numbers)."""
        raw = Path(json_path).read_bytes()
        npz = trees_path(json_path)
        if npz.exists():
            trees = cls.load(npz)
            if trees.source_crc32 == zlib.crc32(raw):
                return trees
        return cls.from_json_bytes(raw)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """float32 predictions, equal to xgboost's inplace_predict on the same float32 matrix."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected a matrix of {self.n_features} features, got shape {X.shape}")
        if len(X) == 0 or not len(self.roots):
            return np.full(len(X), self.base_score, dtype=np.float32)
        first, inverse = _distinct_rows(X)
        return self._predict_rows(X[first])[inverse]

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        n, n_trees = len(X), len(self.roots)
        flat = X.ravel()
        row_base = (np.arange(n, dtype=np.int64) * self.n_features)[:, None]
        missing = bool(np.isnan(flat).any())
        child = self._children()
        leaves = np.empty((n, n_trees), dtype=np.float32)
        # A block of trees at a time keeps the node arrays in cache (3x faster than all 300 at once).
        for s in range(0, n_trees, TREE_BLOCK):
            node = np.broadcast_to(self.roots[s:s + TREE_BLOCK], (n, min(TREE_BLOCK, n_trees - s))).copy()
            for _ in range(self.depth):
                x = flat.take(row_base + self.feature.take(node))
                right = x >= self.threshold.take(node)  # not (x < split): a NaN compares False both ways
                if missing:
                    right |= np.isnan(x) & ~self.default_left.take(node)
                node = child.take(node * 2 + right)
            leaves[:, s:s + TREE_BLOCK] = self.value.take(node)
        out = np.full(n, self.base_score, dtype=np.float32)
        for t in range(n_trees):  # tree by tree, in float32, as xgboost accumulates
            out += leaves[:, t]
        return out

    def _children(self) -> np.ndarray:
        """left and right interleaved (node 2i: left, 2i+1: right): one gather per step."""
        child = np.empty(2 * len(self.left), dtype=self.left.dtype)
        child[0::2], child[1::2] = self.left, self.right
        return child


TREE_BLOCK = 64


def _distinct_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First index of each distinct row and every row's distinct-row index (identical rows reach identical leaves:
    plan frames repeat feature rows that differ only in columns the model does not read)."""
    if len(X) < 2:
        return np.arange(len(X)), np.arange(len(X))
    rows = np.ascontiguousarray(X).view(np.dtype((np.void, X.dtype.itemsize * X.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


def _depth(left: np.ndarray, right: np.ndarray) -> int:
    """Longest root-to-leaf path (edges) of one tree in xgboost's child arrays (-1 at leaves)."""
    depth, level = 0, [0]
    while True:
        nxt = [c for i in level for c in (left[i], right[i]) if c != -1]
        if not nxt:
            return depth
        depth, level = depth + 1, nxt


def export_folder(folder: Path | str) -> list[Path]:
    """Write (or refresh) the trees of every xgboost JSON model under `folder` beside it; the exports written.
    For bundles saved before the exports existed: `python -m perfpredict.models.trees FOLDER`."""
    out = []
    for p in sorted(Path(folder).rglob("*.json")):
        raw = p.read_bytes()
        if b'"learner"' not in raw[:200] and b'"gradient_booster"' not in raw:
            continue  # metadata, not a booster
        TreeEnsemble.from_json_bytes(raw).save(trees_path(p))
        out.append(trees_path(p))
    return out


if __name__ == "__main__":
    import sys

    for written in export_folder(sys.argv[1]):
        print(written)
