"""Version of the lab stand-in; set at build time by setup.py (source tree: donor)."""

try:
    from vllm._lab_build import VARIANT, VERSION
except ImportError:  # running from the source tree
    VARIANT, VERSION = "donor", "0.33.0+lab.standin"

__version__ = VERSION
BANNER = "vLLM LAB STAND-IN %s (dgx_spark.vllm lab; not vLLM, serves no real model)" % VERSION
__all__ = ["BANNER", "VARIANT", "VERSION", "__version__"]
