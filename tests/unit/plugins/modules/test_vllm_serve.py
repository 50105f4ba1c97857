"""vllm_serve with a fake head container (its exec'd helper programs emulated) and a fake HTTP API."""

from __future__ import annotations

import io
import json
import socket
from urllib.error import HTTPError

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_args, _wait
from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_serve
from fake_docker import FakeClient, FakeContainer, FakeExecResult, inspect, use_client
from module_runner import run_module

# What the real lab engine printed for the installed-parser check when vLLM's CLI module is absent
# (recorded on the real Docker engine with a throwaway container).
NO_PARSER = b"ModuleNotFoundError No module named 'vllm'\n"


def free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class Head:
    """The head container's side: the serve process table and what the exec'd programs do."""

    def __init__(self):
        self.state = None
        self.alive = False
        self.launches = []
        self.signals = []
        self.installed_flags = None
        self.die_on_start = False
        self.log = b"INFO loading model\n"

    def handle(self, cmd, **kwargs):
        if cmd[0] == "tail":
            return FakeExecResult(0, self.log)
        script, args = cmd[2], cmd[3:]
        if script == vllm_serve.STATUS:
            return FakeExecResult(0, json.dumps({"state": self.state, "alive": self.alive}).encode())
        if script == vllm_serve.LAUNCH:
            assert kwargs.get("detach") is True
            self.launches.append({"argv": args[4:], "env": kwargs.get("environment")})
            self.state = {"pid": 100 + len(self.launches), "args_hash": args[2], "argv": args[4:]}
            self.alive = not self.die_on_start
            return FakeExecResult(None, None)
        if script == vllm_serve.SIGNAL:
            self.signals.append((int(args[0]), int(args[1])))
            self.alive = False
            return FakeExecResult(0, b"")
        if script == _vllm_args.INSTALLED_FLAGS_SCRIPT:
            if self.installed_flags is None:
                return FakeExecResult(3, NO_PARSER)
            return FakeExecResult(0, json.dumps(sorted(self.installed_flags)).encode())
        raise AssertionError("unexpected exec %r" % cmd[:3])


class Api:
    """The HTTP side: /health, /v1/models, /v1/completions."""

    def __init__(self, head, served="lab-model"):
        self.head = head
        self.served = served
        self.requests = []
        self.health_after = 0

    def open_url(self, url, method="GET", data=None, headers=None, timeout=None, use_proxy=True):  # noqa: PLR0917
        path = url.split(":", 2)[2].split("/", 1)[1]
        self.requests.append((method, "/" + path, dict(headers or {}), data))
        if not self.head.alive:
            raise ConnectionRefusedError(111, "Connection refused")
        if path == "health":
            if self.health_after > 0:
                self.health_after -= 1
                raise ConnectionRefusedError(111, "Connection refused")
            return Resp(200, b"")
        if path == "v1/models":
            return Resp(200, json.dumps({"data": [{"id": self.served}]}).encode())
        if path == "v1/completions":
            return Resp(200, json.dumps({"choices": [{"text": " Paris"}]}).encode())
        raise AssertionError(path)


class Resp(io.BytesIO):
    def __init__(self, code, body):
        super().__init__(body)
        self.code = code

    def getcode(self):
        return self.code


@pytest.fixture
def env(monkeypatch):
    client = use_client(monkeypatch, vllm_serve, FakeClient())
    attrs = inspect("container_ray_head.json")
    attrs["Name"] = "/ray-head"
    container = client.containers.add(FakeContainer(attrs))
    head = Head()
    container.exec_handler = head.handle
    api = Api(head)
    monkeypatch.setattr(vllm_serve, "open_url", api.open_url)

    class Clock:
        now = 0.0

    def fake_wait(check, timeout, interval=1.0):
        def sleep(s):
            Clock.now += s

        return _wait.wait_for(check, timeout, interval, clock=lambda: Clock.now, sleep=sleep)

    monkeypatch.setattr(vllm_serve, "wait_for", fake_wait)
    return head, api


def args(**over):
    base = dict(
        model="/models/lab",
        served_model_name="lab-model",
        tensor_parallel_size=2,
        port=free_port(),
        api_key="s3cret",
        extra_args=["--reasoning-parser", "qwen3", "--enable-prefix-caching"],
        health_timeout=30,
    )
    base.update(over)
    return base


def test_start_verify_and_secret_handling(monkeypatch, env):
    head, api = env
    api.health_after = 3
    failed, res = run_module(monkeypatch, vllm_serve, args())
    assert not failed, res
    assert res["changed"] and res["actions"] == ["started"]
    launch = head.launches[0]
    assert launch["argv"][:3] == ["vllm", "serve", "/models/lab"]
    assert launch["argv"][launch["argv"].index("--tensor-parallel-size") + 1] == "2"
    assert launch["argv"][launch["argv"].index("--distributed-executor-backend") + 1] == "ray"
    # The key travels in the environment only.
    assert "s3cret" not in json.dumps(launch["argv"]) and "s3cret" not in json.dumps(res)
    assert launch["env"]["VLLM_API_KEY"] == "s3cret"
    assert json.loads(launch["env"]["VLLM_DISTRIBUTED_EXECUTOR_CONFIG"]) == {
        "placement_group_options": {"strategy": "SPREAD"}
    }
    assert res["completion"] == " Paris" and res["model"] == "lab-model"
    assert res["endpoint"].endswith("/v1")
    assert set(res["timings"]) >= {"flag_check", "start", "health", "models", "completion"}
    assert res["timings"]["health"] == 0.75  # three 0.25 s polls on the fake clock
    assert res["flag_check"].startswith("upstream table (installed parser not available")
    assert all(h.get("Authorization") == "Bearer s3cret" for m, p, h, d in api.requests if p.startswith("/v1"))


