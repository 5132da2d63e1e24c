"""The batched engine (continuous batching, paged KV, the three batching mechanisms): BatchEngine."""
from .adaptive import StepCostTable
from .config import BatchConfig
from .engine import BatchEngine
from .request import BatchResult, Request

__all__ = ["BatchConfig", "BatchEngine", "BatchResult", "Request", "StepCostTable"]
