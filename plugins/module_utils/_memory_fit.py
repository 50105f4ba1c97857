# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the model's weights and one max_model_len sequence fit each node's memory (private; used by
vllm_serve before anything starts).

What vLLM itself needs at start-up, read from its source (vLLM 0.32.0):

| part                | vLLM 0.32                                                                              |
| ------------------- | -------------------------------------------------------------------------------------- |
| budget per GPU      | total memory x gpu_memory_utilization (default 0.92, config/cache.py); on integrated  |
|                     | GPUs (DGX Spark) the total is cudaMemGetInfo's, the node's memory (utils/mem_utils.py) |
| KV of one sequence  | v1/core/kv_cache_utils.py check_enough_kv_cache_memory: refuses to start unless one    |
|                     | max_model_len request fits; FullAttentionSpec.max_memory_usage_bytes = blocks x page,  |
|                     | page = kv heads per rank x block x (head_size + head_size_v) x dtype bytes             |
| KV heads per rank   | config/model.py get_num_kv_heads: max(1, total // TP)                                  |
| layers that grow    | config/model.py get_num_layers_by_block_type: hybrid Qwen3.5 counts layer_types        |
|                     | entries in _ATTENTION_LAYER_TYPES; PP ranks hold get_pp_indices' slices                |
| linear-attn state   | mamba_utils.py gated_delta_net_state_shape/_dtype: conv (kernel-1) x conv_dim/TP and  |
|                     | (v heads/TP) x v dim x k dim, one per sequence (MambaSpec.max_memory_usage_bytes)      |
| KV dtype            | cache_dtype auto = the model's dtype (float32 configs run as 16-bit)                   |

GB10 memory is unified: the GPU's memory is the node's MemTotal. Weights count as the checkpoint holds them,
split evenly (a vision encoder skipped with --language-model-only, or an MTP head without speculative
decoding, counts too). Not counted, so the rest can only under-state the need: activations of vLLM's
profiling run, CUDA graphs, block rounding, sliding-window layers.
"""

from __future__ import annotations

import json
import os
import re

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _layout, _vllm_args

GIB = float(1 << 30)
GB = 1e9
# The hub's file list is asked once, in the first play: an unreachable hub defers the check, never stalls it.
HUB_TIMEOUT_S = 30
INDEX = "model.safetensors.index.json"
# vLLM's gpu_memory_utilization default (config/cache.py): 0.92 since 0.25 (0.9 before).
VLLM_DEFAULT_UTILIZATION = 0.92
# vLLM 0.32 config/model.py _ATTENTION_LAYER_TYPES: layer_types entries that keep a full KV cache.
ATTENTION_LAYER_TYPES = ("full_attention", "indexed_attention", "deepseek_sparse_attention", "qwen_sparse_attention")
LINEAR_LAYER_TYPE = "linear_attention"
# transformers 5.19 Qwen3_5MoeTextConfig: layer_types from full_attention_interval, default 4.
DEFAULT_INTERVAL = 4
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
ROLE_VARS = {
    "max_model_len": "vllm_server_max_model_len",
    "gpu_memory_utilization": "vllm_server_gpu_memory_utilization",
    "tensor_parallel_size": "vllm_server_tensor_parallel_size",
    "pipeline_parallel_size": "vllm_server_pipeline_parallel_size",
}


def gib(value):
    return "%.2f GiB" % (value / GIB) if value >= GIB / 100 else "%.2f MiB" % (value / float(1 << 20))


def size_text(value):
    return "%.1f GB" % (value / GB) if value >= GB else "%d bytes" % value


def mem_total(meminfo):
    """MemTotal in bytes from /proc/meminfo's text, or None."""
    found = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo or "", re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def disk_weights(model_dir):
    """(bytes, source) of the weights in a model directory: the index's metadata.total_size, else the sum
    of its *.safetensors files; (None, why) when the directory holds neither."""
    if not model_dir or not os.path.isdir(model_dir):
        return None, "%s is not on this node yet" % model_dir
    index = os.path.join(model_dir, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as handle:
                total = (json.load(handle).get("metadata") or {}).get("total_size")
        except (OSError, ValueError) as exc:
            return None, "cannot read %s: %s" % (index, exc)
        if isinstance(total, int) and total > 0:
            return total, "metadata.total_size of %s" % index
    files = [name for name in sorted(os.listdir(model_dir)) if name.endswith(".safetensors")]
    if not files:
        return None, "no *.safetensors in %s yet" % model_dir
    total = sum(os.path.getsize(os.path.join(model_dir, name)) for name in files)
    return total, "%d *.safetensors files in %s" % (len(files), model_dir)


def hub_weights(repo_id, revision=None, token=None, api=None):
    """(bytes, source) of the repository's *.safetensors from the hub's file list (no download);
    (None, why) when the hub cannot be asked. api: an HfApi-like object (tests pass a fake)."""
    if api is None:
        try:
            from huggingface_hub import HfApi  # noqa: PLC0415 - optional, only on a head that downloads
        except ImportError:
            return None, "huggingface_hub is not importable on this node"
        api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision, token=token, files_metadata=True, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # any hub or network failure: deferred, never guessed
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return None, "the hub did not answer for %s: %s" % (repo_id, first)
    sizes = [s.size for s in getattr(info, "siblings", None) or [] if s.rfilename.endswith(".safetensors")]
    if not sizes or any(size is None for size in sizes):
        return None, "the hub lists no *.safetensors sizes for %s" % repo_id
    return sum(sizes), "the hub's file list of %s (%d *.safetensors)" % (repo_id, len(sizes))


def weights_size(model_dir, repo_id=None, revision=None, token=None, api=None):
    """(bytes, source) of the weights: on disk, else (a model the deploy downloads) the hub's file list;
    (None, why) when neither can tell."""
    size, source = disk_weights(model_dir)
    if size is None and repo_id and not os.path.isdir(model_dir or ""):
        size, hub_why = hub_weights(repo_id, revision, token, api)
        source = hub_why if size is not None else "%s; %s" % (source, hub_why)
    return size, source


def flag_value(extra_args, name):
    """The value of a flag in vllm serve's extra arguments, read as vLLM reads names (the last one wins)."""
    args = list(extra_args or [])
    value = None
    for index, arg in enumerate(args):
        uses = _vllm_args.flag_uses([arg])
        if not uses or uses[0][1] != name:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif index + 1 < len(args):
            value = args[index + 1]
    return value


def model_dtype_bytes(extra_args):
    """Bytes of the model's compute dtype: --dtype, else the config's; float32 configs run as 16-bit under
    auto (config/model.py _resolve_auto_dtype)."""
    dtype = (flag_value(extra_args, "--dtype") or "auto").lower()
    if dtype == "auto":
        return 2
    return DTYPE_BYTES.get(dtype, 2)


def kv_dtype_bytes(extra_args):
    """(bytes per KV element, None) or (None, why) for a --kv-cache-dtype this check cannot size."""
    cache = (flag_value(extra_args, "--kv-cache-dtype") or "auto").lower()
    if cache == "auto":
        return model_dtype_bytes(extra_args), None
    if cache in ("float16", "bfloat16"):
        return 2, None
    if cache.startswith("fp8"):
        return 1, None
    return None, "--kv-cache-dtype %s is not sized here" % cache


def layer_kinds(text):
    """The text model's layer types, one per layer: layer_types, else full_attention_interval for a hybrid
    (linear-attention keys present), else every layer full attention."""
    layers = text.get("num_hidden_layers")
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return list(types)
    if not isinstance(layers, int) or layers < 1:
        return None
    if "linear_num_key_heads" in text or "full_attention_interval" in text:
        interval = text.get("full_attention_interval") or DEFAULT_INTERVAL
        return [LINEAR_LAYER_TYPE if (i + 1) % interval else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers


def pp_slices(layers, pp):
    """vLLM's get_pp_indices (distributed/utils.py) without VLLM_PP_LAYER_PARTITION: (start, end) per rank."""
    per = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        per[-i] += 1
    starts = [sum(per[:rank]) for rank in range(pp)]
    return [(start, start + count) for start, count in zip(starts, per)]


def kv_per_rank(config, tp, pp, max_model_len, extra_args):
    """KV cache and linear-attention state of one max_model_len sequence on the heaviest rank:
    (bytes, details dict) or (None, why)."""
    text = _layout.text_config(config)
    kinds = layer_kinds(text)
    kv_heads = text.get("num_key_value_heads") or text.get("num_attention_heads")
    head_dim = text.get("head_dim")
    if not head_dim and text.get("hidden_size") and text.get("num_attention_heads"):
        head_dim = text["hidden_size"] // text["num_attention_heads"]
    if not kinds or not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        return None, "config.json names no layers, KV heads or head_dim"
    kv_bytes, why = kv_dtype_bytes(extra_args)
    if kv_bytes is None:
        return None, why
    heads_per_rank = max(1, kv_heads // tp)
    per_token_layer = heads_per_rank * 2 * head_dim * kv_bytes
    # Gated DeltaNet state per layer and sequence (its dtype: the model's, or mamba_ssm_dtype for the
    # recurrent state, as vLLM's Qwen3.5 config update sets it).
    state = 0
    if LINEAR_LAYER_TYPE in kinds:
        nk, nv = text.get("linear_num_key_heads", 0), text.get("linear_num_value_heads", 0)
        dk, dv = text.get("linear_key_head_dim", 0), text.get("linear_value_head_dim", 0)
        kernel = text.get("linear_conv_kernel_dim", 4)
        conv_bytes = model_dtype_bytes(extra_args)
        ssm_bytes = DTYPE_BYTES.get(str(text.get("mamba_ssm_dtype") or "").lower(), conv_bytes)
        state = (kernel - 1) * ((dk * nk * 2 + dv * nv) // tp) * conv_bytes + (nv // tp) * dv * dk * ssm_bytes
    worst = None
    for start, end in pp_slices(len(kinds), pp):
        full = sum(kind in ATTENTION_LAYER_TYPES for kind in kinds[start:end])
        linear = sum(kind == LINEAR_LAYER_TYPE for kind in kinds[start:end])
        total = full * per_token_layer * max_model_len + linear * state
        if worst is None or total > worst[0]:
            worst = (total, full, linear)
    total, full, linear = worst
    return total, dict(
        full_attention_layers=full,
        linear_attention_layers=linear,
        kv_heads_per_rank=heads_per_rank,
        head_dim=head_dim,
        kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=full * per_token_layer,
        linear_state_bytes=linear * state,
    )


def max_model_len_of(config):
    value = _layout.text_config(config).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def check(p, config, weights, weights_source, nodes):
    """The fit of this layout: (problems, report). p: vllm_serve's parameters; config: the model's
    config.json (None before it is there); weights: bytes on disk (None when not known, weights_source then
    says why); nodes: [{host, meminfo}], one per node the layout spans (one GPU each, as on a Spark)."""
    util = p["gpu_memory_utilization"] or VLLM_DEFAULT_UTILIZATION
    report = dict(gpu_memory_utilization=util, nodes=[])
    totals = [(node.get("host"), mem_total(node.get("meminfo"))) for node in nodes]
    missing = [host for host, total in totals if total is None]
    if not totals or missing:
        why = "no MemTotal read on %s" % ", ".join(missing) if missing else "node_memory not given"
        return [], dict(report, check="skipped: %s" % why)
    if weights is None:
        why = "deferred: the weights' size is not known (%s); checked again before serving" % weights_source
        return [], dict(report, check=why)
    ranks = max(1, p["tensor_parallel_size"] * p["pipeline_parallel_size"] // len(totals))
    max_len = p["max_model_len"] or (max_model_len_of(config) if config else None)
    kv, details = None, "no config.json on this node yet"
    if config is not None and max_len:
        kv, details = kv_per_rank(
            config, p["tensor_parallel_size"], p["pipeline_parallel_size"], max_len, p["extra_args"]
        )
    elif config is not None:
        details = "no max_model_len set and no max_position_embeddings in config.json"
    share = weights / len(totals)
    need = share + (kv or 0) * ranks
    report.update(
        weights_bytes=weights,
        weights_source=weights_source,
        weights_per_node_bytes=int(share),
        max_model_len=max_len,
        kv_per_node_bytes=kv * ranks if kv is not None else None,
        need_per_node_bytes=int(need),
        ranks_per_node=ranks,
    )
    if kv is not None:
        report["kv"] = details
    for host, total in totals:
        report["nodes"].append(dict(host=host, mem_total_bytes=total, budget_bytes=int(total * util)))
    tightest = min(total for _host, total in totals) * util
    if need <= tightest:
        report["check"] = "fits: %s needed per node, %s allowed on the tightest" % (gib(need), gib(tightest))
        if kv is None:
            report["check"] = (
                "deferred: the weights fit; KV cache not counted yet (%s); checked again before serving" % (details)
            )
        return [], report
    report["check"] = "refused"
    return [refusal(p, report, details if kv is None else None)], report


def kv_text(p, report):
    kv = report["kv"]
    if p["max_model_len"]:
        length = "%s %d" % (ROLE_VARS["max_model_len"], report["max_model_len"])
    else:
        length = "the model's max_position_embeddings %d (%s unset)" % (
            report["max_model_len"],
            ROLE_VARS["max_model_len"],
        )
    linear = ", plus the fixed state of %d linear-attention layers" % kv["linear_attention_layers"]
    ranks = " per rank, %d ranks per node" % report["ranks_per_node"] if report["ranks_per_node"] > 1 else ""
    return (
        "KV cache %s for one sequence of %s (%d full-attention layers x %d KV heads per rank x head_dim %d "
        "x 2 (K, V) x %d bytes%s%s)"
        % (
            gib(report["kv_per_node_bytes"]),
            length,
            kv["full_attention_layers"],
            kv["kv_heads_per_rank"],
            kv["head_dim"],
            kv["kv_dtype_bytes"],
            linear if kv["linear_attention_layers"] else "",
            ranks,
        )
    )


def fixes(report):
    """The changes that would fit, with the numbers for the tightest node."""
    util, need, share = (
        report["gpu_memory_utilization"],
        report["need_per_node_bytes"],
        report["weights_per_node_bytes"],
    )
    smallest = min(node["mem_total_bytes"] for node in report["nodes"])
    budget = smallest * util
    kv_node = report["kv_per_node_bytes"] or 0
    count = len(report["nodes"])
    # More nodes: the weights' share shrinks; the KV cache per node is taken as it is now (it can only shrink).
    nodes = next((n for n in range(count + 1, 257) if report["weights_bytes"] / n + kv_node <= budget), None)
    if nodes:
        out = ["more nodes (at least %d of this memory)" % nodes]
    else:
        out = ["more nodes alone cannot help (the KV cache per node stays over the budget)"]
    kv = report.get("kv")
    if kv and kv["kv_bytes_per_token"]:
        room = budget - share - kv["linear_state_bytes"] * report["ranks_per_node"]
        longest = int(room // (kv["kv_bytes_per_token"] * report["ranks_per_node"])) if room > 0 else 0
        if longest > 0:
            out.append("a lower %s (at most %d fits here)" % (ROLE_VARS["max_model_len"], longest))
        else:
            out.append(
                "a lower %s alone cannot help (the weights' share is over the budget)" % ROLE_VARS["max_model_len"]
            )
    wanted = need / float(smallest)
    if wanted <= 1:
        out.append("a higher %s (%.2f or more, if the OS can spare it)" % (ROLE_VARS["gpu_memory_utilization"], wanted))
    else:
        out.append("no %s can help (%s is more than MemTotal)" % (ROLE_VARS["gpu_memory_utilization"], gib(need)))
    return out


def refusal(p, report, kv_missing):
    """One message naming the variables, the numbers per node and the fixes."""
    util_text = "%.2f" % report["gpu_memory_utilization"] + ("" if p["gpu_memory_utilization"] else " (vLLM's default)")
    short = {}
    for node in report["nodes"]:
        if node["budget_bytes"] < report["need_per_node_bytes"]:
            short.setdefault((node["mem_total_bytes"], node["budget_bytes"]), []).append(node["host"])
    budgets = "; ".join(
        "%s: MemTotal %s x %s %s = %s"
        % (", ".join(hosts), gib(total), ROLE_VARS["gpu_memory_utilization"], util_text, gib(budget))
        for (total, budget), hosts in sorted(short.items())
    )
    layout = "%s %d x %s %d" % (
        ROLE_VARS["tensor_parallel_size"],
        p["tensor_parallel_size"],
        ROLE_VARS["pipeline_parallel_size"],
        p["pipeline_parallel_size"],
    )
    weights = "weights %s (%s from %s, split evenly over the %d nodes, GB10 unified memory)" % (
        gib(report["weights_per_node_bytes"]),
        size_text(report["weights_bytes"]),
        report["weights_source"],
        len(report["nodes"]),
    )
    kv = "KV cache not counted yet (%s)" % kv_missing if kv_missing else kv_text(p, report)
    return "memory: %s over %d nodes cannot fit. Per node: %s + %s = %s needed, over the budget of %s. Fix: %s." % (
        layout,
        len(report["nodes"]),
        weights,
        kv,
        gib(report["need_per_node_bytes"]),
        budgets,
        "; ".join(fixes(report)),
    )
