"""vllm_serve with a fake head container (its exec'd helper programs emulated) and a fake HTTP API."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import threading
import time
import types
from urllib.error import HTTPError

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _docker, _ray, _vllm_args, _wait
from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_serve
from docker.errors import APIError, ContainerError
from fake_docker import FakeClient, FakeContainer, FakeExecResult, inspect, use_client
from module_runner import FIXTURES, fixture_text, run_module

# What the flag-asking script printed, run by Debian's python3 on a machine without vLLM.
NO_ENGINE = (
    b'\nDGX_SPARK_VLLM_FLAGS {"version": null, "help": "", "command": null, "error": "vllm is not '
    b"importable: ModuleNotFoundError: No module named 'vllm'; /usr/bin/python3 -m vllm.entrypoints.cli.main serve "
    b"--help=all exited 1: /usr/bin/python3: Error while finding module specification for "
    b"'vllm.entrypoints.cli.main' (ModuleNotFoundError: No module named 'vllm')\"}\n"
)
HEAD_IMAGE = "sha256:a9d32715c8c0860700c649c56001714a48d23815d2a4109c691b1a3f4b848fe7"
NEW_IMAGE = "sha256:5f0e6a3b1c2d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccdd"


def answer(release, **over):
    """The flag-asking script's output for an engine of a release (its recorded real help text)."""
    with open(os.path.join(FIXTURES, "vllm_help", release + ".txt"), encoding="utf-8") as handle:
        body = {"version": release, "help": handle.read(), "command": ["python3", "-m", "vllm.entrypoints.cli.main"]}
    body.update(over)
    return ("INFO 11-30 17:41:55 [__init__.py:44] plugins\n" + _vllm_args.ASK_MARKER + json.dumps(body) + "\n").encode()


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
        # The installed engine's answer to the flag question (exit code, output) and how often asked.
        self.ask_result = (0, answer("0.32.0"))
        self.asks = 0
        self.die_on_start = False
        self.log = b"INFO loading model\n"
        # Ray's node table as the real query printed it (tests/unit/fixtures/ray), and how often read.
        self.ray_nodes = ray_fixture("nodes_two_alive.json")
        self.ray_queries = 0

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
            self.asks += 1
            return FakeExecResult(*self.ask_result)
        if script == _ray.RAY_QUERY:
            self.ray_queries += 1
            return FakeExecResult(0, (json.dumps(self.ray_nodes) + "\n").encode())
        raise AssertionError("unexpected exec %r" % cmd[:3])


def ray_fixture(name):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "ray", name)) as handle:
        return json.load(handle)


# What the real engine answered (tests/unit/fixtures/vllm_api/README.md).
with open(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "vllm_api", "lab-0.32.0-tp2-ray.json")) as f:
    RECORDED = json.load(f)


class Api:
    """The HTTP side, answering as the real engine did: /health, /v1/models, /version, completions."""

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
            models = json.loads(json.dumps(RECORDED["models"]).replace("lab-qwen3.5-moe-tiny", self.served))
            return Resp(200, json.dumps(models).encode())
        if path == "version":
            return Resp(200, json.dumps(RECORDED["version"]).encode())
        if path == "v1/completions":
            return Resp(200, json.dumps(RECORDED["completion"]).encode())
        if path == "v1/chat/completions":
            return Resp(200, json.dumps(RECORDED["chat"]).encode())
        raise AssertionError(path)


class Resp(io.BytesIO):
    def __init__(self, code, body):
        super().__init__(body)
        self.code = code

    def getcode(self):
        return self.code


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every run keeps its flag cache under the test's own directory."""
    path = str(tmp_path / "vllm-flags")
    monkeypatch.setitem(DEFAULTS, "flag_cache_dir", path)
    monkeypatch.setitem(DEFAULTS, "restart_history", str(tmp_path / "vllm-restarts.json"))
    return path


@pytest.fixture
def client(monkeypatch):
    return use_client(monkeypatch, vllm_serve, FakeClient(images={"lab/vllm:new": {"Id": NEW_IMAGE}}))


@pytest.fixture
def env(monkeypatch, client):
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


DEFAULTS = {}


