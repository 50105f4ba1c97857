# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`vllm serve` command line, its flag checks and its hash (private; used by vllm_serve).

Flags this collection emits, each checked against vLLM's upstream argument parser (and, at run time,
against the installed engine's own `vllm serve --help=all`: see INSTALLED_FLAGS_SCRIPT):

| emitted                              | upstream source                                                        |
| ------------------------------------ | ---------------------------------------------------------------------- |
| vllm serve MODEL (positional)        | the serve parser's `model_tag`, nargs="?" (its cli_args.py moves)      |
| --served-model-name NAME             | engine/arg_utils.py, ModelConfig.served_model_name (nargs="+")         |
| --tensor-parallel-size N             | engine/arg_utils.py, ParallelConfig.tensor_parallel_size (-tp)         |
| --pipeline-parallel-size N           | engine/arg_utils.py, ParallelConfig.pipeline_parallel_size (-pp)       |
| --distributed-executor-backend ray|mp | engine/arg_utils.py, ParallelConfig.distributed_executor_backend      |
| --nnodes N, --node-rank R (mp)       | engine/arg_utils.py, ParallelConfig.nnodes / .node_rank (-n, -r)       |
| --master-addr A, --master-port P (mp)| engine/arg_utils.py, ParallelConfig.master_addr / .master_port         |
| --headless (mp, ranks above 0)       | the serve parser (cli_args.py); entrypoints/cli/serve.py: no API server |
| --host H, --port N                   | FrontendArgs.host / .port (cli_args.py, beside the serve parser)       |
| --max-model-len N                    | engine/arg_utils.py, ModelConfig.max_model_len                         |
| --gpu-memory-utilization F           | engine/arg_utils.py, CacheConfig.gpu_memory_utilization                |
| (API key) env VLLM_API_KEY           | envs.py VLLM_API_KEY; api_server uses `args.api_key or [VLLM_API_KEY]` |

Where the serve parser lives moves between releases (0.17 and 0.25: entrypoints/openai/cli_args.py,
0.32: entrypoints/launchers/cli_args.py, 0.33: entrypoints/common/cli_args.py), so the engine is asked
through its CLI's help (`python3 -m vllm.entrypoints.cli.main serve --help=all`, which works in all
four), never through an import path.
Flag names are read as vLLM's FlexibleArgumentParser (utils/argparse_utils.py) reads them: see flag_uses.

The API key goes through the environment, never argv, so `ps` and the process list do not show it.

Placement: the env VLLM_DISTRIBUTED_EXECUTOR_CONFIG
(`{"placement_group_options": {"strategy": "SPREAD"}}`) is what the DGX Spark community recipes set.
Upstream vLLM's envs.py does not define it, and upstream's Ray executor (v1/executor/ray_utils.py,
initialize_ray_cluster) creates its placement group with strategy PACK unless the driver already runs
inside a placement group; PACK still spreads when one node cannot hold every bundle (one GPU per
Spark). The variable is set for images that honour it (community builds) and is harmless
elsewhere.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re

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
    "--distributed-executor-backend": "backend",
    "--nnodes": "(from the inventory's spark group)",
    "-n": "(from the inventory's spark group)",
    "--node-rank": "(from the inventory's spark group)",
    "-r": "(from the inventory's spark group)",
    "--master-addr": "(the head's fabric address)",
    "--master-port": "(vllm_server_mp_port)",
    "--headless": "(set on every node but the head)",
    "--host": "host",
    "--port": "port",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--device-memory-utilization": "gpu_memory_utilization",
    "--api-key": "api_key",
}

# Flags serve_argv emits: an engine's answer that lacks any of them is not a usable answer.
EMITTED_FLAGS = (
    "--served-model-name",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--distributed-executor-backend",
    "--host",
    "--port",
    "--max-model-len",
    "--gpu-memory-utilization",
)

# The name users give the extra arguments (the vllm_server role's variable), used in every refusal.
EXTRA_ARGS_VAR = "vllm_server_extra_args"

# vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, 0.17 to 0.33) rewrites -O<level>,
# -O=<level> and `-O <0..3>` to --optimization-level before argparse sees them.
OPTIMIZATION_FLAG = "--optimization-level"
OPTIMIZATION_LEVELS = ("0", "1", "2", "3")

