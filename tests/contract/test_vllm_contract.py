"""Every vLLM flag, environment variable and API the collection uses, against the real vLLM package."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _image, _nccl_env, _vllm_args, _vllm_bench
from conftest import ROOT


@pytest.fixture(scope="module")
def engine(in_image):
    """The installed engine's answer to the collection's own ask script: (flags, version)."""
    rc, out, err = in_image(_vllm_args.INSTALLED_FLAGS_SCRIPT, "300", timeout=400)
    assert rc == 0, err[-2000:]
    answer, why = _vllm_args.read_answer(out)
    assert answer, why
    flags, version, why = _vllm_args.flags_from_answer(answer)
    assert flags, why
    return flags, version


def profile_args(inventory):
    with open(os.path.join(ROOT, "inventories", inventory, "group_vars", "spark", "model.yml")) as f:
        return yaml.safe_load(f)["vllm_server_extra_args"]


def test_the_engine_is_the_pinned_cpu_build(engine):
    _flags, version = engine
    assert version == "0.32.0+cpu"


# The Ray backend, and each rank of the mp backend (the head; a --headless worker).
BACKENDS = {
    "ray": {},
    "mp-head": dict(backend="mp", nnodes=2, node_rank=0, master_addr="198.18.100.11", master_port=29501),
    "mp-worker": dict(backend="mp", nnodes=2, node_rank=1, master_addr="198.18.100.11", master_port=29501),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_flag_the_module_emits_exists(engine, backend):
    flags, _version = engine
    assert _vllm_args.missing_emitted(flags) == []
    argv = _vllm_args.serve_argv(
        dict(
            model="/m",
            served_model_name="m",
            tensor_parallel_size=2,
            pipeline_parallel_size=1,
            host="198.18.100.11",
            port=8000,
            max_model_len=512,
            gpu_memory_utilization=0.8,
            extra_args=[],
            **BACKENDS[backend],
        )
    )
    emitted = _vllm_args.flag_names(argv[3:])
    assert [n for n in emitted if n not in flags] == []
    if backend != "ray":
        assert {"--nnodes", "--node-rank", "--master-addr", "--master-port"} <= set(emitted)


@pytest.mark.parametrize("inventory", ["spark", "lab"])
def test_every_profile_flag_is_accepted(engine, inventory):
    flags, version = engine
    where = _vllm_args.engine_where(version, "sha256:contract")
    assert _vllm_args.check_extra_args(profile_args(inventory), flags, where) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--attention-backend", "FLASH_ATTN"],
        ["-O3"],
        ["--max-cudagraph-capture-size", "512"],
        ["--mm-processor-cache-type", "shm"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"],
        ["--language-model-only"],
        ["--no-enable-prefix-caching"],
    ],
)
def test_recipe_flags_pass(engine, args):
    flags, version = engine
    assert _vllm_args.check_extra_args(args, flags, _vllm_args.engine_where(version, "sha256:contract")) == []


def test_an_underscore_flag_is_read_as_vllm_reads_it(engine):
    # --max_model_len is vLLM's --max-model-len; the module sets that one itself from max_model_len.
    flags, version = engine
    problems = _vllm_args.check_extra_args(["--max_model_len", "512"], flags, _vllm_args.engine_where(version, "x"))
    assert len(problems) == 1 and "vllm_server_max_model_len" in problems[0]
    assert "not a flag" not in problems[0]


def test_a_removed_flag_is_refused_naming_the_engine(engine):
    flags, version = engine
    problems = _vllm_args.check_extra_args(["--swap-space", "4"], flags, _vllm_args.engine_where(version, "sha256:c"))
    assert len(problems) == 1
    assert "--swap-space" in problems[0] and "0.32.0+cpu" in problems[0]


def test_a_misspelled_flag_gets_the_closest_name(engine):
    flags, version = engine
    problems = _vllm_args.check_extra_args(["--max-model-lenn", "512"], flags, _vllm_args.engine_where(version, "x"))
    assert len(problems) == 1 and "--max-model-len" in problems[0].split("did you mean")[1]


ENVS = r"""
import json, vllm.envs as envs
print(json.dumps(sorted(envs.environment_variables)))
"""


def test_vllm_environment_variables(in_image):
    rc, out, err = in_image(ENVS)
    assert rc == 0, err[-2000:]
    known = set(json.loads(out.strip().splitlines()[-1]))
    used = {
        _vllm_args.API_KEY_ENV,
        # nccl_env gives every serving container VLLM_HOST_IP.
        *(
            k
            for k in _nccl_env.build_env(
                [{"name": "e", "address": "198.18.100.11/24"}], "198.18.100.11", allow_socket_fallback=True
            )[0]
            if k.startswith("VLLM_")
        ),
    }
    assert used <= known, sorted(used - known)
    # _vllm_args documents that upstream vLLM does not read the placement variable: hold it to that.
    assert _vllm_args.PLACEMENT_ENV not in known


def test_the_verification_script_on_the_real_engine(in_image):
    # vllm_image's own verification (pip check, imports, registry, AutoConfig) against the lab model's config.
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
    rc, out, err = in_image(_image.VERIFY_SCRIPT, env={"VLLM_IMAGE_MODEL_CONFIG": json.dumps(config)}, timeout=300)
    assert rc == 0, err[-2000:]
    # The lab's image has ray[default] (every node's Ray metrics): Ray's own test finds its agent's packages.
    facts, causes = _image.evaluate(_image.parse_verification(out), config["architectures"], require_ray_agent=True)
    assert causes == []
    assert facts["ray_agent"] is True
    assert facts["architecture_supported"] and facts["vllm_version"] == "0.32.0"
    assert facts["ray_version"] == "2.60.0" and facts["autoconfig_class"] == "Qwen3_5MoeConfig"


def test_the_verification_tells_plain_ray_from_ray_default(plain_ray_image):
    # Real plain ray (the lab's old-engine image): Ray's own test misses its agent's packages, so an image for
    # every node's Ray metrics is refused, naming the variable and the fix.
    argv = ["docker", "run", "--rm", "--network=none", "--entrypoint=python3", plain_ray_image]
    res = subprocess.run(
        [*argv, "-c", _image.VERIFY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    result = _image.parse_verification(res.stdout)
    assert result["ray"]["version"] == "2.60.0" and result["ray_agent_error"], result
    facts, causes = _image.evaluate(result, [], require_ray_agent=True)
    assert facts["ray_agent"] is False
    assert [c for c in causes if "ray_cluster_metrics_export_port" in c], causes


BENCH_HELP = r"""
import subprocess, sys
res = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--help=all"],
                     capture_output=True, text=True, timeout=240)
