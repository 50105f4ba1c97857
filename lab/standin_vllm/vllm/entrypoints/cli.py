"""`vllm serve MODEL [options]`: the flags the collection emits, with vLLM's names.

Unknown flags are rejected by argparse, as vLLM's parser does.
"""

import argparse
import sys

from vllm.version import BANNER, __version__


def build_parser():
    parser = argparse.ArgumentParser(prog="vllm", description=BANNER)
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="subparser", required=True)
    serve = sub.add_parser("serve", help="Start the (stand-in) OpenAI-compatible server.", prog="vllm serve")
    serve.add_argument("model_tag", metavar="MODEL", help="Model directory (the stand-in loads local models only).")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    serve.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--trust-remote-code", action="store_true")
    serve.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    serve.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
    )
    serve.add_argument("--quantization", "-q", default=None)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--load-format", default="auto")
    serve.add_argument("--download-dir", default=None)
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    serve.add_argument("--enable-expert-parallel", action="store_true")
    serve.add_argument("--reasoning-parser", default=None)
    serve.add_argument("--enable-auto-tool-choice", action="store_true")
    serve.add_argument("--tool-call-parser", default=None)
    serve.add_argument("--uvicorn-log-level", default="info")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.subparser == "serve":
        from vllm.entrypoints.server import serve  # noqa: PLC0415 - Ray is imported only to serve

        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