# The built-in table: every option string `vllm serve` of vLLM 0.33.0 accepts, parsed with
# parse_help_flags from its real `vllm serve --help=all` (tests/unit/fixtures/vllm_help/0.33.0.txt;
# a unit test holds the two equal). Used only with flag_source=builtin, and for a warning while the
# check is deferred; regenerate it from the newest release's help when that release is the target.
BUILTIN_TABLE_RELEASE = "0.33.0"
_BUILTIN_TABLE_TEXT = """
--additional-config --aggregate-engine-logging --all2all-backend --allow-credentials
--allow-deprecated-quantization --allowed-headers --allowed-local-media-path --allowed-media-domains
--allowed-methods --allowed-origins --anthropic-disabled-thinking-effort --api-key
--api-server-count --async-scheduling --attention-backend --attention-config --aux-output-config
--block-size --chat-template --chat-template-content-format --code-revision --cohere-format
--cohere-is-reasoning-model --collect-detailed-traces --compilation-config --config --config-format
--convert --cp-kv-cache-interleave-size --cpu-distributed-timeout-seconds --cpu-offload-gb
--cpu-offload-params --cudagraph-capture-sizes --cudagraph-metrics --custom-histogram-buckets
--data-parallel-address --data-parallel-backend --data-parallel-external-lb
--data-parallel-hybrid-lb --data-parallel-multi-port-external-lb --data-parallel-rank
--data-parallel-rpc-port --data-parallel-size --data-parallel-size-local --data-parallel-start-rank
--data-parallel-supervisor-port --dbo-decode-token-threshold --dbo-prefill-token-threshold
--dcp-comm-backend --dcp-kv-cache-interleave-size --dcp-q-replicate --decode-context-parallel-size
--default-chat-template-kwargs --default-mm-loras --device-ids --device-memory-utilization
--diffusion-config --disable-access-log-for-endpoints --disable-auto-tool-choice
--disable-batch-sharded-sampling --disable-cascade-attn --disable-chunked-mm-input
--disable-chunked-prefill --disable-cumem-allocator --disable-custom-all-reduce --disable-dbo
--disable-elastic-ep --disable-ep-weight-filter --disable-eplb --disable-expert-parallel
--disable-fastapi-docs --disable-fault-tolerance --disable-flash-late-interaction
--disable-flashinfer-autotune --disable-force-include-usage --disable-hc-sp
--disable-hybrid-kv-cache-manager --disable-layerwise-nvtx-tracing --disable-log-deltas
--disable-log-outputs --disable-log-requests --disable-log-stats --disable-logging-iteration-details
--disable-lora --disable-mamba-cache-stochastic-rounding --disable-mamba-shared-prefix-checkpoint
--disable-mfu-metrics --disable-mixed-moe-lora-format --disable-mm-embeds --disable-moe-shared-loras
--disable-nccl-comm-suspend --disable-nccl-for-dp-synchronization --disable-offline-docs
--disable-per-request-metrics --disable-prefix-caching --disable-prompt-embeds
--disable-prompt-tokens-details --disable-request-id-headers --disable-return-routed-experts
--disable-scale-out --disable-server-load-tracking --disable-shm-tensor-arena --disable-sleep-mode
--disable-sliding-window --disable-ssl-refresh --disable-tokenizer-info-endpoint
--disable-tower-connector-lora --disable-trace-replay --disable-uvicorn-access-log
--distributed-executor-backend --distributed-timeout-seconds --download-dir
--dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s
--dp-supervisor-probe-timeout-s --dp-sync-interval --dtype --ec-manager-config --ec-transfer-config
--elastic-ep-max-dp-size --enable-auto-tool-choice --enable-batch-sharded-sampling
--enable-cascade-attn --enable-chunked-mm-input --enable-chunked-prefill --enable-cumem-allocator
--enable-custom-all-reduce --enable-dbo --enable-elastic-ep --enable-ep-weight-filter --enable-eplb
--enable-expert-parallel --enable-fastapi-docs --enable-fault-tolerance
--enable-flash-late-interaction --enable-flashinfer-autotune --enable-force-include-usage
--enable-hc-sp --enable-hybrid-kv-cache-manager --enable-layerwise-nvtx-tracing --enable-log-deltas
--enable-log-outputs --enable-log-requests --enable-logging-iteration-details --enable-lora
--enable-mamba-cache-stochastic-rounding --enable-mamba-shared-prefix-checkpoint
--enable-mfu-metrics --enable-mixed-moe-lora-format --enable-mm-embeds --enable-moe-shared-loras
--enable-nccl-comm-suspend --enable-nccl-for-dp-synchronization --enable-offline-docs
--enable-per-request-metrics --enable-prefix-caching --enable-prompt-embeds
--enable-prompt-tokens-details --enable-request-id-headers --enable-return-routed-experts
--enable-scale-out --enable-server-load-tracking --enable-shm-tensor-arena --enable-sleep-mode
--enable-sliding-window --enable-ssl-refresh --enable-tokenizer-info-endpoint
--enable-tower-connector-lora --enable-trace-replay --enable-uvicorn-access-log --enforce-eager
--engram-config --eplb-config --exclude-tools-when-tool-choice-none --expert-placement-strategy
--fail-on-environ-validation --fault-tolerance-config --fingerprint-mode --fingerprint-value
--fully-sharded-loras --gdn-prefill-backend --generation-config --gpu-memory-utilization --grpc
--grpc-port --h11-max-header-count --h11-max-incomplete-event-size --headless --help
--hf-config-path --hf-overrides --hf-token --host --ignore-patterns --interleave-mm-strings
--io-processor-plugin --ir-op-priority --jit-monitor-mode --jit-monitor-verbose --kda-decode-backend
--kda-prefill-backend --kernel-config --kv-cache-dtype --kv-cache-dtype-skip-layers
--kv-cache-memory-bytes --kv-cache-metrics --kv-cache-metrics-sample --kv-events-config
--kv-offloading-backend --kv-offloading-size --kv-sharing-fast-prefill --kv-transfer-config
--language-model-only --limit-mm-per-prompt --linear-backend --load-format --log-config-file
--log-error-stack --log-level --logging-config --logits-processors --logprobs-mode
--long-prefill-token-threshold --long-prefill-token-threshold-adaptive --lora-dtype --lora-modules
--lora-target-modules --mamba-backend --mamba-block-size --mamba-cache-dtype --mamba-cache-mode
--mamba-cache-philox-rounds --mamba-ssm-cache-dtype --mamba-ssu-algorithm --master-addr
--master-port --max-cpu-loras --max-cudagraph-capture-size --max-log-len --max-logprobs
--max-lora-cls-labels --max-lora-rank --max-loras --max-model-len --max-num-active-seqs
--max-num-batched-tokens --max-num-queued-reqs --max-num-queued-tokens --max-num-scheduled-tokens
--max-num-seqs --max-parallel-loading-workers --media-io-kwargs --middleware
--mm-device-do-normalize --mm-encoder-attn-backend --mm-encoder-attn-dtype
--mm-encoder-fp8-scale-path --mm-encoder-fp8-scale-save-margin --mm-encoder-fp8-scale-save-path
--mm-encoder-only --mm-encoder-tp-mode --mm-hasher-algorithm --mm-ipc-gpu-memory-gb
--mm-processor-cache-gb --mm-processor-cache-type --mm-processor-device --mm-processor-kwargs
--mm-shm-cache-max-object-size-mb --mm-tensor-ipc --model --model-class-overrides --model-impl
--model-loader-extra-config --moe-backend --monokernel --nnodes --no-allow-credentials
--no-allow-deprecated-quantization --no-async-scheduling --no-cohere-is-reasoning-model
--no-cudagraph-metrics --no-data-parallel-external-lb --no-data-parallel-hybrid-lb
--no-dcp-q-replicate --no-disable-cascade-attn --no-disable-chunked-mm-input
--no-disable-custom-all-reduce --no-disable-fastapi-docs --no-disable-hybrid-kv-cache-manager
--no-disable-nccl-for-dp-synchronization --no-disable-sliding-window --no-disable-uvicorn-access-log
--no-enable-auto-tool-choice --no-enable-batch-sharded-sampling --no-enable-chunked-prefill
--no-enable-cumem-allocator --no-enable-dbo --no-enable-elastic-ep --no-enable-ep-weight-filter
--no-enable-eplb --no-enable-expert-parallel --no-enable-fault-tolerance
--no-enable-flash-late-interaction --no-enable-flashinfer-autotune --no-enable-force-include-usage
--no-enable-hc-sp --no-enable-layerwise-nvtx-tracing --no-enable-log-deltas --no-enable-log-outputs
--no-enable-log-requests --no-enable-logging-iteration-details --no-enable-lora
--no-enable-mamba-cache-stochastic-rounding --no-enable-mamba-shared-prefix-checkpoint
--no-enable-mfu-metrics --no-enable-mixed-moe-lora-format --no-enable-mm-embeds
--no-enable-moe-shared-loras --no-enable-nccl-comm-suspend --no-enable-offline-docs
--no-enable-per-request-metrics --no-enable-prefix-caching --no-enable-prompt-embeds
--no-enable-prompt-tokens-details --no-enable-request-id-headers --no-enable-return-routed-experts
--no-enable-scale-out --no-enable-server-load-tracking --no-enable-shm-tensor-arena
--no-enable-sleep-mode --no-enable-ssl-refresh --no-enable-tokenizer-info-endpoint
--no-enable-tower-connector-lora --no-enable-trace-replay --no-enforce-eager
--no-exclude-tools-when-tool-choice-none --no-fail-on-environ-validation --no-fully-sharded-loras
--no-interleave-mm-strings --no-jit-monitor-verbose --no-kv-cache-metrics
--no-kv-sharing-fast-prefill --no-language-model-only --no-log-error-stack
--no-long-prefill-token-threshold-adaptive --no-mm-device-do-normalize --no-mm-encoder-only
--no-monokernel --no-numa-bind --no-ray-workers-use-nsight --no-return-sampling-mask
--no-return-tokens-as-token-ids --no-scheduler-reserve-full-isl --no-skip-mm-profiling
--no-skip-tokenizer-init --no-sleep-mode-offload-cudagraph --no-specialize-active-lora
--no-swa-bounded-replay --no-tokens-only --no-trust-remote-code --no-trust-request-chat-template
--no-trust-request-mm-kwargs --no-use-fp64-gumbel --no-use-replayssm --no-use-tqdm-on-load
--node-rank --num-gpu-blocks-override --numa-bind --numa-bind-cpus --numa-bind-nodes
--offload-backend --offload-group-size --offload-num-in-group --offload-params
--offload-prefetch-step --optimization-level --otlp-traces-endpoint --override-generation-config
--per-request-spec-decode-metrics --performance-mode --pipeline-parallel-size --pooler-config --port
--prefill-context-parallel-size --prefill-schedule-interval --prefix-cache-retention-interval
--prefix-caching-hash-algo --prefix-match-unit --profiler-config --pt-load-map-location
--quantization --quantization-config --ray-workers-use-nsight --reasoning-config
--reasoning-effort-map --reasoning-parser --reasoning-parser-plugin --renderer-num-workers
--replayssm-buffer-len --response-role --return-sampling-mask --return-tokens-as-token-ids
--revision --root-path --runner --safetensors-load-strategy --safetensors-prefetch-block-size
--safetensors-prefetch-num-threads --scheduler-cls --scheduler-reserve-full-isl --scheduling-policy
--seed --served-model-name --show-hidden-metrics-for-version --shutdown-timeout --skip-mm-profiling
--skip-tokenizer-init --sleep-mode-backend --sleep-mode-offload-cudagraph
--sleep-preserve-parameter-names --sparse-indexer-topk-backend --spec-method --spec-model
--spec-tokens --specialize-active-lora --speculative-config --sse-keep-alive-interval --ssl-ca-certs
--ssl-cert-reqs --ssl-certfile --ssl-ciphers --ssl-keyfile --stream-interval
--structured-outputs-config --swa-bounded-replay --tensor-parallel-size --tokenizer --tokenizer-mode
--tokenizer-revision --tokens-only --tool-call-parser --tool-parser-plugin --tool-server
--tool-strict-level --trust-remote-code --trust-request-chat-template --trust-request-mm-kwargs
--ubatch-size --uds --use-fp64-gumbel --use-replayssm --use-tqdm-on-load --uvicorn-log-level
--video-pruning-method --video-pruning-rate --watchdog-config --watermark --watermark-config
--weight-transfer-config --worker-cls --worker-extension-cls -ac -asc -cc -dc -dcp -dp -dpa -dpb
-dpe -dph -dpl -dpm -dpn -dpp -dpr -ep -h -n -pcp -pp -q -r -sc -tp
"""
KNOWN_FLAGS = frozenset(_BUILTIN_TABLE_TEXT.split())

