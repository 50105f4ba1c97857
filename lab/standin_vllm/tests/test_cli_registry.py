"""Command line and registry of the stand-in, without Ray."""

import subprocess
import sys

import pytest
from conftest import env
from vllm import ModelRegistry, __version__
from vllm.engine import spread_strategy
from vllm.entrypoints.cli import build_parser
from vllm.entrypoints.server import read_model_config

COLLECTION_FLAGS = [
    "serve", "/models/m",
    "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--distributed-executor-backend", "ray",
    "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "qwen35", "--max-model-len", "8192",
    "--gpu-memory-utilization", "0.85", "--api-key", "k", "--trust-remote-code", "--dtype", "bfloat16",
    "--kv-cache-dtype", "fp8", "--enforce-eager", "--max-num-seqs", "4", "--load-format", "safetensors",
]  # fmt: skip


def test_version_says_stand_in():
    assert __version__.endswith("+lab.standin")


def test_collection_flags_parse():
    args = build_parser().parse_args(COLLECTION_FLAGS)
    assert args.tensor_parallel_size == 2
    assert args.served_model_name == ["qwen35"]
    assert args.kv_cache_dtype == "fp8"
    assert args.enforce_eager is True


def test_unknown_flag_rejected_like_argparse():
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli", "serve", "/m", "--tensor-paralel-size", "2"],
        capture_output=True, text=True, env=env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unrecognized arguments: --tensor-paralel-size" in proc.stderr


def test_registry_has_qwen35_in_donor_variant():
    assert "Qwen3_5MoeForConditionalGeneration" in ModelRegistry.get_supported_archs()


def test_unsupported_arch_refused_with_vllm_message():
    with pytest.raises(ValueError, match=r"Model architectures \['FooForCausalLM'\] are not supported for now\. "):
        ModelRegistry.resolve_model_cls(["FooForCausalLM"])


def test_register_model_adds_arch():
    ModelRegistry.register_model("BarForCausalLM", "bar.module:Bar")
    assert ModelRegistry.resolve_model_cls(["BarForCausalLM"]) == ("BarForCausalLM", "bar.module:Bar")


@pytest.mark.parametrize(
    ("bundles", "nodes", "strategy"), [(2, 2, "STRICT_SPREAD"), (1, 2, "STRICT_SPREAD"), (4, 2, "SPREAD")]
)
def test_spread_strategy(bundles, nodes, strategy):
    assert spread_strategy(bundles, nodes) == strategy


def test_model_without_config_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        read_model_config(str(tmp_path))
