"""The lab model generator, run where the lab runs it: in the real-engine image (torch, transformers)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess

from conftest import ROOT

GENERATOR = os.path.join(ROOT, "lab", "make_model.py")
_spec = importlib.util.spec_from_file_location("make_model", GENERATOR)
mm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mm)


def digests(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as handle:
            out[name] = hashlib.sha256(handle.read()).hexdigest()
    return out


def test_generator_writes_the_same_sharded_bf16_model_twice(tmp_path, engine_image):
    # Run as the lab role runs it: inside the real-engine image, offline, its transformers' own classes.
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network=none",
                "--entrypoint=python3",
                "-v",
                "%s:/lab/make_model.py:ro" % GENERATOR,
                "-v",
                "%s:/out" % folder,
                engine_image,
                "/lab/make_model.py",
                "/out",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    assert digests(folders[0]) == digests(folders[1])
    names = set(os.listdir(folders[0]))
    assert names >= {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert "lab-model.json" in names
    index = json.loads((folders[0] / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert 2 <= len(shards) <= 4 and names >= set(shards)
    total = index["metadata"]["total_size"]
    assert total > 1 << 20, "a few MB of weights expected, got %d bytes" % total
    assert total < 16 << 20, "a tiny model expected, got %d bytes" % total
    for shard in shards:
        with open(folders[0] / shard, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        assert {info["dtype"] for key, info in header.items() if key != "__metadata__"} == {"BF16"}
    config = json.loads((folders[0] / "config.json").read_text())
    assert config["architectures"] == [mm.ARCH] and config["model_type"] == "qwen3_5_moe"
    assert config["image_token_id"] == mm.token_ids()["<|image_pad|>"]
    about = json.loads((folders[0] / "lab-model.json").read_text())
    assert about["description"] == mm.DESCRIPTION
    assert about["input_sha256"] == mm.input_hash(mm.spec())