# Runs inside the head container or a throwaway container of the image (`python3 -c SCRIPT TIMEOUT`):
# prints one line, ASK_MARKER + JSON {version, help, command, error}. It asks the engine's own CLI
# (`vllm serve --help=all`), so it does not depend on where a release keeps its parser.
ASK_MARKER = "DGX_SPARK_VLLM_FLAGS "
INSTALLED_FLAGS_SCRIPT = (
    "import json, os, shutil, subprocess, sys\n"
    "timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0\n"
    "out = {'version': None, 'help': '', 'command': None, 'error': ''}\n"
    "try:\n"
    "    from importlib.metadata import version\n"
    "    out['version'] = version('vllm')\n"
    "except Exception:\n"
    "    try:\n"
    "        import vllm\n"
    "        out['version'] = str(vllm.__version__)\n"
    "    except Exception as exc:\n"
    "        out['error'] = 'vllm is not importable: %s: %s' % (type(exc).__name__, exc)\n"
    "env = dict(os.environ, HF_HUB_OFFLINE='1', VLLM_NO_USAGE_STATS='1', VLLM_LOGGING_LEVEL='ERROR',\n"
    "           NO_COLOR='1', COLUMNS='120')\n"
    "cands = [[sys.executable, '-m', 'vllm.entrypoints.cli.main']]\n"
    "for exe in (os.path.join(os.path.dirname(sys.executable), 'vllm'), shutil.which('vllm')):\n"
    "    if exe and os.access(exe, os.X_OK) and [exe] not in cands:\n"
    "        cands.append([exe])\n"
    "errors = []\n"
    "for base in cands:\n"
    "    cmd = base + ['serve', '--help=all']\n"
    "    try:\n"
    "        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,\n"
    "                              stderr=subprocess.PIPE, env=env, timeout=timeout)\n"
    "    except subprocess.TimeoutExpired:\n"
    "        errors.append('%s timed out after %ss' % (' '.join(cmd), timeout))\n"
    "        break\n"
    "    except OSError as exc:\n"
    "        errors.append('%s: %s' % (' '.join(cmd), exc))\n"
    "        continue\n"
    "    text = proc.stdout.decode('utf-8', 'replace')\n"
    "    if proc.returncode == 0 and '--' in text:\n"
    "        out.update(help=text, command=cmd)\n"
    "        break\n"
    "    tail = proc.stderr.decode('utf-8', 'replace').strip().splitlines()[-1:]\n"
    "    errors.append('%s exited %s%s' % (' '.join(cmd), proc.returncode, (': ' + tail[0]) if tail else ''))\n"
    "if not out['help']:\n"
    "    out['error'] = '; '.join([e for e in [out['error']] if e] + errors)\n"
    "sys.stdout.write('\\n" + ASK_MARKER + "' + json.dumps(out) + '\\n')\n"
)