print(res.stdout)
sys.exit(res.returncode)
"""


@pytest.fixture(scope="module")
def bench_flags(in_image):
    """The flags the real engine's `vllm bench serve --help=all` lists (asked once: the import is slow)."""
    rc, out, err = in_image(BENCH_HELP, timeout=300)
    assert rc == 0, err[-2000:]
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", out))


@pytest.mark.parametrize("load", ["concurrency", "request_rate"])
def test_every_bench_serve_flag_the_benchmark_emits_exists(bench_flags, load):
    """The benchmark role's `vllm bench serve` flags, against the real engine's own help."""
    listed = bench_flags
    shape = dict(input_len=16, output_len=8, num_prompts=4, load=load, points=[1.0, 2.0])
    params = dict(shape=shape, base_url="http://198.18.100.11:8000", model="m", tokenizer="/m", warmups=0, seed=0)
    emitted = [a for a in _vllm_bench.point_argv(params, 2.0) if a.startswith("--")]
    assert len(emitted) > 15
    assert [flag for flag in emitted if flag not in listed] == []


# Where the real torch, vLLM and Triton put their compile caches, with the environment the ray_cluster role
# gives every engine container (roles/ray_cluster/vars/main.yml, below ray_cluster_cache_dir).
CACHE_DIRS = r"""
import json
import torch._inductor.runtime.cache_dir_utils as inductor
import triton
import vllm.envs as envs
print(json.dumps({"TORCHINDUCTOR_CACHE_DIR": inductor.cache_dir(), "VLLM_CACHE_ROOT": envs.VLLM_CACHE_ROOT,
                  "TRITON_CACHE_DIR": triton.knobs.cache.dir}))
"""


def test_the_engine_cache_variables_move_each_cache(in_image):
    with open(os.path.join(ROOT, "roles", "ray_cluster", "vars", "main.yml"), encoding="utf-8") as fh:
        subdirs = yaml.safe_load(fh)["_ray_cluster_cache_env"]
    env = {name: "/var/cache/dgx-spark/engine/" + sub for name, sub in subdirs.items()}
    rc, out, err = in_image(CACHE_DIRS, env=env)
    assert rc == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1]) == env
