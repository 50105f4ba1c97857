"""General plugins, as in vLLM: entry points in group vllm.general_plugins run once at start."""

from importlib.metadata import entry_points

_LOADED = False


def load_general_plugins():
    global _LOADED  # noqa: PLW0603 - once per process, as vLLM does
    if _LOADED:
        return
    _LOADED = True
    eps = entry_points()
    group = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") else eps.get("vllm.general_plugins", [])
    for ep in group:
        ep.load()()
