"""LAB STAND-IN for vLLM (dgx_spark.vllm lab). It serves no real model.

It mirrors the parts of vLLM the collection relies on: `vllm serve`, the model registry, the
Ray placement group of TP x PP workers, and the OpenAI-compatible HTTP endpoints.
"""

from vllm.model_executor.models.registry import ModelRegistry
from vllm.version import VARIANT, __version__

STAND_IN = True
__all__ = ["STAND_IN", "VARIANT", "ModelRegistry", "__version__"]
