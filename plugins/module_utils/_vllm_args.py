# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`vllm serve` command line, its flag checks and its hash (private; used by vllm_serve).

Flags this collection emits, each checked against vLLM's upstream argument parser:

| emitted                              | upstream source                                                        |
| ------------------------------------ | ---------------------------------------------------------------------- |
| vllm serve MODEL (positional)        | entrypoints/openai/cli_args.py make_arg_parser: `model_tag`, nargs="?" |
| --served-model-name NAME             | engine/arg_utils.py, ModelConfig.served_model_name (nargs="+")         |
| --tensor-parallel-size N             | engine/arg_utils.py, ParallelConfig.tensor_parallel_size (-tp)         |
| --pipeline-parallel-size N           | engine/arg_utils.py, ParallelConfig.pipeline_parallel_size (-pp)       |
| --distributed-executor-backend ray   | engine/arg_utils.py, ParallelConfig.distributed_executor_backend       |
| --host H, --port N                   | entrypoints/openai/cli_args.py, FrontendArgs.host / .port              |
| --max-model-len N                    | engine/arg_utils.py, ModelConfig.max_model_len                         |
| --gpu-memory-utilization F           | engine/arg_utils.py, CacheConfig.gpu_memory_utilization                |
| (API key) env VLLM_API_KEY           | envs.py VLLM_API_KEY; api_server uses `args.api_key or [VLLM_API_KEY]` |

The API key goes through the environment, never argv, so `ps` and the process list do not show it.

