"""Write the lab model: a tiny random-weight bf16 checkpoint of Qwen3.5 MoE's real architecture.

transformers' own classes (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration) build it with
random weights from a fixed seed; save_pretrained writes bf16 safetensors shards and
model.safetensors.index.json. The tokenizer is a byte-level BPE built offline with `tokenizers`
(Qwen's special tokens, a Qwen3-style chat template that renders tools for the qwen3_coder tool
parser). The real vLLM serves the directory (`--language-model-only`; linear-attention head dims
are 128, the CPU kernel's size; head counts divide by 2 for tensor parallel 2). Two runs with the
same libraries write the same bytes. lab-model.json names what it is and the input hash.

Needs torch, transformers 5, tokenizers and safetensors (the lab runtime image has them); no hub.

    python3 lab/make_model.py DIR [--seed N] [--max-shard-size SIZE] [--layer-types linear,full,...]

--layer-types sets the layers (linear = Gated DeltaNet, full = attention): vLLM needs a full-attention layer in
every pipeline stage, so a lab for pipeline parallel 3 uses six layers, linear,full three times.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

# The model libraries are only needed to write the model: the controller's unit tests import this
# file for its spec without them.
try:
    import safetensors
    import tokenizers
    import torch
    import transformers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as exc:
    MISSING = str(exc)
else:
    MISSING = None

ARCH = "Qwen3_5MoeForConditionalGeneration"
NAME = "lab-qwen3.5-moe-tiny"
DESCRIPTION = "tiny random-weight lab model for dgx_spark.vllm; not Qwen3.5 weights"
SEED = 20260
MAX_SHARD_SIZE = "1500KB"  # about 4 MB of weights -> 3 shards
VOCAB_SIZE = 512  # the embedding rows; the tokenizer uses fewer (as Qwen pads its vocabulary)
BPE_VOCAB = 448  # byte alphabet (256) plus merges learned from CORPUS, before the added tokens

# Added tokens in Qwen's order, after the BPE vocabulary: (content, special).
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Qwen3.5's pre-tokenizer split: transformers 5 loads this model type with Qwen3_5Tokenizer,
# which rebuilds the pipeline from vocab and merges with this regex, so tokenizer.json uses it too.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The text the BPE merges are learned from: chat turns, tool calls, a little prose and code.
CORPUS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.",
    "You are a helpful assistant. Answer the question in one short sentence.",
    "system\nuser\nassistant\ntool\nWhat is the weather like in Paris today?",
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>",
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n</tools>",
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
    "If you choose to call a function ONLY reply in the following format with NO suffix:",
    "Reminder: function calls MUST follow the specified format, start with <tool_call> and end with </tool_call>.",
    "Two DGX Spark nodes run one vLLM server on a Ray cluster, tensor parallel over the RoCE fabric.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i, add(i, 1))\n",
    "Once upon a time there was a small model that knew nothing at all, and it answered every question.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 2026 3.14 42",
]

# Qwen3-style chat template: system and tools first, tool calls as <tool_call><function=...>
# XML (what the qwen3_coder parser reads), tool results as <tool_response> in a user turn.
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for item in content -%}"
    "{%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item.type == 'video' or 'video' in item -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item.text -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- elif content is not none -%}{{- content | string -}}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set first = 0 -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set first = 1 -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if first -%}{{- render(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson) -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:'"
    " + '\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1'"
    " + '\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif first -%}"
    "{{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[first:] -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + render(message.content) -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{{- '\\n<tool_call>\\n<function=' + call.name + '>\\n' -}}"
    "{%- if call.arguments is mapping -%}"
    "{%- for key, value in call.arguments.items() -%}"
    "{{- '<parameter=' + key + '>\\n' -}}"
    "{{- (value if value is string else value | tojson) + '\\n</parameter>\\n' -}}"
    "{%- endfor -%}"
    "{%- elif call.arguments -%}{{- call.arguments | string + '\\n' -}}"
    "{%- endif -%}"
    "{{- '</function>\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Qwen3.5 MoE's text model, scaled down. Full attention: 4 query heads and 2 KV heads of 64 (the
# CPU attention kernel takes 64); linear attention (Gated DeltaNet): 2 key and 4 value heads of
# 128; experts and the shared expert 64 wide (32 per rank at TP=2, the CPU MoE kernel's alignment).
TEXT_CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    # Rotary on a quarter of the head (16 of 64), split 3/3/2 over (time, height, width) as Qwen's
    # interleaved multimodal rotary does (11/11/10 of 256 in the real model).
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
}

# The vision tower as small as the classes allow (the lab serves with --language-model-only).
VISION_CONFIG = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": TEXT_CONFIG["hidden_size"],
    "num_position_embeddings": 16,
}

# The tokenizer's roles: ChatML turns end generation; <|endoftext|> pads.
TOKEN_ROLES = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def text_config(layer_types=None):
    """TEXT_CONFIG, or with these layers ("linear" or "full" each)."""
    if not layer_types:
        return TEXT_CONFIG
    kinds = {"linear": "linear_attention", "full": "full_attention"}
    return dict(TEXT_CONFIG, num_hidden_layers=len(layer_types), layer_types=[kinds[k] for k in layer_types])


def spec(seed=SEED, max_shard_size=MAX_SHARD_SIZE, layer_types=None):
    """Every input the directory is made from (hashed into lab-model.json)."""
    return {
        "architecture": ARCH,
        "seed": seed,
        "max_shard_size": max_shard_size,
        "text_config": text_config(layer_types),
        "vision_config": VISION_CONFIG,
        "bpe_vocab": BPE_VOCAB,
        "added_tokens": ADDED_TOKENS,
        "pretokenize_regex": PRETOKENIZE_REGEX,
        "corpus": CORPUS,
        "chat_template": CHAT_TEMPLATE,
        "generation": GENERATION,
    }


def input_hash(inputs):
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def token_ids():
    """Added token -> id: they follow the BPE vocabulary, in ADDED_TOKENS order."""
    return {entry[0]: BPE_VOCAB + index for index, entry in enumerate(ADDED_TOKENS)}


def build_tokenizer():
    """Byte-level BPE with Qwen3.5's normalizer and pre-tokenizer, merges learned from CORPUS."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer, length=len(CORPUS) * 4)
    learned = tok.get_vocab_size()
    if learned > BPE_VOCAB:
        raise RuntimeError("BPE vocabulary %d is over %d" % (learned, BPE_VOCAB))
    # Fill the BPE vocabulary to exactly BPE_VOCAB ids, so the added tokens land on fixed ids.
    padding = ["<|lab_unused_%d|>" % index for index in range(learned, BPE_VOCAB)]
    if padding:
        tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in padding])
    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    ids = token_ids()
    for content, want in ids.items():
        if tok.token_to_id(content) != want:
            raise RuntimeError("%s got id %s, not %d" % (content, tok.token_to_id(content), want))
    if max(ids.values()) >= VOCAB_SIZE:
        raise RuntimeError("the tokenizer (%d ids) does not fit vocab_size %d" % (max(ids.values()) + 1, VOCAB_SIZE))
    return tok


