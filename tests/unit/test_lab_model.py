"""lab/make_model.py: the lab model's spec fits what the real vLLM CPU build serves.

The spec checks need no model libraries. The generation test runs the generator itself, with the
Python named by LAB_MODEL_PYTHON (one with torch, transformers 5, tokenizers and safetensors, such
as the lab runtime image's) or this one if it has them; otherwise it is skipped.
"""

import importlib.util
import json
import os

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR = os.path.join(ROOT, "lab", "make_model.py")


def load():
    spec = importlib.util.spec_from_file_location("lab_make_model", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mm = load()
TEXT = mm.TEXT_CONFIG
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_layers_are_three_linear_and_one_full_attention():
    assert TEXT["num_hidden_layers"] == 4 == len(TEXT["layer_types"])
    assert TEXT["layer_types"].count("linear_attention") == 3
    assert TEXT["layer_types"][-1] == "full_attention"


def test_head_sizes_fit_the_cpu_kernels():
    # The CPU Gated DeltaNet kernel takes 128 only; the CPU attention kernel a fixed list.
    assert TEXT["linear_key_head_dim"] == TEXT["linear_value_head_dim"] == 128
    assert TEXT["head_dim"] in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@pytest.mark.parametrize(
    "key", ["num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"]
)
def test_head_counts_split_over_tensor_parallel_2(key):
    assert TEXT[key] % 2 == 0


def test_gqa_groups_are_whole():
    assert TEXT["num_attention_heads"] % TEXT["num_key_value_heads"] == 0
    assert TEXT["linear_num_value_heads"] % TEXT["linear_num_key_heads"] == 0


def test_moe_widths_fit_the_cpu_moe_kernel_at_tp2():
    # The CPU MoE kernel wants hidden and per-rank intermediate sizes in multiples of 32.
    assert TEXT["hidden_size"] % 32 == 0
    assert (TEXT["moe_intermediate_size"] // 2) % 32 == 0
    assert TEXT["num_experts_per_tok"] < TEXT["num_experts"]


def test_rotary_sections_cover_the_rotary_half():
    rope = TEXT["rope_parameters"]
    rotary = int(TEXT["head_dim"] * rope["partial_rotary_factor"])
    assert sum(rope["mrope_section"]) * 2 == rotary


def test_context_covers_the_lab_server():
    assert TEXT["max_position_embeddings"] >= 4096


def test_vision_tower_feeds_the_text_width():
    assert mm.VISION_CONFIG["out_hidden_size"] == TEXT["hidden_size"]
    side = int(mm.VISION_CONFIG["num_position_embeddings"] ** 0.5)
    assert side * side == mm.VISION_CONFIG["num_position_embeddings"]


def test_token_ids_fit_the_vocabulary():
    ids = mm.token_ids()
    assert len(ids) == len(mm.ADDED_TOKENS)
    assert min(ids.values()) == mm.BPE_VOCAB
    assert max(ids.values()) < TEXT["vocab_size"]
    for name in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>"]:
        assert name in ids


def test_input_hash_is_stable_and_follows_the_seed():
    first = mm.input_hash(mm.spec())
    assert first == mm.input_hash(mm.spec())
    assert first != mm.input_hash(mm.spec(seed=mm.SEED + 1))


def render(messages, **kwargs):
    """The template the way transformers renders it (tojson without HTML escaping)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return env.from_string(mm.CHAT_TEMPLATE).render(messages=messages, **kwargs)


def test_template_renders_chatml_turns():
    text = render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_template_turns_thinking_off():
    text = render([{"role": "user", "content": "Hi"}], add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_renders_tools_calls_and_results_as_qwen3_coder_reads_them():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "20 C"},
    ]
    text = render(messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{")
    assert '"name": "get_weather"' in text
    assert (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>" in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20 C\n</tool_response><|im_end|>"
        in text
    )


def test_template_renders_image_parts_as_vision_tokens():
    content = [{"type": "text", "text": "What is this?"}, {"type": "image"}]
    text = render([{"role": "user", "content": content}])
    assert text == "<|im_start|>user\nWhat is this?<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
