"""The measuring machine as the rest of perfpredict names it: a catalog cluster of `world` of its devices, and the
dataset folder its rows go to (datasets/ours/<hardware short hash>)."""

from __future__ import annotations

from pathlib import Path

from perfpredict.collect import fingerprint as fpr
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import Cluster


def cluster_for(world: int) -> Cluster:
    """The measuring machine as a catalog cluster: GPU catalog entry "cpu" (or the GPU's), `world` devices."""
    from perfpredict.core.catalog import get_gpu

    name = fpr.hardware_name()
    try:
        return Cluster(gpu=get_gpu(name), gpus_per_node=world, nodes=1)
    except PerfPredictError:
        raise PerfPredictError(f"the GPU catalog has no entry {name!r} for this machine; add "
                               f"perfpredict/catalog/gpus/{name}.json before collecting") from None


def default_out(root: Path | str = "datasets/ours") -> Path:
    return Path(root) / fpr.short_hash()
