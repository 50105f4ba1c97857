"""The parallel layout against a model's config.json, as vLLM splits heads and layers."""

from __future__ import annotations

import json

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _layout

# The lab model's text config as lab/make_model.py writes it (read from the lab's config.json).
LAB = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "text_config": {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_hidden_layers": 4,
        "num_experts": 4,
    },
}


def test_the_lab_layouts_that_fit_pass():
    assert _layout.problems(LAB, 2, 1) == []
    assert _layout.problems(LAB, 1, 2) == []
    # Its two linear-attention key heads do not split four ways.
    assert "linear-attention key heads (2)" in _layout.problems(LAB, 4, 1)[0]


def test_tp3_is_refused_naming_the_head_counts_and_the_valid_layouts():
    (problem,) = _layout.problems(LAB, 3, 1)
    assert problem.startswith("vllm_server_tensor_parallel_size: 3 does not split the model's attention heads (4)")
    assert "KV heads (2)" in problem and "linear-attention key heads (2)" in problem
    # Three GPUs: only TP=1 x PP=3 splits this model.
    assert problem.endswith("layouts of this inventory's 3 GPUs that fit it: TP=1 x PP=3")


def test_kv_heads_are_replicated_when_tp_is_a_multiple():
    dense = {"num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 8}
    assert _layout.problems(dense, 4, 1) == []
    assert _layout.problems(dense, 8, 1) == []
    assert "KV heads (3)" in _layout.problems({**dense, "num_key_value_heads": 3, "num_attention_heads": 12}, 4, 1)[0]


def test_pp_beyond_the_layers_is_refused():
    (problem,) = _layout.problems(LAB, 1, 8)
    assert problem.startswith("vllm_server_pipeline_parallel_size: 8 is more than the model's 4 layers")
    assert "TP=2 x PP=4" in problem and "PP=8" not in problem


def test_read_config_is_none_before_the_model_is_there(tmp_path):
    assert _layout.read_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps(LAB))
    assert _layout.read_config(str(tmp_path)) == LAB