# An invocation line of argparse help: two spaces, then option strings separated by ', ', each
# optionally followed by its metavar (which may itself hold ', ': vLLM prints some choices as a
# Python list, `--kv-cache-dtype ['auto', 'fp8']`); the help text starts after two or more spaces.
_OPTION_PART = re.compile(r"^(-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*)(?:[ =]\S.*)?$")


def parse_help_flags(text):
    """The option strings listed in the text of `vllm serve --help=all` (argparse format).

    Only option lines count: exactly two spaces of indentation, then every ', '-separated part an
    option string (with its metavar). Help prose, the usage line and the JSON tip's examples
    (indented three spaces, dotted) do not. Checked against the option strings the real parsers of
    vLLM 0.17, 0.32 and 0.33 register (hidden ones included): the same sets.
    """
    flags = set()
    for line in (text or "").splitlines():
        if not line.startswith("  -") or line.startswith("   "):
            continue
        invocation = re.split(r"\s{2,}", line[2:].rstrip(), maxsplit=1)[0]
        names = []
        for part in re.split(r", (?=-)", invocation):
            match = _OPTION_PART.match(part)
            if not match:
                names = []
                break
            names.append(match.group(1))
        flags.update(names)
        # vLLM 0.33's EnableDisableAction lists `--enable-x[, -e], --disable-x` (the field's own names
        # first, then the inverse) and still accepts, hidden from help, `--no-enable-x`.
        for index, name in enumerate(names):
            for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                if name.startswith(prefix) and inverse + name[len(prefix) :] in names[index + 1 :]:
                    flags.add("--no-" + name[2:])
    return frozenset(flags)