def args(**over):
    base = dict(
        DEFAULTS,
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
    assert res["completion"] == RECORDED["completion"]["choices"][0]["text"] and res["model"] == "lab-model"
    # The recorded chat answer is all reasoning (content null): its reasoning is the text reported.
    assert res["chat_completion"] == RECORDED["chat"]["choices"][0]["message"]["reasoning"]
    assert res["engine"] == "vllm 0.32.0"
    assert res["endpoint"].endswith("/v1")
    assert set(res["timings"]) >= {"flag_check", "start", "health", "probe", "chat"}
    assert res["probe"]["ok"] and res["probe"]["health"] == 200 and res["probe"]["engine_version"] == "0.32.0"
    assert res["probe"]["tokens"] == RECORDED["completion"]["usage"]["completion_tokens"]
    assert res["timings"]["health"] == 0.3  # three 0.1 s polls on the fake clock
    assert (
        res["flag_check"] == "installed vLLM 0.32.0 (image sha256:a9d32715c8c0, asked the running container ray-head)"
    )
    assert res["vllm_version"] == "0.32.0"
    assert all(h.get("Authorization") == "Bearer s3cret" for m, p, h, d in api.requests if p.startswith("/v1"))


def test_the_chat_is_sent_with_the_probes_completion_not_after_it(monkeypatch, env):
    _head, api = env
    chat_asked = threading.Event()
    answer = api.open_url

    def open_url(url, **kw):
        if url.endswith("/v1/chat/completions"):
            chat_asked.set()
        # The completion answers only once the chat is in: one sent after the other would wait here.
        elif url.endswith("/v1/completions") and not chat_asked.wait(10):
            raise TimeoutError("timed out")
        return answer(url, **kw)

    monkeypatch.setattr(vllm_serve, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_serve, args())
    assert not failed, res
    assert res["chat_completion"] == RECORDED["chat"]["choices"][0]["message"]["reasoning"]
    assert res["probe"]["text"] == RECORDED["completion"]["choices"][0]["text"]


@pytest.mark.parametrize(
    "broken, named",
    [
        ("/v1/chat/completions", "The verification chat failed: HTTP Error 500: template error"),
        # Both fail: the probe's step is named, not the chat.
        ("/completions", "The verification failed at completion: the completion failed: HTTP 500"),
    ],
)
def test_a_failed_verification_names_its_request(monkeypatch, env, broken, named):
    _head, api = env
    answer = api.open_url

    def open_url(url, **kw):
        if url.endswith(broken):
            raise HTTPError(url, 500, "template error", {}, None)
        return answer(url, **kw)

    monkeypatch.setattr(vllm_serve, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_serve, args())
    assert failed and named in res["msg"], res["msg"]


def test_fewer_ray_gpus_than_tp_x_pp_is_refused_before_serve_starts(monkeypatch, env):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, args(ray_gpus=1.0, pipeline_parallel_size=1))
    assert failed and head.launches == []
    assert (
        "the Ray cluster has 1 GPUs alive, but tensor_parallel_size (2) x pipeline_parallel_size (1) needs 2"
        in (res["msg"])
    )
    assert "cluster_gpus_per_node" in res["msg"]
    # As many GPUs as the layout needs: served.
    failed, res = run_module(monkeypatch, vllm_serve, args(ray_gpus=2.0))
    assert not failed and len(head.launches) == 1


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
    # SIGTERM to the old server's process group, then SIGCONT (a frozen process acts on it only then).
    assert head.signals == [(101, 15), (101, 18)]
    assert "watchdog" not in res  # a restart for changed settings is not the watchdog's
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


def test_the_engines_answer_is_cached_per_image(monkeypatch, env, cache_dir):
    head, _api = env
    a = args()
    first = run_module(monkeypatch, vllm_serve, a)[1]
    second = run_module(monkeypatch, vllm_serve, a)[1]
    assert head.asks == 1
    assert second["flag_check"] == "installed vLLM 0.32.0 (image sha256:a9d32715c8c0, cached)"
    assert second["vllm_version"] == "0.32.0" and not second["changed"]
    assert "flag_check" in first["timings"] and "flag_check" in second["timings"]
    assert os.listdir(cache_dir) == [HEAD_IMAGE.split(":")[1] + ".json"]


def test_the_installed_engine_wins_over_the_builtin_table(monkeypatch, env):
    head, _api = env
    head.ask_result = (0, answer("0.17.0"))  # 0.17 still has --swap-space; the 0.33 table has not
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=["--swap-space", "4"]))
    assert not failed, res
    assert res["flag_check"].startswith("installed vLLM 0.17.0 (")
    assert _vllm_args.check_extra_args(["--swap-space", "4"])


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["--swap-space", "4"],
            "vllm_server_extra_args: --swap-space is not a flag of vllm serve in vLLM 0.32.0 "
            "(image sha256:a9d32715c8c0); remove it",
        ),
        (
            ["--max-model-lenn", "4096"],
            "--max-model-lenn is not a flag of vllm serve in vLLM 0.32.0 (image sha256:a9d32715c8c0); "
            "did you mean --max-model-len? It is set by this module: use the option max_model_len",
        ),
        (["--enable-prefix-cachin"], "did you mean --enable-prefix-caching?"),
    ],
)
def test_unknown_flags_are_refused_naming_version_image_and_fix(monkeypatch, env, extra, needle):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=extra))
    assert failed and needle in res["msg"], res["msg"]
    assert head.launches == []


def test_flags_read_as_vllm_reads_them(monkeypatch, env):
    extra = ["--max_num_seqs=8", "-O3", "--attention-backend", "TRITON_ATTN", "--compilation-config.mode=3"]
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=extra))
    assert not failed, res


@pytest.mark.parametrize(
    ("ask_result", "needle"),
    [
        ((0, NO_ENGINE), "no help text (vllm is not importable: ModuleNotFoundError"),
        ((126, b'OCI runtime exec failed: exec: "python3": executable file not found in $PATH\n'), "(exit 126)"),
        ((0, answer("0.32.0", help="usage: vllm serve\n  --port PORT  Port.\n")), "not --served-model-name"),
    ],
)
def test_an_engine_that_cannot_be_asked_fails_with_the_reason(monkeypatch, env, ask_result, needle):
    head, _api = env
    head.ask_result = ask_result
    failed, res = run_module(monkeypatch, vllm_serve, args())
    assert failed and needle in res["msg"], res["msg"]
    assert "cannot ask the installed vLLM" in res["msg"] and "flag_source=builtin" in res["msg"]
    assert head.launches == []


def test_static_refusals_come_with_an_ask_failure(monkeypatch, env):
    head, _api = env
    head.ask_result = (0, NO_ENGINE)
    failed, res = run_module(monkeypatch, vllm_serve, args(extra_args=["--port", "9000"]))
    assert failed and "use the option port" in res["msg"] and "cannot ask the installed vLLM" in res["msg"]