def write_tokenizer(directory, tok):
    ids = token_ids()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        unk_token=None,
        **TOKEN_ROLES,
        model_max_length=TEXT_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        add_prefix_space=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    # Name the class Qwen3.5's own checkpoints name (transformers 4 knows it too; transformers 5
    # loads this model type with Qwen3_5Tokenizer whatever the file says).
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path, encoding="utf-8") as handle:
        settings = json.load(handle)
    settings["tokenizer_class"] = "Qwen2Tokenizer"
    write_json(path, settings)
    return ids


def build_config(layer_types=None):
    ids = token_ids()
    text = dict(text_config(layer_types), eos_token_id=ids["<|endoftext|>"], pad_token_id=None, bos_token_id=None)
    text["dtype"] = "bfloat16"
    config = transformers.Qwen3_5MoeConfig(
        text_config=text,
        vision_config=dict(VISION_CONFIG),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = [ARCH]
    config.dtype = "bfloat16"
    return config


def build_model(config, seed):
    torch.manual_seed(seed)
    model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    return model.to(torch.bfloat16).eval()


def write_generation_config(directory):
    ids = token_ids()
    generation = transformers.GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        **GENERATION,
    )
    generation.save_pretrained(directory)


def libraries():
    return {
        "safetensors": safetensors.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")


def install(staging, directory):
    """Move the finished files up into directory, the index last; drop shards it no longer lists."""
    index = "model.safetensors.index.json"
    names = sorted(os.listdir(staging))
    for name in [n for n in names if n != index] + [index]:
        os.chmod(os.path.join(staging, name), 0o644)  # shards are written 0600; any reader may serve them
        os.replace(os.path.join(staging, name), os.path.join(directory, name))
    for name in os.listdir(directory):
        if name.endswith(".safetensors") and name not in names:
            os.remove(os.path.join(directory, name))


def make_model(directory, seed=SEED, max_shard_size=MAX_SHARD_SIZE, layer_types=None):
    """Write the lab model into directory; returns directory."""
    if MISSING:
        raise RuntimeError("the lab model needs torch, transformers 5, tokenizers and safetensors: %s" % MISSING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    inputs = spec(seed, max_shard_size, layer_types)
    # Staged inside directory itself: the same filesystem when directory is a mount point.
    os.makedirs(directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".lab-model-", dir=directory)
    try:
        tok = build_tokenizer()
        write_tokenizer(staging, tok)
        config = build_config(layer_types)
        model = build_model(config, seed)
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        write_generation_config(staging)
        count = sum(param.numel() for param in model.parameters())
        write_json(
            os.path.join(staging, "lab-model.json"),
            {
                "name": NAME,
                "description": DESCRIPTION,
                "architecture": ARCH,
                "generator": "lab/make_model.py",
                "input_sha256": input_hash(inputs),
                "seed": seed,
                "dtype": "bfloat16",
                "parameters": count,
                "libraries": libraries(),
            },
        )
        install(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--max-shard-size", default=MAX_SHARD_SIZE)
    parser.add_argument("--layer-types", type=lambda text: text.split(","), default=None)
    args = parser.parse_args(argv)
    if args.layer_types and set(args.layer_types) - {"linear", "full"}:
        parser.error("--layer-types: each is linear or full, not %s" % ",".join(args.layer_types))
    print(make_model(args.directory, args.seed, args.max_shard_size, args.layer_types))
    return 0


if __name__ == "__main__":
    sys.exit(main())
