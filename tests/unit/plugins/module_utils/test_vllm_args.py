"""vllm serve argv, flag checks and argument hash."""

from __future__ import annotations

import json

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_args

PROFILE = dict(
    model="/models/Qwen3.5-122B-A10B-FP8",
    served_model_name="qwen3.5-122b",
    tensor_parallel_size=2,
    pipeline_parallel_size=1,
    host="0.0.0.0",  # noqa: S104
    port=8000,
    max_model_len=65536,
    gpu_memory_utilization=0.8,
    extra_args=["--reasoning-parser", "qwen3"],
    env={},
    placement_strategy="SPREAD",
    api_key="k",
)


def test_argv_in_upstream_order_and_spelling():
    argv = _vllm_args.serve_argv(PROFILE)
    assert argv[:3] == ["vllm", "serve", "/models/Qwen3.5-122B-A10B-FP8"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--tensor-parallel-size"] == "2"
    assert pairs["--pipeline-parallel-size"] == "1"
    assert pairs["--distributed-executor-backend"] == "ray"
    assert pairs["--max-model-len"] == "65536"
    assert pairs["--gpu-memory-utilization"] == "0.8"
    assert argv[-2:] == ["--reasoning-parser", "qwen3"]
    assert "--api-key" not in argv and "k" not in argv


MP = dict(PROFILE, backend="mp", nnodes=2, master_addr="198.18.120.11", master_port=29501)


def test_mp_ranks_share_one_command_but_their_rank_and_headless():
    head = _vllm_args.serve_argv(dict(MP, node_rank=0))
    worker = _vllm_args.serve_argv(dict(MP, node_rank=1))
    pairs = dict(zip(head[3::2], head[4::2], strict=False))
    assert pairs["--distributed-executor-backend"] == "mp"
    assert pairs["--nnodes"] == "2" and pairs["--node-rank"] == "0"
    assert pairs["--master-addr"] == "198.18.120.11" and pairs["--master-port"] == "29501"
    assert "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and "--headless" in worker
    as_head = [a for a in worker if a != "--headless"]
    as_head[as_head.index("--node-rank") + 1] = "0"
    assert as_head == head
    # The extra arguments stay last on every rank.
    assert head[-2:] == worker[-2:] == ["--reasoning-parser", "qwen3"]


def test_mp_on_one_node_has_no_multi_node_flags():
    argv = _vllm_args.serve_argv(dict(MP, nnodes=1, node_rank=0))
    assert "--nnodes" not in argv and "--headless" not in argv and "--master-addr" not in argv


def test_mp_env_has_no_ray_placement_and_the_key_only_on_the_head():
    assert _vllm_args.PLACEMENT_ENV not in _vllm_args.serve_env(dict(MP, node_rank=0))
    assert _vllm_args.serve_env(dict(MP, node_rank=0))["VLLM_API_KEY"] == "k"
    assert "VLLM_API_KEY" not in _vllm_args.serve_env(dict(MP, node_rank=1))


def test_joined_ranks_read_from_a_rank_log():
    log = (
        "INFO 11-30 21:10:02 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 "
        "distributed_init_method=tcp://198.18.120.11:29501 backend=gloo\n"
        "INFO 11-30 21:10:05 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0, "
        "PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank 1, EPLB rank N/A\n"
    )
    assert _vllm_args.joined_ranks(log) == [1]
    assert _vllm_args.joined_ranks(log.splitlines()[0]) == []


def test_optional_flags_left_out():
    argv = _vllm_args.serve_argv(dict(PROFILE, max_model_len=None, gpu_memory_utilization=None, extra_args=[]))
    assert "--max-model-len" not in argv and "--gpu-memory-utilization" not in argv


def test_env_has_key_and_placement():
    env = _vllm_args.serve_env(PROFILE)
    assert env["VLLM_API_KEY"] == "k"
    assert json.loads(env[_vllm_args.PLACEMENT_ENV])["placement_group_options"]["strategy"] == "SPREAD"
    assert _vllm_args.PLACEMENT_ENV not in _vllm_args.serve_env(dict(PROFILE, placement_strategy="none"))


def test_hash_changes_with_args_and_key_but_never_holds_the_key():
    argv = _vllm_args.serve_argv(PROFILE)
    env = _vllm_args.serve_env(PROFILE)
    base = _vllm_args.args_hash(argv, env)
    assert base == _vllm_args.args_hash(list(argv), dict(env))
    assert base != _vllm_args.args_hash([*argv, "--enforce-eager"], env)
    assert base != _vllm_args.args_hash(argv, dict(env, VLLM_API_KEY="other"))
    assert _vllm_args.redacted_env(env)["VLLM_API_KEY"] == "********"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (["--enable-prefix-caching", "--reasoning-parser", "qwen3"], None),
        (["--no-enable-prefix-caching"], None),
        (["--max-num-seqs=8"], None),
        (["-O", "3"], None),
        (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'], None),
        (["--enable-prefix-cachin"], "is not a flag of vllm serve"),
        (["--tp", "2"], "is not a flag"),
        (["-tp", "2"], "use the option tensor_parallel_size"),
        (["--nnodes", "2"], "inventory's spark group"),
        (["--headless"], "every node but the head"),
        (["--master-port=29600"], "vllm_server_mp_port"),
        (["--distributed-executor-backend", "mp"], "vllm_server_backend"),
        (["--port=9000"], "use the option port"),
        (["--gpu-memory-utilization", "0.9"], "use the option gpu_memory_utilization"),
        (["--enforce-eager \\"], "shell line fragment"),
        (["\\"], "shell line fragment"),
        (["--hf-token", "hf_abc"], "set HF_TOKEN in vllm_server_env"),
        (["--max_model_len=4096"], "use the option max_model_len (vllm_server_max_model_len)"),
        (["-O3", "--attention-backend", "FLASHINFER", "--mm-processor-cache-type", "shm"], None),
        (["--swap-space", "4"], "--swap-space is not a flag of vllm serve in the built-in table of vLLM 0.33.0"),
    ],
)
def test_check_extra_args(extra, problem):
    problems = _vllm_args.check_extra_args(extra)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_negative_numbers_are_values_not_flags():
    assert _vllm_args.flag_names(["--seed", "-1"]) == ["--seed"]


def test_check_against_an_installed_parser_list():
    assert _vllm_args.check_extra_args(["--new-flag"], known=frozenset({"--new-flag"})) == []
    assert _vllm_args.check_extra_args(["--enable-prefix-caching"], known=frozenset({"--new-flag"}))