Placement: the env VLLM_DISTRIBUTED_EXECUTOR_CONFIG
(`{"placement_group_options": {"strategy": "SPREAD"}}`) is what the DGX Spark community recipes set.
Upstream vLLM's envs.py does not define it, and upstream's Ray executor (v1/executor/ray_utils.py,
initialize_ray_cluster) creates its placement group with strategy PACK unless the driver already runs
inside a placement group; PACK still spreads when one node cannot hold every bundle (one GPU per
Spark). The variable is set for images that honour it (community builds, the lab's stand-in
engine) and is harmless elsewhere.
"""

from __future__ import annotations

import hashlib
import json

PLACEMENT_ENV = "VLLM_DISTRIBUTED_EXECUTOR_CONFIG"
API_KEY_ENV = "VLLM_API_KEY"

# Flags the module sets from its own options: refused in extra_args (vLLM would take the last one
# silently, so a profile could say TP=2 while extra args say TP=1).
MANAGED_FLAGS = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--distributed-executor-backend": "(always ray)",
    "--host": "host",
    "--port": "port",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--api-key": "api_key",
}

# Upstream `vllm serve` flags accepted in extra_args when the installed engine's own parser cannot
# be asked (see INSTALLED_FLAGS_SCRIPT). Names from entrypoints/openai/cli_args.py (FrontendArgs,
# make_arg_parser) and engine/arg_utils.py (EngineArgs.add_cli_args); boolean fields also have
# their --no- form upstream (argparse BooleanOptionalAction).
KNOWN_FLAGS = frozenset(
    (
        "--allow-credentials",
        "--allowed-headers",
        "--allowed-local-media-path",
        "--allowed-methods",
        "--allowed-origins",
        "--async-scheduling",
        "--block-size",
        "--calculate-kv-scales",
        "--chat-template",
        "--chat-template-content-format",
        "--code-revision",
        "--collect-detailed-traces",
        "--compilation-config",
        "--config",
        "--config-format",
        "--cpu-offload-gb",
        "--data-parallel-size",
        "--default-chat-template-kwargs",
        "--disable-custom-all-reduce",
        "--disable-fastapi-docs",
        "--disable-log-requests",
        "--disable-log-stats",
        "--disable-sliding-window",
        "--disable-uvicorn-access-log",
        "--download-dir",
        "--dtype",
        "--enable-auto-tool-choice",
        "--enable-chunked-prefill",
        "--enable-expert-parallel",
        "--enable-log-outputs",
        "--enable-log-requests",
        "--enable-lora",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-request-id-headers",
        "--enable-sleep-mode",
        "--enforce-eager",
        "--generation-config",
        "--guided-decoding-backend",
        "--hf-config-path",
        "--hf-overrides",
        "--hf-token",
        "--kv-cache-dtype",
        "--kv-cache-memory-bytes",
        "--language-model-only",
        "--limit-mm-per-prompt",
        "--load-format",
        "--logprobs-mode",
        "--lora-modules",
        "--max-log-len",
        "--max-logprobs",
        "--max-lora-rank",
        "--max-loras",
        "--max-num-batched-tokens",
        "--max-num-partial-prefills",
        "--max-num-seqs",
        "--max-seq-len-to-capture",
        "--middleware",
        "--mm-encoder-tp-mode",
        "--model-impl",
        "--num-gpu-blocks-override",
        "--otlp-traces-endpoint",
        "--override-generation-config",
        "--preemption-mode",
        "--quantization",
        "--reasoning-parser",
        "--response-role",
        "--return-tokens-as-token-ids",
        "--revision",
        "--root-path",
        "--safetensors-load-strategy",
        "--scheduling-policy",
        "--seed",
        "--skip-tokenizer-init",
        "--speculative-config",
        "--ssl-ca-certs",
        "--ssl-certfile",
        "--ssl-keyfile",
        "--structured-outputs-config",
        "--swap-space",
        "--tokenizer",
        "--tokenizer-mode",
        "--tokenizer-revision",
        "--tool-call-parser",
        "--tool-parser-plugin",
        "--trust-remote-code",
        "--uvicorn-log-level",
        "-O",
        "-dp",
        "-q",
    )
)

# Runs inside the head container: prints the option strings of the installed vLLM's serve parser
# as JSON, or exits 3 when that parser cannot be built (an engine without vLLM's CLI module).
INSTALLED_FLAGS_SCRIPT = (
    "import json, sys\n"
    "try:\n"
    "    from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
    "    try:\n"
    "        from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "    except ImportError:\n"
    "        from vllm.utils import FlexibleArgumentParser\n"
    "    parser = make_arg_parser(FlexibleArgumentParser())\n"
    "except Exception as exc:\n"
    "    print(type(exc).__name__, exc)\n"
    "    sys.exit(3)\n"
    "print(json.dumps(sorted(s for a in parser._actions for s in a.option_strings)))\n"
)


def flag_names(args):
    """The option names used in a list of arguments ('--x=1' gives '--x'); values are skipped."""
    names = []
    for arg in args:
        if arg.startswith("-") and not _is_number(arg):
            names.append(arg.split("=", 1)[0])
    return names


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_extra_args(extra_args, known=None):
    """Return a list of problems with extra_args: managed flags and unknown flags."""
    known = KNOWN_FLAGS if known is None else known
    problems = []
    for name in flag_names(extra_args):
        if name == "--hf-token":
            # A token on the command line reaches ps, the result and the diff.
            problems.append("extra_args: --hf-token puts the token on the command line; set it as HF_TOKEN in env")
            continue
        if name in MANAGED_FLAGS:
            problems.append(
                "extra_args: %s is set by this module; use the option %s instead" % (name, MANAGED_FLAGS[name])
            )
            continue
        base = "--" + name[5:] if name.startswith("--no-") else name
        if name not in known and base not in known:
            problems.append("extra_args: %s is not a flag of vllm serve; remove it or correct its spelling" % name)
    for arg in extra_args:
        if arg in ("", "\\") or "\n" in arg:
            problems.append("extra_args: %r looks like a shell line fragment; give one argument per list item" % arg)
    return problems


def serve_argv(p):
    """The `vllm serve` argument list from the module parameters (no secrets)."""
    argv = [
        "vllm",
        "serve",
        p["model"],
        "--served-model-name",
        p["served_model_name"],
        "--tensor-parallel-size",
        str(p["tensor_parallel_size"]),
        "--pipeline-parallel-size",
        str(p["pipeline_parallel_size"]),
        "--distributed-executor-backend",
        "ray",
        "--host",
        p["host"],
        "--port",
        str(p["port"]),
    ]
    if p.get("max_model_len"):
        argv += ["--max-model-len", str(p["max_model_len"])]
    if p.get("gpu_memory_utilization") is not None:
        argv += ["--gpu-memory-utilization", _float_text(p["gpu_memory_utilization"])]
    argv += list(p.get("extra_args") or [])
    return argv


def _float_text(value):
    return ("%.4f" % float(value)).rstrip("0").rstrip(".")


def serve_env(p):
    """Environment of the serve process, secrets included (never logged: see args_hash)."""
    env = {str(k): str(v) for k, v in (p.get("env") or {}).items()}
    if p.get("placement_strategy") and p["placement_strategy"] != "none":
        env[PLACEMENT_ENV] = json.dumps(
            {"placement_group_options": {"strategy": p["placement_strategy"]}}, separators=(",", ":")
        )
    if p.get("api_key"):
        env[API_KEY_ENV] = p["api_key"]
    return env


def args_hash(argv, env):
    """Hash of everything that defines the serve process; the key enters only as its own hash."""
    safe_env = dict(env)
    if API_KEY_ENV in safe_env:
        safe_env[API_KEY_ENV] = "sha256:" + hashlib.sha256(safe_env[API_KEY_ENV].encode("utf-8")).hexdigest()
    blob = json.dumps({"argv": argv, "env": safe_env}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def redacted_env(env):
    return {k: ("********" if k == API_KEY_ENV else v) for k, v in env.items()}