def test_same_args_and_healthy_is_untouched(monkeypatch, env):
    head, _api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and not res["changed"] and res["actions"] == []
    assert len(head.launches) == 1 and head.signals == []


def test_slow_health_answers_do_not_restart(monkeypatch, env):
    head, api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    api.health_after = 2  # two unanswered probes, then 200
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and not res["changed"] and head.signals == []


def test_health_503_restarts_at_once(monkeypatch, env):
    _head, api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    dead = HTTPError("http://head/health", 503, "Service Unavailable", {}, None)
    probes = []
    real = api.open_url

    def engine_dead_once(url, **kwargs):
        if url.endswith("/health") and not probes:
            probes.append(url)
            raise dead
        return real(url, **kwargs)

    monkeypatch.setattr(vllm_serve, "open_url", engine_dead_once)
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and res["changed"] and res["actions"] == ["restarted"] and len(probes) == 1


def test_changed_args_restart(monkeypatch, env):
    head, _api = env
    a = args()
    run_module(monkeypatch, vllm_serve, a)
    failed, res = run_module(monkeypatch, vllm_serve, dict(a, max_model_len=4096))
    assert not failed and res["actions"] == ["restarted"]
    assert head.signals == [(101, 15)]
    assert "--max-model-len" in head.launches[1]["argv"]


def test_changed_key_restarts_without_showing_it(monkeypatch, env):
    a = args()
    first = run_module(monkeypatch, vllm_serve, a)[1]
    second = run_module(monkeypatch, vllm_serve, dict(a, api_key="other"))[1]
    assert second["actions"] == ["restarted"] and first["args_hash"] != second["args_hash"]


def test_check_mode_plans_only(monkeypatch, env):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, dict(args(), _ansible_check_mode=True))
    assert not failed and res["changed"] and head.launches == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--enable-prefix-cachin"], "--enable-prefix-cachin is not a flag of vllm serve"),
        (["--tensor-parallel-size", "1"], "use the option tensor_parallel_size"),
        (["--api-key=x"], "use the option api_key"),
    ],
)
def test_bad_extra_args_refused_before_start(monkeypatch, env, extra, needle):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=extra))
    assert failed and needle in res["msg"]
    assert head.launches == []


def test_installed_parser_wins_over_the_table(monkeypatch, env):
    head, _api = env
    managed = {"--served-model-name", "--tensor-parallel-size", "--pipeline-parallel-size"}
    head.installed_flags = managed | {"--distributed-executor-backend", "--host", "--port", "--brand-new-flag"}
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=["--brand-new-flag"]))
    assert not failed, res
    assert res["flag_check"] == "installed parser"
    # The table does not know the new flag; the installed parser does.
    assert _vllm_args.check_extra_args(["--brand-new-flag"])


def test_installed_parser_missing_an_emitted_flag(monkeypatch, env):
    head, _api = env
    head.installed_flags = {"--served-model-name", "--host", "--port", "--enable-prefix-caching"}
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=["--enable-prefix-caching"]))
    assert failed and "has no --tensor-parallel-size flag" in res["msg"]


def test_port_in_use_fails_before_start(monkeypatch, env):
    head, _api = env
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        failed, res = run_module(monkeypatch, vllm_serve, args(port=listener.getsockname()[1]))
    finally:
        listener.close()
    assert failed and "already in use on the head" in res["msg"]
    assert head.launches == []


def test_process_death_fails_fast_with_log(monkeypatch, env):
    head, _api = env
    head.die_on_start = True
    head.log = b"ValueError: tensor parallel size (2) exceeds available GPUs (1)\n"
    failed, res = run_module(monkeypatch, vllm_serve, args(health_timeout=600))
    assert failed
    assert "exceeds available GPUs" in res["msg"]
    # Launch was seen, then the process was gone: no 600 s wait.
    assert res["timings"]["start"] == 0.0


def test_absent_stops(monkeypatch, env):
    head, _api = env
    run_module(monkeypatch, vllm_serve, args())
    failed, res = run_module(monkeypatch, vllm_serve, dict(state="absent"))
    assert not failed and res["actions"] == ["stopped"] and head.signals == [(101, 15)]
    failed, res = run_module(monkeypatch, vllm_serve, dict(state="absent"))
    assert not failed and not res["changed"]


def test_checked_state_validates_only(monkeypatch, env):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, dict(args(), state="checked"))
    assert not failed and not res["changed"] and head.launches == []
    assert res["command"][1] == "serve"
