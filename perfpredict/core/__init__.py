"""Scenario model: model shape, cluster, workload, plan; catalogs of GPUs and models."""

from perfpredict.core.catalog import get_gpu, get_model, gpu_catalog, model_catalog
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.hardware import Cluster, GPUSpec
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import Scenario
from perfpredict.core.workload import Workload

__all__ = ["Cluster", "GPUSpec", "ModelSpec", "PerfPredictError", "Plan", "Scenario", "Workload",
           "get_gpu", "get_model", "gpu_catalog", "model_catalog"]
