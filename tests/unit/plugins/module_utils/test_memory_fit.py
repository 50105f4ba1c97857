"""The memory-fit check: weights and one max_model_len sequence against each node's MemTotal x utilization."""

from __future__ import annotations

import json
import os
import types

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _memory_fit

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "memory_fit")
BIG = "qwen3.5-122b-a10b-fp8.built-from-published-numbers"
LAB = "lab-qwen3.5-moe-tiny"
GIB = 1 << 30


def fixture(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as handle:
        return handle.read()


def config(name):
    return json.loads(fixture(name + ".config.json"))


def nodes(meminfo, count=2):
    return [{"host": "spark-%d" % (i + 1), "meminfo": fixture(meminfo)} for i in range(count)]


def params(**over):
    p = dict(
        tensor_parallel_size=2,
        pipeline_parallel_size=1,
        max_model_len=65536,
        gpu_memory_utilization=0.80,
        extra_args=["--reasoning-parser", "qwen3", "--enable-prefix-caching"],
    )
    p.update(over)
    return p


# The 122B profile (inventories/spark): TP=2, max_model_len 65536, utilization 0.80, 119 GB of weights.
WEIGHTS = 119_000_000_000
SOURCE = "metadata.total_size of /var/lib/dgx-spark/models/Qwen3.5-122B-A10B-FP8/model.safetensors.index.json"
# 12 full-attention layers x 1 KV head per rank (2 // TP 2) x head_dim 256 x 2 (K, V) x 2 bytes x 65536 tokens
KV = 12 * 1 * 256 * 2 * 2 * 65536
# 36 Gated DeltaNet layers, per rank: conv 3 x (128*16*2 + 128*64) / 2 x 2 bytes + (64 / 2) x 128 x 128 x 4 bytes
STATE = 36 * (3 * 6144 * 2 + 32 * 128 * 128 * 4)


def test_the_122b_profile_on_64gb_nodes_is_refused_with_the_numbers_and_the_fixes():
    found, report = _memory_fit.check(params(), config(BIG), WEIGHTS, SOURCE, nodes("meminfo-64gb-node.built.txt"))
    assert report["check"] == "refused"
    assert report["kv_per_node_bytes"] == KV + STATE
    assert report["need_per_node_bytes"] == WEIGHTS // 2 + KV + STATE
    (msg,) = found
    assert msg.startswith(
        "memory: vllm_server_tensor_parallel_size 2 x vllm_server_pipeline_parallel_size 1 over 2 nodes cannot fit. "
        "Per node: weights 55.41 GiB (119.0 GB from " + SOURCE
    )
    assert (
        "KV cache 0.82 GiB for one sequence of vllm_server_max_model_len 65536 (12 full-attention layers x 1 KV heads"
        in msg
    )
    assert "plus the fixed state of 36 linear-attention layers" in msg
    assert "= 56.24 GiB needed" in msg
    assert (
        "over the budget of spark-1, spark-2: MemTotal 64.00 GiB x vllm_server_gpu_memory_utilization 0.80 = 51.20 GiB"
        in msg
    )
    assert "more nodes (at least 3 of this memory)" in msg
    assert "a lower vllm_server_max_model_len alone cannot help" in msg
    assert "a higher vllm_server_gpu_memory_utilization (0.88 or more" in msg


def test_the_122b_profile_fits_two_128gb_sparks():
    found, report = _memory_fit.check(
        params(), config(BIG), WEIGHTS, SOURCE, nodes("meminfo-gb10-128gb.built-from-published-numbers.txt")
    )
    assert found == []
    assert report["check"] == "fits: 56.24 GiB needed per node, 96.80 GiB allowed on the tightest"
    assert report["kv"]["full_attention_layers"] == 12 and report["kv"]["linear_attention_layers"] == 36
    assert [n["budget_bytes"] for n in report["nodes"]] == [int(121 * GIB * 0.8)] * 2


def test_vllms_default_utilization_and_the_models_own_length_are_used_when_unset():
    unset = params(gpu_memory_utilization=None, max_model_len=None)
    found, report = _memory_fit.check(unset, config(BIG), WEIGHTS, SOURCE, nodes("meminfo-64gb-node.built.txt"))
    assert report["gpu_memory_utilization"] == 0.92 and report["max_model_len"] == 262144
    # A node with the full nominal 64 GiB would pass at vLLM's 0.92 by 0.39 GiB (a real one shows less).
    assert found == [] and report["check"] == "fits: 58.49 GiB needed per node, 58.88 GiB allowed on the tightest"
    long = dict(unset, max_model_len=10_000_000)
    spark = nodes("meminfo-gb10-128gb.built-from-published-numbers.txt")
    (msg,), _report = _memory_fit.check(long, config(BIG), WEIGHTS, SOURCE, spark)
    assert "x vllm_server_gpu_memory_utilization 0.92 (vLLM's default) = 111.32 GiB" in msg
    # The budget less the weights' share and the linear-attention state, over 12 KiB of KV per token.
    longest = int((121 * GIB * 0.92 - WEIGHTS / 2 - STATE) // (12 * 1024))
    assert "a lower vllm_server_max_model_len (at most %d fits here)" % longest in msg


def test_the_lab_model_fits_the_lab_and_a_huge_max_model_len_does_not():
    lab = params(max_model_len=512, gpu_memory_utilization=None, extra_args=["--dtype", "bfloat16"])
    found, report = _memory_fit.check(lab, config(LAB), 3302064, "index", nodes("meminfo-dev-machine.txt"))
    assert found == [] and report["check"] == "fits: 1.90 MiB needed per node, 21.66 GiB allowed on the tightest"
    # One full-attention layer (layer_types) x 1 KV head per rank x head_dim 64 x 2 x 2 bytes = 256 bytes a token.
    assert report["kv"]["kv_bytes_per_token"] == 256 and report["kv"]["linear_attention_layers"] == 3
    found, report = _memory_fit.check(
        dict(lab, max_model_len=1_000_000_000), config(LAB), 3302064, "index", nodes("meminfo-dev-machine.txt")
    )
    (msg,) = found
    assert "KV cache 238.42 GiB for one sequence of vllm_server_max_model_len 1000000000" in msg
    assert "a lower vllm_server_max_model_len (at most 90" in msg
    assert "no vllm_server_gpu_memory_utilization can help" in msg
    assert "more nodes alone cannot help" in msg and "weights 1.57 MiB (3302064 bytes from index" in msg


def test_layer_kinds_from_layer_types_the_interval_or_every_layer():
    assert _memory_fit.layer_kinds(config(LAB)["text_config"]).count("full_attention") == 1
    kinds = _memory_fit.layer_kinds(config(BIG)["text_config"])
    assert len(kinds) == 48 and [i for i, k in enumerate(kinds) if k == "full_attention"][:2] == [3, 7]
    assert _memory_fit.layer_kinds({"num_hidden_layers": 3}) == ["full_attention"] * 3


def test_pp_slices_are_vllms():
    assert _memory_fit.pp_slices(48, 2) == [(0, 24), (24, 48)]
    # get_pp_indices: 10 layers over 4 ranks -> [2, 3, 3, 2]
    assert _memory_fit.pp_slices(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]


def test_pp_counts_the_heaviest_ranks_layers():
    _found, report = _memory_fit.check(
        params(tensor_parallel_size=1, pipeline_parallel_size=2),
        config(BIG),
        WEIGHTS,
        SOURCE,
        nodes("meminfo-gb10-128gb.built-from-published-numbers.txt"),
    )
    # 24 layers per rank: 6 full attention, each rank holding both KV heads.
    assert report["kv"]["full_attention_layers"] == 6 and report["kv"]["kv_heads_per_rank"] == 2


def test_kv_cache_dtype_flags():
    text = config(BIG)
    fp8 = _memory_fit.kv_per_rank(text, 2, 1, 65536, ["--kv-cache-dtype=fp8"])[1]
    assert fp8["kv_dtype_bytes"] == 1 and fp8["kv_bytes_per_token"] == 12 * 512
    assert _memory_fit.kv_per_rank(text, 2, 1, 65536, ["--kv_cache_dtype", "fp8_e5m2"])[1]["kv_dtype_bytes"] == 1
    assert _memory_fit.kv_per_rank(text, 2, 1, 65536, ["--dtype", "float32"])[1]["kv_dtype_bytes"] == 4
    assert _memory_fit.kv_per_rank(text, 2, 1, 65536, ["--kv-cache-dtype", "nvfp4"]) == (
        None,
        "--kv-cache-dtype nvfp4 is not sized here",
    )


def test_deferred_and_skipped_never_guess():
    p, big, mem = params(), config(BIG), nodes("meminfo-gb10-128gb.built-from-published-numbers.txt")
    found, report = _memory_fit.check(p, big, None, "the hub did not answer", mem)
    assert found == [] and report["check"].startswith("deferred: the weights' size is not known (the hub did not")
    found, report = _memory_fit.check(p, None, WEIGHTS, "hub", mem)
    assert found == [] and report["check"].startswith("deferred: the weights fit; KV cache not counted yet")
    assert _memory_fit.check(p, big, WEIGHTS, SOURCE, [])[1]["check"] == "skipped: node_memory not given"
    bad = [{"host": "spark-1", "meminfo": "MemFree: 1 kB\n"}]
    assert _memory_fit.check(p, big, WEIGHTS, SOURCE, bad)[1]["check"] == "skipped: no MemTotal read on spark-1"


def test_weights_alone_over_the_budget_are_refused_before_the_config_is_there():
    (msg,), report = _memory_fit.check(params(), None, WEIGHTS, "hub", nodes("meminfo-64gb-node.built.txt"))
    assert report["check"] == "refused" and "KV cache not counted yet (no config.json on this node yet)" in msg


def test_mem_total():
    assert _memory_fit.mem_total(fixture("meminfo-dev-machine.txt")) == 24684084 * 1024
    assert _memory_fit.mem_total("") is None


def test_disk_weights_from_the_index_else_the_shards(tmp_path):
    assert _memory_fit.disk_weights(str(tmp_path / "none"))[0] is None
    assert _memory_fit.disk_weights(str(tmp_path)) == (None, "no *.safetensors in %s yet" % tmp_path)
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 5)
    assert _memory_fit.disk_weights(str(tmp_path)) == (15, "2 *.safetensors files in %s" % tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(fixture(LAB + ".index.json"))
    size, source = _memory_fit.disk_weights(str(tmp_path))
    assert size == 3302064 and source.startswith("metadata.total_size of ")


class FakeHub:
    """HfApi.model_info(files_metadata=True) as huggingface_hub returns it: siblings with rfilename and size."""

    def __init__(self, files=None, error=None):
        self.files, self.error, self.asked = files or {}, error, []

    def model_info(self, repo_id, revision=None, token=None, files_metadata=False, timeout=None):
        self.asked.append((repo_id, revision, token, files_metadata, timeout))
        if self.error:
            raise self.error
        siblings = [types.SimpleNamespace(rfilename=name, size=size) for name, size in self.files.items()]
        return types.SimpleNamespace(siblings=siblings)


def test_the_hub_file_list_sizes_a_model_not_downloaded_yet(tmp_path):
    hub = FakeHub({"config.json": 4000, "model-00001-of-00002.safetensors": 70, "model-00002-of-00002.safetensors": 30})
    missing = str(tmp_path / "Qwen3.5-122B-A10B-FP8")
    size, source = _memory_fit.weights_size(missing, "Qwen/Qwen3.5-122B-A10B-FP8", None, "tok", api=hub)
    assert size == 100 and source == "the hub's file list of Qwen/Qwen3.5-122B-A10B-FP8 (2 *.safetensors)"
    assert hub.asked == [("Qwen/Qwen3.5-122B-A10B-FP8", None, "tok", True, 30)]
    # A directory on disk is never asked about.
    assert _memory_fit.weights_size(str(tmp_path), "Qwen/x", api=hub)[0] is None and len(hub.asked) == 1


@pytest.mark.parametrize(
    "hub",
    [
        FakeHub(error=OSError("Network is unreachable\nmore")),
        FakeHub(error=TimeoutError()),
        FakeHub({"model.safetensors": None}),
        FakeHub({}),
    ],
)
def test_a_hub_that_cannot_tell_defers(tmp_path, hub):
    size, source = _memory_fit.weights_size(str(tmp_path / "m"), "Qwen/x", api=hub)
    assert size is None and "is not on this node yet; the hub" in source


def test_flag_value_reads_as_vllm():
    assert _memory_fit.flag_value(["--kv-cache-dtype=fp8", "--dtype", "half"], "--kv-cache-dtype") == "fp8"
    assert _memory_fit.flag_value(["--dtype", "half"], "--dtype") == "half"
    assert _memory_fit.flag_value(["--enforce-eager"], "--dtype") is None
