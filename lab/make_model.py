"""Write a tiny Qwen3.5 MoE model directory for the lab (deterministic; standard library only).

config.json names the architecture and model type that transformers 5 defines for Qwen3.5 MoE;
the weights are a few small real safetensors shards (an 8-byte header length, a JSON header,
raw little-endian bytes) listed in model.safetensors.index.json. No real model: the lab stand-in
engine serves it.

    python3 lab/make_model.py DIR [--shards N]
"""

import argparse
import hashlib
import json
import os
import struct
import sys

ARCH = "Qwen3_5MoeForConditionalGeneration"
MODEL_TYPE = "qwen3_5_moe"
HIDDEN = 64
LAYERS = 4
EXPERTS = 4
VOCAB = 256


def config():
    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    return {
        "architectures": [ARCH],
        "model_type": MODEL_TYPE,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "layer_types": layer_types,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": EXPERTS,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-06,
            "dtype": "bfloat16",
        },
        "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 2},
        "dtype": "bfloat16",
        "lab_stand_in": "tiny generated model for the dgx_spark.vllm lab; not Qwen3.5 weights",
    }


def tensors():
    """Name -> (shape) of the tiny weights, in file order."""
    out = {"model.language_model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        prefix = "model.language_model.layers.%d." % layer
        out[prefix + "input_layernorm.weight"] = (HIDDEN,)
        out[prefix + "mlp.gate.weight"] = (EXPERTS, HIDDEN)
        for expert in range(EXPERTS):
            out[prefix + "mlp.experts.%d.down_proj.weight" % expert] = (HIDDEN, 32)
    out["model.language_model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def tensor_bytes(name, shape):
    """Deterministic F32 data derived from the tensor name."""
    count = 1
    for dim in shape:
        count *= dim
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    values = [((seed + i * 2654435761) % 2000 - 1000) / 1000.0 for i in range(count)]
    return struct.pack("<%df" % count, *values)


def write_safetensors(path, items):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in items:
        data = tensor_bytes(name, shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)  # the header is padded to 8 bytes, as safetensors writes it
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for blob in blobs:
            handle.write(blob)
    return offset


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")


def make_model(directory, shards=3):
    os.makedirs(directory, exist_ok=True)
    write_json(os.path.join(directory, "config.json"), config())
    write_json(os.path.join(directory, "generation_config.json"), {"eos_token_id": 2, "max_new_tokens": 16})
    write_json(
        os.path.join(directory, "tokenizer_config.json"),
        {
            "tokenizer_class": "Qwen2Tokenizer",
            "model_max_length": 4096,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        },
    )
    items = list(tensors().items())
    weight_map, total = {}, 0
    for index in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (index + 1, shards)
        part = items[index::shards]
        total += write_safetensors(os.path.join(directory, name), part)
        weight_map.update({item[0]: name for item in part})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(os.path.join(directory, "model.safetensors.index.json"), index)
    return directory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args(argv)
    print(make_model(args.directory, args.shards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
