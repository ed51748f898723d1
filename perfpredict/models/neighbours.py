"""Exact nearest neighbours in numpy, for the corrections' applicability distance (models.plan_model).

Why not scipy's cKDTree: importing scipy.spatial cost a cold `perfpredict rank` close to a second, and in 30-35
standardised dimensions a k-d tree prunes little (it took 0.3 s for 15,000 plans); the training sets hold a few
thousand rows, so brute force over a matrix product is as fast. Distances are exact: the product only picks
candidates, whose Euclidean distances are then computed from the differences themselves (equal to cKDTree's to
rounding). `outside` bounds a row's distance to every training row from below by its distance to their bounding
box, so a plan far from all of them needs no search at all."""

from __future__ import annotations

import numpy as np

EXTRA_CANDIDATES = 8  # beyond k, against the product's rounding (it only ranks; the distances are recomputed)
CHUNK_CELLS = 1 << 22  # query rows x training rows per block (32 MiB of float64)


class Neighbours:
    """The subset of scipy.spatial.cKDTree that plan_model uses: `n`, `data`, `query(x, k)`."""

    def __init__(self, data: np.ndarray):
        self.data = np.asarray(data, dtype=float)
        if self.data.ndim != 2:
            raise ValueError(f"neighbours need a 2-D matrix, got shape {self.data.shape}")
        self.n = len(self.data)
        self._sq = np.einsum("ij,ij->i", self.data, self.data)
        self._lo = self.data.min(axis=0) if self.n else None
        self._hi = self.data.max(axis=0) if self.n else None

    def query(self, x: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Distances to the k nearest rows, ascending, and their indices (cKDTree.query's shapes: 1-D for k=1)."""
        x = np.atleast_2d(np.asarray(x, dtype=float))
        if not 1 <= k <= self.n:
            raise ValueError(f"k must be in 1..{self.n}, got {k}")
        dist = np.empty((len(x), k))
        idx = np.empty((len(x), k), dtype=np.int64)
        step = max(1, CHUNK_CELLS // max(self.n, 1))
        for s in range(0, len(x), step):
            dist[s:s + step], idx[s:s + step] = self._block(x[s:s + step], k)
        return (dist[:, 0], idx[:, 0]) if k == 1 else (dist, idx)

    def _block(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        approx = np.einsum("ij,ij->i", q, q)[:, None] + self._sq[None, :] - 2.0 * (q @ self.data.T)
        m = min(self.n, k + EXTRA_CANDIDATES)
        cand = np.argpartition(approx, m - 1, axis=1)[:, :m] if m < self.n else np.broadcast_to(
            np.arange(self.n), (len(q), self.n))
        exact = np.sqrt(((q[:, None, :] - self.data[cand]) ** 2).sum(axis=2))
        order = np.argsort(exact, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(exact, order, axis=1), np.take_along_axis(cand, order, axis=1)

    def outside(self, x: np.ndarray, radius: float) -> np.ndarray:
        """Rows certainly farther than `radius` from every training row (their distance to the training rows'
        bounding box is already at least that)."""
        x = np.atleast_2d(np.asarray(x, dtype=float))
        if not self.n:
            return np.ones(len(x), dtype=bool)
        # The same operations as max(lo - x, 0) + max(x - hi, 0), squared, in place: a ranking asks this of every
        # plan, and each temporary of a plans x features matrix cost as much as the arithmetic.
        gap = self._lo - x
        np.maximum(gap, 0.0, out=gap)
        above = x - self._hi
        np.maximum(above, 0.0, out=above)
        gap += above
        gap *= gap
        return np.sqrt(gap.sum(axis=1)) >= radius
