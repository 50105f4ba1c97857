"""LAB-ONLY hand-made replay of vLLM 0.11's metadata and registry; see pyproject.toml."""

from vllm.model_executor.models import ModelRegistry

__version__ = "0.11.0+lab.replay"
__all__ = ["ModelRegistry", "__version__"]