def test_flag_source_builtin_uses_the_table_without_asking(monkeypatch, env):
    head, _api = env
    head.ask_result = (0, NO_ENGINE)
    failed, res = run_module(monkeypatch, vllm_serve, args(flag_source="builtin"))
    assert not failed, res
    assert res["flag_check"] == "built-in table of vLLM 0.33.0 (flag_source=builtin)"
    assert head.asks == 0 and "vllm_version" not in res
    failed, res = run_module(monkeypatch, vllm_serve, args(flag_source="builtin", extra_args=["--swap-space", "4"]))
    assert failed and "in the built-in table of vLLM 0.33.0; remove it" in res["msg"]


def throwaway(client, output=None, fail_gpus=False):
    """Record containers.run() calls of the fake engine; answer like the image's engine would."""
    calls = []

    def run(**kwargs):
        calls.append(kwargs)
        if fail_gpus and kwargs.get("device_requests"):
            raise APIError('could not select device driver "" with capabilities: [[gpu]]')
        return output if output is not None else answer("0.33.0")

    client.containers.run = run
    return calls


def test_checked_asks_a_throwaway_container_of_the_image(monkeypatch, env, client):
    head, _api = env
    client.containers.items["ray-head"].attrs["State"]["Status"] = "exited"
    calls = throwaway(client)
    a = args(state="checked", image="lab/vllm:new")
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed, res
    assert (
        res["flag_check"]
        == "installed vLLM 0.33.0 (image sha256:5f0e6a3b1c2d, asked a throwaway container of lab/vllm:new)"
    )
    (call,) = calls
    assert call["image"] == NEW_IMAGE and call["entrypoint"] == ["python3"] and call["remove"] is True
    assert call["network_disabled"] is True and call["command"][:2] == ["-c", _vllm_args.INSTALLED_FLAGS_SCRIPT]
    assert call["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert head.asks == 0
    # Then cached: the next preflight (and the serve that runs this image) need not ask again.
    res = run_module(monkeypatch, vllm_serve, a)[1]
    assert res["flag_check"].endswith("(image sha256:5f0e6a3b1c2d, cached)") and len(calls) == 1


def test_checked_asks_the_running_container_when_it_runs_the_image(monkeypatch, env, client):
    head, _api = env
    calls = throwaway(client)
    client.images.items["lab/vllm:new"] = {"Id": HEAD_IMAGE}
    res = run_module(monkeypatch, vllm_serve, args(state="checked", image="lab/vllm:new"))[1]
    assert res["flag_check"].endswith("asked the running container ray-head)")
    assert head.asks == 1 and calls == []


def test_checked_asks_the_new_image_when_the_head_runs_an_older_one(monkeypatch, env, client):
    head, _api = env
    calls = throwaway(client)
    res = run_module(monkeypatch, vllm_serve, args(state="checked", image="lab/vllm:new"))[1]
    assert "asked a throwaway container of lab/vllm:new" in res["flag_check"]
    assert head.asks == 0 and len(calls) == 1


def test_an_engine_without_gpu_runtime_is_asked_without_gpus(monkeypatch, env, client):
    client.containers.items["ray-head"].attrs["State"]["Status"] = "exited"
    calls = throwaway(client, fail_gpus=True)
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", image="lab/vllm:new"))
    assert not failed, res
    assert [bool(c.get("device_requests")) for c in calls] == [True, False]


def test_a_throwaway_that_fails_is_reported_with_its_exit(monkeypatch, env, client):
    client.containers.items["ray-head"].attrs["State"]["Status"] = "exited"
    removed = []

    def run(**kwargs):
        raise ContainerError(kwargs["name"], 1, kwargs["command"], kwargs["image"], b"python3: not found\n")

    client.containers.run = run
    monkeypatch.setattr(vllm_serve.VllmServe, "remove_leftover", staticmethod(lambda c, name: removed.append(name)))
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", image="lab/vllm:new"))
    assert (
        failed
        and "asked a throwaway container of lab/vllm:new): it printed no answer: python3: not found" in res["msg"]
    )
    assert "(exit 1)" in res["msg"] and removed


def test_checked_defers_when_the_image_is_not_on_the_node(monkeypatch, env, client):
    head, _api = env
    client.containers.items["ray-head"].attrs["State"]["Status"] = "exited"
    calls = throwaway(client)
    warnings = []
    monkeypatch.setattr(vllm_serve.AnsibleModule, "warn", lambda self, msg: warnings.append(msg))
    a = args(state="checked", image="lab/vllm:next", extra_args=["--frobnicate"])
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed, res
    assert res["flag_check"] == "deferred (image not on the head yet; checked again before serving)"
    assert calls == [] and head.asks == 0 and "vllm_version" not in res
    assert any("--frobnicate is not a flag of vllm serve in the built-in table" in w for w in warnings)
    # The static checks still refuse.
    failed, res = run_module(monkeypatch, vllm_serve, dict(a, extra_args=["--tensor-parallel-size", "1"]))
    assert failed and "use the option tensor_parallel_size" in res["msg"]


def test_checked_defers_without_image_or_running_head(monkeypatch, env, client):
    client.containers.items["ray-head"].attrs["State"]["Status"] = "exited"
    res = run_module(monkeypatch, vllm_serve, args(state="checked"))[1]
    assert res["flag_check"].startswith("deferred (no image given and the head container is not running")


def test_check_mode_asks_but_writes_no_cache(monkeypatch, env, cache_dir):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, dict(args(), _ansible_check_mode=True))
    assert not failed and head.asks == 1 and res["vllm_version"] == "0.32.0"
    assert not os.path.exists(cache_dir)


