# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The parallel layout held against the model's own config.json (private; used by vllm_serve).

Each rule is vLLM's own, checked before anything starts rather than when the model loads:

| rule                                                  | upstream (vLLM 0.32)                                   |
| ----------------------------------------------------- | ------------------------------------------------------ |
| attention heads divisible by TP                       | config/model.py, verify_with_parallel_config           |
| KV heads divisible by TP, or TP by them when larger   | layers/linear.py, QKVParallelLinear (divide, replicas) |
| linear-attention key and value heads divisible by TP  | layers/mamba/gdn/qwen_gdn_linear_attn.py               |
| PP no larger than the layers                          | distributed/utils.py, get_pp_indices                   |
"""

from __future__ import annotations

import json
import os

# (what the message calls it, the key in the model's text config)
HEADS = (
    ("attention heads", "num_attention_heads"),
    ("KV heads", "num_key_value_heads"),
    ("linear-attention key heads", "linear_num_key_heads"),
    ("linear-attention value heads", "linear_num_value_heads"),
)


def read_config(model_dir):
    """The model's config.json as a dict, or None when the directory has none yet (a hub id, or a model
    this deploy downloads)."""
    path = os.path.join(model_dir or "", "config.json")
    if not model_dir or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def text_config(config):
    # Multimodal checkpoints (Qwen3.5) keep the language model's shape under text_config.
    return config.get("text_config") or config


def tp_fits(tp, counts):
    """Whether a tensor-parallel size splits every head count the way vLLM splits it."""
    for name, count in counts.items():
        if name == "KV heads" and tp > count:
            if tp % count:
                return False
        elif count % tp:
            return False
    return True


def problems(config, tp, pp):
    """'variable: problem; fix' strings for this layout (empty when it fits the model). The inventory's GPUs
    are tp x pp (checked before this); the valid choices named are the splits of that many GPUs that fit."""
    text = text_config(config)
    counts = {name: int(text[key]) for name, key in HEADS if isinstance(text.get(key), int) and text[key] > 0}
    layers = text.get("num_hidden_layers")
    gpus = tp * pp
    fits = [d for d in range(1, gpus + 1) if gpus % d == 0 and tp_fits(d, counts)]
    choices = ", ".join(
        "TP=%d x PP=%d" % (d, gpus // d) for d in fits if not isinstance(layers, int) or gpus // d <= layers
    )
    found = []
    if not tp_fits(tp, counts):
        found.append(
            "vllm_server_tensor_parallel_size: %d does not split the model's %s; layouts of this inventory's %d "
            "GPUs that fit it: %s"
            % (tp, ", ".join("%s (%d)" % item for item in counts.items()), gpus, choices or "none")
        )
    if isinstance(layers, int) and pp > layers:
        found.append(
            "vllm_server_pipeline_parallel_size: %d is more than the model's %d layers; layouts that fit: %s"
            % (pp, layers, choices or "none")
        )
    return found