def missing_emitted(flags):
    """The flags this module emits that a flag set lacks (empty: the set is a usable answer)."""
    return [name for name in EMITTED_FLAGS if name not in flags]


def read_answer(output):
    """The engine's answer from the ask script's output: (dict, None) or (None, why not)."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(ASK_MARKER):
            try:
                answer = json.loads(line[len(ASK_MARKER) :])
            except ValueError as exc:
                return None, "its answer is not JSON (%s)" % exc
            if not isinstance(answer, dict):
                return None, "its answer is not a JSON object"
            return answer, None
    last = [line for line in (output or "").strip().splitlines() if line.strip()][-1:]
    return None, "it printed no answer%s" % ((": " + last[0][:300]) if last else "")


def flags_from_answer(answer):
    """(flags, version, None) from the ask script's answer, or (None, version, why not)."""
    version = answer.get("version") or None
    text = answer.get("help") or ""
    if not text:
        return None, version, "no help text (%s)" % (answer.get("error") or "the CLI printed nothing")
    flags = parse_help_flags(text)
    missing = missing_emitted(flags)
    if missing:
        return (
            None,
            version,
            "its help lists %d flags but not %s, which this module emits" % (len(flags), ", ".join(missing)),
        )
    return flags, version, None


# Cached answers: <flag_cache_dir>/<image digest>.json, one per image ID (an image never changes).
CACHE_FORMAT = 1