def test_an_unwritable_cache_is_a_warning(monkeypatch, env, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    warnings = []
    monkeypatch.setattr(vllm_serve.AnsibleModule, "warn", lambda self, msg: warnings.append(msg))
    failed, res = run_module(monkeypatch, vllm_serve, args(flag_cache_dir=str(blocker / "flags")))
    assert not failed, res
    assert any(w.startswith("flag_cache_dir: the answer was not cached") for w in warnings)


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


def hangs_while_dying(head):
    # A listener that does not answer (real time: the module times the request), while the engine dies.
    time.sleep(1.05)
    head.alive = False
    raise TimeoutError("timed out")


@pytest.mark.parametrize(
    "on_health, polls",
    [
        # Polls 1, 11, 21 ask whether the process lives: it died at the 5th, so the 11th poll's check stops it.
        (lambda head, n: setattr(head, "alive", n < 5), 10),
        # A poll that hung is followed at once by the check.
        (lambda head, n: hangs_while_dying(head), 1),
    ],
    ids=["death-seen-within-ten-polls", "hung-poll-checked-next"],
)
def test_a_death_while_health_is_polled_is_seen(monkeypatch, env, on_health, polls):
    head, api = env
    api.health_after = 1000  # refused until the engine dies
    answer = api.open_url
    asked = []

    def open_url(url, **kw):
        if url.endswith("/health"):
            asked.append(url)
            on_health(head, len(asked))
        return answer(url, **kw)

    monkeypatch.setattr(vllm_serve, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_serve, args(health_timeout=600))
    assert failed and "the vllm serve process exited" in res["msg"]
    assert len(asked) == polls


def test_absent_stops(monkeypatch, env):
    head, _api = env
    run_module(monkeypatch, vllm_serve, args())
    failed, res = run_module(monkeypatch, vllm_serve, dict(state="absent"))
    assert not failed and res["actions"] == ["stopped"] and head.signals == [(101, 15), (101, 18)]
    failed, res = run_module(monkeypatch, vllm_serve, dict(state="absent"))
    assert not failed and not res["changed"]


def test_checked_state_validates_only(monkeypatch, env):
    head, _api = env
    failed, res = run_module(monkeypatch, vllm_serve, dict(args(), state="checked"))
    assert not failed and not res["changed"] and head.launches == []
    assert res["command"][1] == "serve"


def test_a_dead_server_leaves_nothing_of_its_session_behind(monkeypatch, env):
    # The serve process was killed; its engine core and Ray driver share its session and may live on:
    # the whole group gets SIGKILL before the new server starts.
    head, _api = env
    a = args()
    run_module(monkeypatch, vllm_serve, a)
    head.alive = False
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and res["actions"] == ["started"]
    assert head.signals == [(101, 9)]
    assert len(head.launches) == 2


# --- the serving probe and the watchdog ---------------------------------------------------------------


def hang_completions(monkeypatch, api):
    """The engine core frozen: /health still answers 200 from the API server, completions time out."""
    real = api.open_url
    asked = []

    def frozen(url, **kwargs):
        if url.endswith("/v1/completions") and not asked:
            asked.append(kwargs.get("timeout"))
            raise TimeoutError("timed out")
        return real(url, **kwargs)

    monkeypatch.setattr(vllm_serve, "open_url", frozen)
    return asked


def history(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["restarts"]


def test_a_hung_engine_is_reported_in_check_mode_and_left_alone(monkeypatch, env):
    head, api = env
    a = args(probe_timeout=20)
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    asked = hang_completions(monkeypatch, api)
    failed, res = run_module(monkeypatch, vllm_serve, dict(a, _ansible_check_mode=True))
    assert not failed and res["changed"] and res["actions"] == ["restarted"]
    assert res["probe"]["health"] == 200 and res["probe"]["step"] == "completion"
    assert "no completion within" in res["probe"]["why"] and "the engine hangs" in res["probe"]["why"]
    assert 0 < asked[0] <= 20  # the completion was bounded by what was left of the probe's deadline
    assert res["watchdog"]["decision"] == "restart"
    assert len(head.launches) == 1 and head.signals == [] and not os.path.exists(DEFAULTS["restart_history"])


def test_a_hung_engine_is_restarted_and_the_restart_recorded(monkeypatch, env):
    head, api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    hang_completions(monkeypatch, api)
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and res["actions"] == ["restarted"] and len(head.launches) == 2
    assert head.signals == [(101, 15), (101, 18)]
    assert res["probe"]["ok"]  # the probe after the restart
    assert res["watchdog"] == dict(
        why=res["watchdog"]["why"], decision="restart", recent_restarts=0, backoff_s=0
    ) and res["watchdog"]["why"].startswith("the probe failed at completion")
    assert [e["why"] for e in history(DEFAULTS["restart_history"])] == [res["watchdog"]["why"]]


def test_the_deploys_failed_probe_is_taken_as_its_own_not_waited_out_again(monkeypatch, env):
    head, api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    probed = dict(ok=False, step="completion", why="no completion within 60s although /health answered 200")
    asked = len(api.requests)
    failed, res = run_module(monkeypatch, vllm_serve, dict(a, probed=probed))
    assert not failed and res["actions"] == ["restarted"] and len(head.launches) == 2
    assert res["watchdog"]["why"] == "the probe failed at completion: " + probed["why"]
    # The server answers (the fake engine is healthy): only the probe given restarts it, and it was not
    # probed again before the restart: one completion, the new server's.
    assert [r[1] for r in api.requests[asked:]].count("/v1/completions") == 1 and head.signals[0] == (101, 15)
    # Settings changed: the probe given is of the old server and does not count; no watchdog restart.
    failed, res = run_module(monkeypatch, vllm_serve, dict(a, probed=probed, max_model_len=1024))
    assert not failed and res["actions"] == ["restarted"] and "watchdog" not in res


def test_a_crash_loop_is_reported_with_the_log_and_not_restarted(monkeypatch, env):
    head, api = env
    a = args(max_restarts=2)
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    head.log = b"RuntimeError: engine core died\n"
    now = __import__("time").time()
    with open(DEFAULTS["restart_history"], "w", encoding="utf-8") as handle:
        json.dump(
            {
                "restarts": [
                    {"at": now - 7200, "why": "old"},
                    {"at": now - 600, "why": "a"},
                    {"at": now - 60, "why": "b"},
                ]
            },
            handle,
        )
    dead = HTTPError("http://head/health", 503, "Service Unavailable", {}, None)
    real = api.open_url

    def engine_dead(url, **kwargs):
        if url.endswith("/health"):
            raise dead
        return real(url, **kwargs)

    monkeypatch.setattr(vllm_serve, "open_url", engine_dead)
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert failed and "crash loop" in res["msg"] and "restarted 2 time(s) in the last 3600s" in res["msg"]
    assert "/health answered 503" in res["msg"] and "engine core died" in res["msg"]
    assert "vllm_server_max_restarts (2)" in res["msg"]
    assert len(head.launches) == 1 and head.signals == []
    assert res["watchdog"]["decision"] == "crash_loop"


def test_a_dead_engine_counts_as_a_watchdog_restart(monkeypatch, env):
    head, _api = env
    a = args()
    run_module(monkeypatch, vllm_serve, a)
    head.alive = False
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and res["watchdog"]["why"] == "the vllm serve process (pid 101) died"
    assert len(history(DEFAULTS["restart_history"])) == 1


# --- backend=mp: each rank a container whose main process is vllm serve --------------------------------


class Engine:
    """A worker node's Docker engine as the head reaches it: one rank container, recorded on the lab."""

    def __init__(self, log=None, restart_on_reload=False):
        attrs = inspect("container_vllm_mp_rank1.json")
        text = fixture_text("docker", "container_vllm_mp_rank1.log") if log is None else log
        self.rank = FakeContainer(attrs, log=text.encode())
        if restart_on_reload:
            # The worker's vllm serve exits while the head waits; its restart policy starts it again.
            def reload():
                self.rank.attrs["RestartCount"] += 1

            self.rank.reload = reload
        self.containers = self

    def get(self, name):
        assert name == "vllm-mp"
        return self.rank


@pytest.fixture
def mp(monkeypatch):
    """A node's engine with the runtime image, the head's HTTP API, and a clock the waits run on."""
    client = use_client(
        monkeypatch,
        vllm_serve,
        FakeClient(images={"lab/vllm:new": {"Id": NEW_IMAGE}}, container_template="container_vllm_mp_rank1.json"),
    )
    api = Api(types.SimpleNamespace(alive=True))
    monkeypatch.setattr(vllm_serve, "open_url", api.open_url)
    clock = {"now": 0.0}

    def fake_wait(check, timeout, interval=1.0):
        def sleep(s):
            clock["now"] += s

        return _wait.wait_for(check, timeout, interval, clock=lambda: clock["now"], sleep=sleep)

    monkeypatch.setattr(vllm_serve, "wait_for", fake_wait)
    return client, api


def mp_args(**over):
    base = dict(
        backend="mp",
        container="vllm-mp",
        image="lab/vllm:new",
        nnodes=2,
        master_addr="198.18.100.11",
        flag_source="builtin",
        container_env={"VLLM_HOST_IP": "198.18.100.12", "GLOO_SOCKET_IFNAME": "enp1s0f1np1"},
        mounts=[{"source": "/var/lib/dgx-spark/models", "target": "/var/lib/dgx-spark/models", "read_only": True}],
    )
    base.update(over)
    return args(**base)


WORKERS = [{"host": "spark-2", "rank": 1, "container": "vllm-mp", "docker_host": "ssh://root@198.18.100.12"}]


def test_mp_worker_rank_is_a_headless_vllm_serve_container_left_alone_when_unchanged(monkeypatch, mp):
    client, api = mp
    worker = mp_args(node_rank=1)
    failed, res = run_module(monkeypatch, vllm_serve, worker)
    assert not failed, res
    assert res["actions"] == ["created"] and res["rank"] == 1
    kwargs = client.containers.created[0]
    assert kwargs["name"] == "vllm-mp" and kwargs["image"] == NEW_IMAGE
    assert kwargs["entrypoint"] == ["vllm"] and kwargs["command"][:2] == ["serve", "/models/lab"]
    command = kwargs["command"]
    assert command[command.index("--distributed-executor-backend") + 1] == "mp"
    assert command[command.index("--node-rank") + 1] == "1" and "--headless" in command
    assert command[command.index("--master-addr") + 1] == "198.18.100.11"
    assert kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host" and kwargs["init"] is True
    assert kwargs["restart_policy"] == {"Name": "unless-stopped"}
    assert kwargs["environment"]["VLLM_HOST_IP"] == "198.18.100.12"
    # A headless rank serves no API: no key, no Ray placement, and nothing asked over HTTP.
    assert not {"VLLM_API_KEY", "VLLM_DISTRIBUTED_EXECUTOR_CONFIG"} & set(kwargs["environment"])
    assert api.requests == []
    assert kwargs["labels"][vllm_serve.ROLE_LABEL] == "rank-1"
    assert res["flag_check"].startswith("checked by the head")

    failed, res = run_module(monkeypatch, vllm_serve, worker)
    assert not failed and not res["changed"] and len(client.containers.created) == 1
    failed, res = run_module(monkeypatch, vllm_serve, dict(worker, force_restart=True))
    assert res["actions"] == ["recreated"] and len(client.containers.created) == 2
    failed, res = run_module(monkeypatch, vllm_serve, dict(worker, max_model_len=1024))
    assert res["actions"] == ["recreated"]


def test_mp_head_rank_waits_for_health_and_verifies_with_the_key_kept_out_of_the_label(monkeypatch, mp):
    client, api = mp
    monkeypatch.setattr(_docker, "connect", lambda host, _timeout: {"ssh://root@198.18.100.12": Engine()}[host])
    api.health_after = 5
    head = mp_args(node_rank=0, workers=WORKERS)
    failed, res = run_module(monkeypatch, vllm_serve, head)
    assert not failed, res
    kwargs = client.containers.created[0]
    assert "--headless" not in kwargs["command"]
    assert kwargs["command"][kwargs["command"].index("--node-rank") + 1] == "0"
    assert kwargs["environment"]["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in json.dumps(kwargs["labels"]) and "s3cret" not in json.dumps(res)
    assert res["worker_engines"] == {"spark-2": "watched"}
    assert res["engine"] == "vllm 0.32.0" and res["completion"] == RECORDED["completion"]["choices"][0]["text"]
    # Converged: the next run asks /health once and verifies, nothing is recreated.
    failed, res = run_module(monkeypatch, vllm_serve, head)
    assert not failed and not res["changed"] and len(client.containers.created) == 1


def converged_mp_head(monkeypatch):
    """The head rank started, then its plan step (state=checked) on the converged engine: (args, plan)."""
    monkeypatch.setattr(_docker, "connect", lambda host, _timeout: Engine())
    head = mp_args(node_rank=0, workers=WORKERS)
    assert not run_module(monkeypatch, vllm_serve, head)[0]
    failed, plan = run_module(monkeypatch, vllm_serve, dict(head, state="checked"))
    assert not failed and plan["plan"] is None and plan["probe"]["ok"]
    return head, plan


def test_mp_plan_step_of_a_hung_head_plans_every_rank_again(monkeypatch, mp):
    client, api = mp
    head, _plan = converged_mp_head(monkeypatch)
    hang_completions(monkeypatch, api)
    failed, res = run_module(monkeypatch, vllm_serve, dict(head, state="checked"))
    # The plan the deploy reads to restart every rank together (vllm_server/vars: _vllm_server_restart_all).
    assert not failed and res["plan"] == "recreated" and res["probe"]["step"] == "completion"
    assert res["watchdog"]["decision"] == "restart" and len(history(DEFAULTS["restart_history"])) == 1
    assert len(client.containers.created) == 1


def test_mp_head_left_alone_reports_the_plan_steps_probe_instead_of_probing_again(monkeypatch, mp):
    _client, api = mp
    head, plan = converged_mp_head(monkeypatch)
    api.requests.clear()
    failed, res = run_module(monkeypatch, vllm_serve, dict(head, probed=plan["probe"]))
    assert not failed and not res["changed"] and res["probe"] == plan["probe"]
    assert [r[1] for r in api.requests if r[1].startswith("/v1/completions")] == []
    # A failed plan-step probe is not taken on trust: the started step asks the engine itself.
    api.requests.clear()
    failed, res = run_module(monkeypatch, vllm_serve, dict(head, probed=dict(plan["probe"], ok=False)))
    assert not failed and [r[1] for r in api.requests if r[1].startswith("/v1/completions")] == ["/v1/completions"]


def test_mp_head_fails_at_once_naming_the_worker_whose_rank_exited(monkeypatch, mp):
    _client, api = mp
    engine = Engine(restart_on_reload=True)
    monkeypatch.setattr(_docker, "connect", lambda _host, _timeout: engine)
    api.health_after = 10_000
    failed, res = run_module(monkeypatch, vllm_serve, mp_args(node_rank=0, workers=WORKERS, health_timeout=600))
    assert failed
    assert "the rank 1 container vllm-mp on spark-2 restarted" in res["msg"]
    # The worker's own log follows, and whether it joined.
    assert "--- spark-2 (vllm-mp) rank 1: joined" in res["msg"]
    assert "headless multiproc executor" in res["msg"]
    assert res["timings"]["health"] < 5


def test_mp_head_timeout_names_the_rank_that_never_joined(monkeypatch, mp):
    _client, api = mp
    lonely = fixture_text("docker", "container_vllm_mp_rank1.log").split("[parallel_state.py:2350]")[0]
    monkeypatch.setattr(_docker, "connect", lambda _host, _timeout: Engine(log=lonely))
    api.health_after = 10_000
    failed, res = run_module(monkeypatch, vllm_serve, mp_args(node_rank=0, workers=WORKERS, health_timeout=20))
    assert failed
    assert "no 200 from /health within 20s" in res["msg"]
    assert "--- spark-2 (vllm-mp) rank 1: did not join" in res["msg"]


def test_mp_bad_rank_settings_are_refused_naming_them(monkeypatch, mp):
    client, _api = mp
    failed, res = run_module(monkeypatch, vllm_serve, mp_args(node_rank=2))
    assert failed and "node_rank: must be in 0..1, got 2" in res["msg"]
    failed, res = run_module(monkeypatch, vllm_serve, mp_args(node_rank=1, master_addr=None))
    assert failed and "master_addr: required" in res["msg"]
    failed, res = run_module(monkeypatch, vllm_serve, mp_args(node_rank=1, image="lab/vllm:missing"))
    assert failed and "image: lab/vllm:missing is not on this node" in res["msg"]
    assert client.containers.created == []


def test_mp_absent_removes_the_rank_container(monkeypatch, mp):
    client, _api = mp
    run_module(monkeypatch, vllm_serve, mp_args(node_rank=1))
    failed, res = run_module(monkeypatch, vllm_serve, dict(backend="mp", state="absent", container="vllm-mp"))
    assert not failed and res["actions"] == ["removed"] and "vllm-mp" not in client.containers.items
    failed, res = run_module(monkeypatch, vllm_serve, dict(backend="mp", state="absent", container="vllm-mp"))
    assert not failed and not res["changed"]


def test_a_layout_the_model_cannot_split_is_refused_before_anything_starts(monkeypatch, env, tmp_path):
    head, _api = env
    config = inspect("../vllm_image/config.json")
    config["text_config"].update(linear_num_key_heads=2, linear_num_value_heads=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    failed, res = run_module(
        monkeypatch, vllm_serve, args(state="checked", model=str(tmp_path), tensor_parallel_size=3)
    )
    assert failed
    assert "vllm_server_tensor_parallel_size: 3 does not split the model's attention heads (4)" in res["msg"]
    assert res["layout_check"] == "refused" and head.launches == []
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", model=str(tmp_path)))
    assert not failed, res
    assert res["layout_check"] == "fits %s/config.json" % tmp_path
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked"))
    assert res["layout_check"].startswith("deferred: no config.json in /models/lab")


def test_the_port_check_lets_the_other_backends_server_hold_the_port_only(monkeypatch, env, client):
    """A switch from mp: the head's port is held by the vllm-mp container the deploy stops next; any other
    holder is refused before anything starts."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", port=port, port_owners=["vllm-mp"]))
        assert failed and "already in use on the head" in res["msg"]
        attrs = inspect("container_vllm_mp_rank1.json")
        attrs["Name"] = "/vllm-mp"
        client.containers.add(FakeContainer(attrs))
        failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", port=port, port_owners=["vllm-mp"]))
        assert not failed, res
    finally:
        listener.close()


def memory_nodes(meminfo):
    with open(os.path.join(FIXTURES, "memory_fit", meminfo), encoding="utf-8") as handle:
        text = handle.read()
    return [{"host": "spark-1", "meminfo": text}, {"host": "spark-2", "meminfo": text}]


def big_model(tmp_path):
    """The 122B profile's model directory (tests/unit/fixtures/memory_fit: built from published numbers)."""
    for kind, name in (("config", "config.json"), ("index", "model.safetensors.index.json")):
        source = os.path.join(
            FIXTURES, "memory_fit", "qwen3.5-122b-a10b-fp8.built-from-published-numbers.%s.json" % kind
        )
        with open(source, encoding="utf-8") as handle:
            (tmp_path / name).write_text(handle.read())
    return dict(model=str(tmp_path), max_model_len=65536, gpu_memory_utilization=0.8)


def test_the_122b_profile_on_64gb_nodes_is_refused_before_anything_starts(monkeypatch, env, tmp_path):
    head, _api = env
    small = memory_nodes("meminfo-64gb-node.built.txt")
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", node_memory=small, **big_model(tmp_path)))
    assert failed and res["msg"].startswith("memory: vllm_server_tensor_parallel_size 2 x")
    assert "= 56.24 GiB needed, over the budget of spark-1, spark-2: MemTotal 64.00 GiB" in res["msg"]
    assert res["memory_fit"]["check"] == "refused" and res["memory_fit"]["weights_bytes"] == 119_000_000_000
    assert head.launches == [] and head.asks == 0
    spark = memory_nodes("meminfo-gb10-128gb.built-from-published-numbers.txt")
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", node_memory=spark, **big_model(tmp_path)))
    assert not failed, res
    assert res["memory_fit"]["check"] == "fits: 56.24 GiB needed per node, 96.80 GiB allowed on the tightest"
    failed, res = run_module(monkeypatch, vllm_serve, args(state="checked", **big_model(tmp_path)))
    assert not failed and res["memory_fit"]["check"] == "skipped: node_memory not given"


def test_the_memory_check_defers_when_the_hub_cannot_be_asked(monkeypatch, env, tmp_path):
    asked = []

    def hub(repo_id, revision=None, token=None, api=None):
        asked.append((repo_id, revision, token))
        return None, "the hub did not answer for %s: offline" % repo_id

    monkeypatch.setattr(vllm_serve._memory_fit, "hub_weights", hub)
    small = memory_nodes("meminfo-64gb-node.built.txt")
    failed, res = run_module(
        monkeypatch,
        vllm_serve,
        args(
            state="checked", model=str(tmp_path / "none"), node_memory=small, hub_repo_id="Qwen/Qwen3.5-122B-A10B-FP8"
        ),
    )
    assert not failed, res
    assert res["memory_fit"]["check"].startswith("deferred: the weights' size is not known (")
    assert (
        "the hub did not answer for Qwen/Qwen3.5-122B-A10B-FP8: offline); checked again before serving"
        in (res["memory_fit"]["check"])
    )
    assert asked == [("Qwen/Qwen3.5-122B-A10B-FP8", None, None)]


def test_a_restart_is_refused_naming_the_gpus_when_a_ray_node_is_gone(monkeypatch, env):
    """The engine died and Ray lists the worker dead although nothing restarted its container: the watchdog
    does not start an engine that would wait for a GPU Ray does not have."""
    head, _api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    assert head.ray_queries == 0  # a first start follows the ray_cluster stage's own wait
    head.alive = False
    head.ray_nodes = ray_fixture("nodes_worker_dead.json")
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert failed and head.ray_queries == 1 and len(head.launches) == 1
    assert "Ray has 1 GPU(s) alive" in res["msg"] and "needs 2" in res["msg"] and "--tags ray_cluster" in res["msg"]


def test_a_restart_with_every_ray_gpu_alive_goes_ahead(monkeypatch, env):
    head, _api = env
    a = args()
    assert not run_module(monkeypatch, vllm_serve, a)[0]
    head.alive = False
    failed, res = run_module(monkeypatch, vllm_serve, a)
    assert not failed and head.ray_queries == 1 and res["ray_gpus_alive"] == 2 and len(head.launches) == 2


# --- the stage group's record, written by the serve once the endpoint is verified (option record) ---
RECORD_FACTS = dict(vllm_server_engine="engine", vllm_server_memory_fit="memory_fit")


def group_record(tmp_path, **vllm_server_facts):
    """The deploy's record of the head's cluster group: ray_cluster, then vllm_server, with the run's plan."""
    stages = [
        dict(name="ray_cluster", inputs="r1", checks=dict(directories=[str(tmp_path)]), fact_names=["ray_gpus"]),
        dict(
            name="vllm_server",
            inputs="v1",
            checks=dict(directories=[str(tmp_path)]),
            fact_names=list(RECORD_FACTS),
        ),
    ]
    facts = dict(ray_cluster=dict(ray_gpus=2), vllm_server=vllm_server_facts)
    recorded = [dict(stage, facts=facts[stage["name"]]) for stage in stages]
    return dict(path=str(tmp_path / "record" / "stages.json"), stages=recorded, plan=dict(key="k1", stages=stages))


def saved_record(tmp_path):
    path = tmp_path / "record" / "stages.json"
    return (json.loads(path.read_text()), stat.S_IMODE(path.stat().st_mode)) if path.exists() else (None, None)


def test_a_verified_start_records_its_stage_group_with_what_it_found(monkeypatch, env, tmp_path):
    spark = memory_nodes("meminfo-gb10-128gb.built-from-published-numbers.txt")
    record = group_record(tmp_path, vllm_server_engine="vllm 0.31.0")
    failed, res = run_module(
        monkeypatch,
        vllm_serve,
        args(node_memory=spark, record=record, record_facts=RECORD_FACTS, **big_model(tmp_path)),
    )
    assert not failed, res
    assert res["memory_fit"]["check"].startswith("fits: ")
    assert res["found"] == dict(engine="vllm 0.32.0", memory_fit=res["memory_fit"])
    assert res["record"] == dict(recorded=["ray_cluster", "vllm_server"], reasons={}, changed=True, plan=True)
    saved, mode = saved_record(tmp_path)
    assert mode == 0o600
    # What this serve found wins over the fact as the run held it before the serve; each fact stays with its stage.
    assert saved["stages"]["vllm_server"]["facts"] == dict(
        vllm_server_engine="vllm 0.32.0", vllm_server_memory_fit=res["memory_fit"]
    )
    assert saved["stages"]["ray_cluster"]["facts"] == dict(ray_gpus=2)
    assert saved["plan"]["key"] == "k1" and [s["name"] for s in saved["plan"]["stages"]] == [
        "ray_cluster",
        "vllm_server",
    ]


def test_a_skipped_memory_check_keeps_the_fit_found_before(monkeypatch, env, tmp_path):
    earlier = {"check": "fits: found by an earlier run"}
    record = group_record(tmp_path, vllm_server_memory_fit=earlier)
    failed, res = run_module(monkeypatch, vllm_serve, args(record=record, record_facts=RECORD_FACTS))
    assert not failed, res
    assert res["memory_fit"]["check"].startswith("skipped") and res["found"] == dict(engine="vllm 0.32.0")
    saved, _mode = saved_record(tmp_path)
    assert saved["stages"]["vllm_server"]["facts"] == dict(
        vllm_server_engine="vllm 0.32.0", vllm_server_memory_fit=earlier
    )


def test_no_record_without_a_verified_endpoint_or_in_check_mode(monkeypatch, env, tmp_path):
    _head, api = env
    answer = api.open_url

    def open_url(url, **kw):
        if url.endswith("/completions"):
            raise HTTPError(url, 500, "engine error", {}, None)
        return answer(url, **kw)

    record = group_record(tmp_path)
    failed, res = run_module(monkeypatch, vllm_serve, dict(args(record=record), _ansible_check_mode=True))
    assert not failed and res["changed"] and "record" not in res
    monkeypatch.setattr(vllm_serve, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_serve, args(record=record))
    assert failed and "record" not in res
    assert saved_record(tmp_path) == (None, None)
