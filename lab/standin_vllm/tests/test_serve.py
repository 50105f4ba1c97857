"""The stand-in served over a real local Ray cluster with two declared GPUs."""

import json
import time

import pytest
from conftest import http, start_server

KEY = "lab-key"


@pytest.fixture(scope="module")
def server(ray_cluster, model_dir, tmp_path_factory):
    srv = start_server(
        tmp_path_factory.mktemp("serve"), ray_cluster,
        [model_dir, "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray",
         "--served-model-name", "qwen35", "--api-key", KEY],
    )  # fmt: skip
    yield srv
    srv.proc.terminate()
    srv.proc.wait(timeout=30)


def test_banner_and_spread(server):
    out = server.output()
    assert "LAB STAND-IN" in out
    # one node, two bundles: SPREAD (STRICT_SPREAD needs a node per bundle)
    assert "placement group strategy: SPREAD" in out
    assert "worker rank 1 on node lab-node" in out


def test_health(server):
    assert http("GET", server.url + "/health")[0] == 200


def test_models_need_key_and_name_stand_in(server):
    assert http("GET", server.url + "/v1/models")[0] == 401
    code, body = http("GET", server.url + "/v1/models", key=KEY)
    assert code == 200
    assert json.loads(body)["data"][0]["owned_by"] == "vllm-lab-standin"
    assert json.loads(body)["data"][0]["id"] == "qwen35"


def test_completion_through_every_worker(server):
    assert http("POST", server.url + "/v1/completions", {"model": "qwen35", "prompt": "hi"})[0] == 401
    code, body = http("POST", server.url + "/v1/completions", {"model": "qwen35", "prompt": "hi", "max_tokens": 4}, KEY)
    assert code == 200
    text = json.loads(body)["choices"][0]["text"]
    assert "rank 0 on lab-node" in text
    assert "rank 1 on lab-node" in text


def test_chat_completion(server):
    body = {"model": "qwen35", "messages": [{"role": "user", "content": "hello there"}]}
    code, out = http("POST", server.url + "/v1/chat/completions", body, KEY)
    assert code == 200
    reply = json.loads(out)
    assert reply["object"] == "chat.completion"
    assert "rank 1" in reply["choices"][0]["message"]["content"]
    assert reply["usage"]["prompt_tokens"] == 2


def test_unknown_model_404(server):
    assert http("POST", server.url + "/v1/completions", {"model": "nope", "prompt": "x"}, KEY)[0] == 404


def test_metrics_prometheus_text(server):
    code, body = http("GET", server.url + "/metrics")
    assert code == 200
    assert "# TYPE vllm:request_success_total counter" in body
    assert 'vllm:lab_standin_workers{model_name="qwen35"} 2' in body


def test_health_503_after_worker_died(server, ray_cluster):
    import ray  # noqa: PLC0415
    from vllm.engine import NAMESPACE, worker_name  # noqa: PLC0415

    ray.init(address=ray_cluster, namespace=NAMESPACE, logging_level="error")
    try:
        ray.kill(ray.get_actor(worker_name("qwen35", 1)))
    finally:
        ray.shutdown()
    deadline = time.monotonic() + 20
    while http("GET", server.url + "/health")[0] != 503:
        assert time.monotonic() < deadline, "health never turned 503 after a worker died"
        time.sleep(0.5)