def short_image(image_id):
    """sha256:0123456789ab for an image ID (as docker images shows it, with the algorithm)."""
    algo, _sep, digest = (image_id or "").rpartition(":")
    return "%s:%s" % (algo or "sha256", digest[:12])


def cache_file(cache_dir, image_id):
    """The cache file of an image: its digest without the algorithm, .json."""
    return os.path.join(cache_dir, "%s.json" % (image_id or "").rpartition(":")[2])


def read_cache(cache_dir, image_id):
    """The cached answer for an image ({'flags': frozenset, 'vllm_version': str}), or None."""
    try:
        with open(cache_file(cache_dir, image_id), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT or record.get("image") != image_id:
        return None
    flags = record.get("flags")
    if not isinstance(flags, list) or missing_emitted(flags):
        return None
    return {"flags": frozenset(flags), "vllm_version": record.get("vllm_version")}


def write_cache(cache_dir, image_id, flags, version, command=None):
    """Keep an engine's answer for its image ID (images are immutable); returns an error text or None."""
    record = {
        "format": CACHE_FORMAT,
        "image": image_id,
        "vllm_version": version,
        "command": command,
        "flags": sorted(flags),
    }
    path = cache_file(cache_dir, image_id)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
        os.rename(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return "%s: %s" % (path, exc)
    return None


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def flag_uses(args):
    """(as written, canonical name) for every flag in a list of arguments; values are skipped.

    Canonical as vLLM's FlexibleArgumentParser reads it: the name ends at '=' and at the first '.'
    (`--compilation-config.mode=3` sets --compilation-config); underscores in a long name are dashes
    (`--max_model_len`); -O<level>, -O=<level> and `-O <0..3>` are --optimization-level.
    """
    uses = []
    for index, arg in enumerate(args):
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            continue
        if arg.startswith("--"):
            name = arg.split("=", 1)[0].split(".", 1)[0]
            uses.append((arg, name.replace("_", "-")))
        elif arg == "-O":
            following = args[index + 1] if index + 1 < len(args) else None
            uses.append((arg, OPTIMIZATION_FLAG if following in OPTIMIZATION_LEVELS else "-O"))
        elif arg.startswith("-O."):
            uses.append((arg, "-O."))
        elif arg.startswith("-O"):
            uses.append((arg, OPTIMIZATION_FLAG))
        else:
            uses.append((arg, arg.split("=", 1)[0].split(".", 1)[0]))
    return uses


def flag_names(args):
    """The canonical flag names used in a list of arguments (see flag_uses)."""
    return [name for _written, name in flag_uses(args)]


def ask_plan(state, running, current_image, image, target_image):
    """Where the engine is asked for its flags: (source, image ID, words for flag_check).

    source is "container" (exec in the running head container), "image" (a throwaway container of
    the image) or "deferred" (nothing to ask yet; image ID None). state=started always asks the
    running container: it is what serves. state=checked asks the running container when it runs the
    given image (or none is given), a throwaway container when the given image is on the node, and
    defers when it is not there yet.
    """
    if running and (state == "started" or not image or target_image == current_image):
        return "container", current_image, None
    if image and target_image:
        return "image", target_image, "asked a throwaway container of %s" % image
    if image:
        return "deferred", None, "deferred (image not on the head yet; checked again before serving)"
    return (
        "deferred",
        None,
        "deferred (no image given and the head container is not running; checked again before serving)",
    )


def throwaway_kwargs(image_id, python, timeout, name):
    """DockerClient.containers.run() arguments of the container that asks an image for its flags:
    the entrypoint overridden (an image's own may start a server), no network, removed when done."""
    return dict(
        image=image_id,
        command=["-c", INSTALLED_FLAGS_SCRIPT, str(timeout)],
        entrypoint=[python],
        name=name,
        remove=True,
        network_disabled=True,
        environment={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        stdout=True,
        stderr=False,
    )


def flag_check_text(version, image_id, how):
    """The flag_check result for an asked (or cached) engine."""
    return "installed vLLM %s (image %s, %s)" % (version or "(version unknown)", short_image(image_id), how)


def ask_failure(image_id, how, why, code):
    """The failure when flag_source=installed and the engine cannot be asked."""
    return (
        "flag_source=installed: cannot ask the installed vLLM for its vllm serve flags (image %s, %s): %s%s. "
        "Fix the image (`vllm serve --help=all` must work in it), or set flag_source=builtin "
        "(vllm_server_flag_source) to check against %s."
        % (short_image(image_id), how, why, "" if code in (0, None) else " (exit %s)" % code, builtin_where())
    )


def builtin_where():
    """What the built-in table is called in messages."""
    return "the built-in table of vLLM %s" % BUILTIN_TABLE_RELEASE


def engine_where(version, image_id):
    """What an asked engine is called in messages: its version and image."""
    return "vLLM %s (image %s)" % (version or "(version unknown)", short_image(image_id))


def _option_hint(option):
    return option if option.startswith("(") else "%s (vllm_server_%s)" % (option, option)


def _fragment(arg):
    return arg in ("", "\\") or "\n" in arg or arg.rstrip(" ").endswith("\\")


def static_problems(extra_args):
    """Problems found without asking any engine: secrets, managed flags, shell fragments, -O forms.

    A refusal names the flag, never its value (a value may be a secret)."""
    problems = []
    for arg in extra_args:
        if _fragment(arg):
            shown = arg
            if re.search(r"token|key|secret|passw", arg, re.IGNORECASE):
                shown = (arg.split() or [""])[0] + " ..."
            problems.append(
                "%s: %r looks like a shell line fragment; give one argument per list item, without "
                "line continuations" % (EXTRA_ARGS_VAR, shown)
            )
    for written, name in flag_uses(extra_args):
        if _fragment(written):
            continue
        first = name.split()[0]
        if first == "--hf-token":
            # A token on the command line reaches ps, the result and the diff.
            problems.append(
                "%s: --hf-token puts the token on the command line; set HF_TOKEN in vllm_server_env instead"
                % EXTRA_ARGS_VAR
            )
        elif first != name:
            problems.append(
                "%s: '%s ...' holds a space; give the flag and its value as separate list items"
                % (EXTRA_ARGS_VAR, first)
            )
        elif name in MANAGED_FLAGS:
            problems.append(
                "%s: %s is set by this module; remove it and use the option %s instead"
                % (EXTRA_ARGS_VAR, name, _option_hint(MANAGED_FLAGS[name]))
            )
        elif name == "-O.":
            problems.append(
                "%s: %s: vLLM reads -O as %s (0 to 3), not as --compilation-config; write --compilation-config%s"
                % (EXTRA_ARGS_VAR, written.split("=", 1)[0], OPTIMIZATION_FLAG, written[2:])
            )
    return problems


def closest_flag(name, known):
    """The valid flag closest to a misspelt one, or None when none is close."""
    candidates = [k for k in known if k.startswith("--") == name.startswith("--")]
    if not name.startswith("--no-"):
        candidates = [k for k in candidates if not k.startswith("--no-")]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return close[0] if close else None


def unknown_problems(extra_args, known, where):
    """One refusal per flag that `known` (the engine's flags) lacks, with the closest valid name."""
    problems = []
    seen = set()
    for written, name in flag_uses(extra_args):
        if name in known or name in seen or name in MANAGED_FLAGS or name in ("-O.", "--hf-token"):
            continue
        if _fragment(written) or any(c.isspace() for c in name):
            continue
        seen.add(name)
        shown = written.split("=", 1)[0] if name != OPTIMIZATION_FLAG else written
        if name == "-O":
            fix = "write -O<level> or -O followed by 0, 1, 2 or 3"
        else:
            guess = closest_flag(name, known)
            if guess in MANAGED_FLAGS:
                fix = "did you mean %s? It is set by this module: use the option %s" % (
                    guess,
                    _option_hint(MANAGED_FLAGS[guess]),
                )
            elif guess:
                fix = "did you mean %s?" % guess
            else:
                fix = "remove it"
        if name not in (shown, "-O"):
            shown = "%s (read as %s)" % (shown, name)
        problems.append("%s: %s is not a flag of vllm serve in %s; %s" % (EXTRA_ARGS_VAR, shown, where, fix))
    return problems


def check_extra_args(extra_args, known=None, where=None):
    """Every problem with extra_args: static ones, then flags unknown to `known` (default: the built-in table)."""
    if known is None:
        known, where = KNOWN_FLAGS, where or builtin_where()
    return static_problems(extra_args) + unknown_problems(extra_args, known, where or "the installed vLLM")


def serve_argv(p):
    """The `vllm serve` argument list from the module parameters (no secrets). With backend mp, the rank's
    own: every node runs the same command with its --node-rank, and every node but the head --headless."""
    backend = p.get("backend") or "ray"
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
        backend,
        "--host",
        p["host"],
        "--port",
        str(p["port"]),
    ]
    if p.get("max_model_len"):
        argv += ["--max-model-len", str(p["max_model_len"])]
    if p.get("gpu_memory_utilization") is not None:
        argv += ["--gpu-memory-utilization", _float_text(p["gpu_memory_utilization"])]
    if backend == "mp" and p["nnodes"] > 1:
        argv += ["--nnodes", str(p["nnodes"]), "--node-rank", str(p["node_rank"])]
        argv += ["--master-addr", p["master_addr"], "--master-port", str(p["master_port"])]
        if p["node_rank"] > 0:
            argv.append("--headless")
    argv += list(p.get("extra_args") or [])
    return argv


def _float_text(value):
    return ("%.4f" % float(value)).rstrip("0").rstrip(".")


def serve_env(p):
    """Environment of the serve process, secrets included (never logged: see args_hash)."""
    env = {str(k): str(v) for k, v in (p.get("env") or {}).items()}
    ray = (p.get("backend") or "ray") == "ray"
    if ray and p.get("placement_strategy") and p["placement_strategy"] != "none":
        env[PLACEMENT_ENV] = json.dumps(
            {"placement_group_options": {"strategy": p["placement_strategy"]}}, separators=(",", ":")
        )
    # A headless rank serves no API: the key stays on the head.
    if p.get("api_key") and not p.get("node_rank"):
        env[API_KEY_ENV] = p["api_key"]
    return env


def hashed_env(env):
    """The environment with the key replaced by its own hash (what may be hashed into a label)."""
    safe_env = dict(env)
    if API_KEY_ENV in safe_env:
        safe_env[API_KEY_ENV] = "sha256:" + hashlib.sha256(safe_env[API_KEY_ENV].encode("utf-8")).hexdigest()
    return safe_env


def args_hash(argv, env):
    """Hash of everything that defines the serve process; the key enters only as its own hash."""
    blob = json.dumps({"argv": argv, "env": hashed_env(env)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def redacted_env(env):
    return {k: ("********" if k == API_KEY_ENV else v) for k, v in env.items()}


# backend=mp: each rank logs this once the world group formed, i.e. once every rank joined
# (distributed/parallel_state.py, initialize_model_parallel, vLLM 0.32).
_JOINED = re.compile(r"rank (\d+) in world size (\d+) is assigned as")


def joined_ranks(log):
    """The ranks a container's log shows joined (sorted)."""
    return sorted({int(m.group(1)) for m in _JOINED.finditer(log)})
