"""`vllm --version` of the hand-made replay; anything else says what this package is."""

import sys

from vllm import __version__


def main():
    if sys.argv[1:] in (["--version"], ["-v"]):
        print(__version__)
        return 0
    print("LAB-ONLY replay of vLLM 0.11's metadata and registry (dgx_spark.vllm lab); it serves nothing")
    return 2
