"""ray_cluster_wait against the recorded real output of _ray.RAY_QUERY (Ray 2.60's GCS node table, fixtures/ray/)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _docker, _ray, _wait
from ansible_collections.dgx_spark.vllm.plugins.modules import ray_cluster_wait
from fake_docker import FakeClient, FakeContainer, FakeExecResult, inspect, use_client
from module_runner import fixture_text, run_module

HEAD_IP = "192.0.2.2"
# The recordings were made on one machine, so head and worker share an IP there; the worker
# gets its own address here, as on two Sparks.
WORKER_IP = "192.0.2.3"
EXPECTED = [{"host": "spark-1", "ip": HEAD_IP}, {"host": "spark-2", "ip": WORKER_IP}]
WORKERS = [{"host": "spark-2", "docker_host": "ssh://root@192.0.2.3", "container": "ray-worker"}]


def recorded(name):
    doc = json.loads(fixture_text("ray", name))
    for node in doc["nodes"]:
        # The GCS lists nodes in no set order: the head is the one with Ray's head resource.
        if "node:__internal_head__" not in node["Resources"]:
            node["NodeManagerAddress"] = WORKER_IP
    return doc


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def head(monkeypatch):
    client = use_client(monkeypatch, ray_cluster_wait, FakeClient())
    attrs = inspect("container_ray_head.json")
    attrs["Name"] = "/ray-head"
    container = client.containers.add(FakeContainer(attrs, log=b"Ray runtime started.\n"))
    clock = Clock()
    monkeypatch.setattr(
        ray_cluster_wait,
        "wait_for",
        lambda check, timeout, interval=1.0: _wait.wait_for(check, timeout, interval, clock=clock, sleep=clock.sleep),
    )
    container.clock = clock
    return container


def answers(container, docs):
    """Each poll returns the next recorded document (the last one repeats)."""
    seq = list(docs)

    def handler(cmd, **_kwargs):
        assert cmd[:2] == ["python3", "-c"] and cmd[2] == _ray.RAY_QUERY
        doc = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(doc, tuple):
            return FakeExecResult(*doc)
        return FakeExecResult(0, (json.dumps(doc) + "\n").encode())

    container.exec_handler = handler


def test_parse_recorded_nodes():
    state = _ray.cluster_state(json.loads(fixture_text("ray", "nodes_worker_dead.json")))
    assert state["alive_nodes"] == 1 and state["gpus"] == 1.0
    assert state["dead_ips"] == [HEAD_IP]


def test_worker_joins_then_done(monkeypatch, head):
    answers(head, [recorded("nodes_head_only.json")] * 3 + [recorded("nodes_two_alive.json")])
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2)
    )
    assert not failed, res
    assert res["alive_nodes"] == 2 and res["gpus"] == 2.0 and res["missing"] == []
    assert res["elapsed"] == 3.0
    assert [p["state"] for p in res["progress"]] == [
        "1/2 nodes alive, 1/2 GPUs; missing spark-2 (192.0.2.3)",
        "2/2 nodes alive, 2/2 GPUs",
    ]


def test_timeout_names_missing_node_by_host_and_ip(monkeypatch, head):
    answers(head, [recorded("nodes_worker_dead.json")])
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, timeout=5)
    )
    assert failed
    assert res["missing"] == [{"host": "spark-2", "ip": WORKER_IP}]
    assert "Missing node spark-2 (192.0.2.3)" in res["msg"]
    assert "after 5s" in res["msg"]
    assert res["elapsed"] == 5.0
    assert "Ray runtime started" in res["head_log"]


def test_gpu_shortfall_is_not_ready(monkeypatch, head):
    doc = recorded("nodes_two_alive.json")
    doc["nodes"][1]["Resources"].pop("GPU")
    answers(head, [doc])
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, timeout=2)
    )
    assert failed and res["missing"] == []
    assert "GPUs do not add up (1, expected 2)" in res["msg"]


def test_ray_not_answering_reports_the_error(monkeypatch, head):
    answers(head, [(1, fixture_text("ray", "query_no_ray.stderr").encode())])
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, timeout=3)
    )
    assert failed
    assert "Could not find any running Ray instance" in res["msg"]
    assert res["missing"] == EXPECTED


def test_head_not_running_fails_fast(monkeypatch, head):
    head.attrs["State"]["Status"] = "exited"
    head.exec_handler = lambda *a, **k: pytest.fail("must not query a stopped head")
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2)
    )
    assert failed and "not running" in res["msg"] and "exited" in res["msg"]
    assert head.clock.now == 0.0


def test_missing_head_container(monkeypatch, head):
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="nope", expected_nodes=EXPECTED, expected_gpus=2)
    )
    assert failed and "nope is not running" in res["msg"] and "missing" in res["msg"]


def test_duplicate_expected_ips_rejected(monkeypatch, head):
    nodes = [{"host": "a", "ip": HEAD_IP}, {"host": "b", "ip": HEAD_IP}]
    failed, res = run_module(monkeypatch, ray_cluster_wait, dict(expected_nodes=nodes, expected_gpus=2))
    assert failed and "expected_nodes" in res["msg"]


def test_a_complete_cluster_is_one_read_and_no_worker_engine_opened(monkeypatch, head):
    seen, opened = [], []

    def handler(cmd, **_kwargs):
        seen.append(cmd)
        return FakeExecResult(0, (json.dumps(recorded("nodes_two_alive.json")) + "\n").encode())

    head.exec_handler = handler
    monkeypatch.setattr(_docker, "connect", lambda host, _timeout: opened.append(host))
    args = dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, watch=2.5, poll_timeout=7)
    failed, res = run_module(monkeypatch, ray_cluster_wait, dict(args, workers=WORKERS))
    assert not failed, res
    assert seen == [["python3", "-c", _ray.RAY_QUERY, "7"]]
    assert opened == [] and res["worker_engines"] == {}


def recorded_execs(container, docs):
    """Each exec is answered with the next document and kept, in order, in the list returned."""
    seen = []

    def handler(cmd, **_kwargs):
        seen.append(cmd)
        return FakeExecResult(0, (json.dumps(docs.pop(0)) + "\n").encode())

    container.exec_handler = handler
    return seen


def test_an_incomplete_cluster_is_watched_with_the_expectation_in_one_exec(monkeypatch, head):
    seen = recorded_execs(head, [recorded("nodes_head_only.json"), recorded("nodes_two_alive.json")])
    args = dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, watch=2.5, poll_timeout=7)
    failed, res = run_module(monkeypatch, ray_cluster_wait, args)
    assert not failed, res
    assert seen == [
        ["python3", "-c", _ray.RAY_QUERY, "7"],
        ["python3", "-c", _ray.RAY_QUERY, "7", "2.5", json.dumps(sorted([HEAD_IP, WORKER_IP])), "2.0", "{}"],
    ]


# The worker's Ray container last started at WORKER_STARTED (Docker's State.StartedAt); a raylet registered
# before that (StartTimeMs, the raylet's clock on the same node) is the one its old container ran.
WORKER_STARTED = "2026-12-02T06:10:03.520431877Z"
WORKER_STARTED_MS = 1796191803520


def with_start_times(doc, worker_ms, head_ms=WORKER_STARTED_MS - 60000):
    for node in doc["nodes"]:
        node["StartTimeMs"] = worker_ms if node["NodeManagerAddress"] == WORKER_IP else head_ms
    return doc


def test_docker_times_read_as_milliseconds():
    assert _ray.docker_time_ms(WORKER_STARTED) == WORKER_STARTED_MS
    assert _ray.docker_time_ms("2026-12-02T06:10:03Z") == WORKER_STARTED_MS - 520
    assert _ray.docker_time_ms("0001-01-01T00:00:00Z") is None
    assert _ray.docker_time_ms(None) is None
    assert _ray.docker_time_ms("yesterday") is None


def test_a_node_from_before_its_container_restarted_is_waited_out(monkeypatch, head):
    # The killed container's raylet is still listed alive; the restarted one registers, then Ray marks the
    # old one dead: only then is the cluster complete.
    stale = with_start_times(recorded("nodes_two_alive.json"), WORKER_STARTED_MS - 30000)
    fresh = with_start_times(recorded("nodes_two_alive.json"), WORKER_STARTED_MS + 1500)
    old_worker = next(n for n in stale["nodes"] if n["NodeManagerAddress"] == WORKER_IP)
    both = {"nodes": fresh["nodes"] + [dict(old_worker, NodeID="0" * 56)]}
    answers(head, [stale, stale, both, fresh])
    expected = [EXPECTED[0], dict(EXPECTED[1], started_at=WORKER_STARTED)]
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=expected, expected_gpus=2)
    )
    assert not failed, res
    assert res["elapsed"] == 3.0
    assert [p["state"] for p in res["progress"]] == [
        "2/2 nodes alive, 2/2 GPUs; not yet dead in Ray: spark-2 (192.0.2.3)"
        " (registered before its Ray container last started)",
        "3/2 nodes alive, 3/2 GPUs; not yet dead in Ray: spark-2 (192.0.2.3)"
        " (registered before its Ray container last started)",
        "2/2 nodes alive, 2/2 GPUs",
    ]


def test_the_watch_is_told_each_nodes_start(monkeypatch, head):
    seen = []
    docs = [recorded("nodes_head_only.json"), with_start_times(recorded("nodes_two_alive.json"), WORKER_STARTED_MS)]

    def handler(cmd, **_kwargs):
        seen.append(cmd)
        return FakeExecResult(0, (json.dumps(docs.pop(0)) + "\n").encode())

    head.exec_handler = handler
    expected = [EXPECTED[0], dict(EXPECTED[1], started_at=WORKER_STARTED)]
    args = dict(container="ray-head", expected_nodes=expected, expected_gpus=2, watch=2.5, poll_timeout=7)
    failed, res = run_module(monkeypatch, ray_cluster_wait, args)
    assert not failed, res
    assert seen[1][-1] == json.dumps({WORKER_IP: WORKER_STARTED_MS})


def test_a_stale_node_at_the_timeout_is_named(monkeypatch, head):
    answers(head, [with_start_times(recorded("nodes_two_alive.json"), WORKER_STARTED_MS - 30000)])
    expected = [EXPECTED[0], dict(EXPECTED[1], started_at=WORKER_STARTED)]
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=expected, expected_gpus=2, timeout=4)
    )
    assert failed
    assert res["missing"] == [] and res["stale"] == [{"host": "spark-2", "ip": WORKER_IP}]
    assert "Node spark-2 (192.0.2.3) is still listed alive from before its Ray container last started" in res["msg"]
    assert "Missing node" not in res["msg"] and "GPUs do not add up" not in res["msg"]


def test_a_start_time_ray_did_not_set_is_not_stale(monkeypatch, head):
    answers(head, [with_start_times(recorded("nodes_two_alive.json"), 0)])
    expected = [EXPECTED[0], dict(EXPECTED[1], started_at=WORKER_STARTED)]
    failed, res = run_module(
        monkeypatch, ray_cluster_wait, dict(container="ray-head", expected_nodes=expected, expected_gpus=2, timeout=4)
    )
    assert not failed, res
    assert res["stale"] == [] and res["alive_nodes"] == 2


def test_a_docker_time_with_an_offset_is_not_read():
    assert _ray.docker_time_ms("2026-12-02T07:10:03.52+01:00") is None
    assert _ray.docker_time_ms("2026-12-02T07:10:03+01:00") is None


def test_head_restarting_while_waited_for_fails_with_its_log(monkeypatch, head):
    # The restart policy brings a crashing Ray back: each restart bumps RestartCount, never "exited".
    head.attrs["RestartCount"] = 2

    def crash_loop(_cmd, **_kwargs):
        head.attrs["RestartCount"] += 1
        return FakeExecResult(1, fixture_text("ray", "query_no_ray.stderr").encode())

    head.exec_handler = crash_loop
    failed, res = run_module(
        monkeypatch,
        ray_cluster_wait,
        dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, timeout=300, interval=0.25),
    )
    assert failed
    assert "the head container ray-head restarted: Ray exited in it" in res["msg"]
    assert head.clock.now < 1.0
    assert "Ray runtime started" in res["head_log"]


def worker_engine(monkeypatch):
    """spark-2's engine, reached by ssh:// from the head, holding its Ray container (recorded inspect)."""
    engine = FakeClient()
    attrs = inspect("container_ray_head.json")
    attrs["Name"] = "/ray-worker"
    attrs["RestartCount"] = 0
    container = engine.containers.add(FakeContainer(attrs, log=b"Local node IP: 192.0.2.3\n"))
    monkeypatch.setattr(_docker, "connect", lambda host, _timeout: {"ssh://root@192.0.2.3": engine}[host])
    return container


def exit_container(worker):
    worker.attrs["State"]["Status"] = "exited"


def restart_container(worker):
    # A crash loop: the restart policy brings Ray back each time, only the count shows it.
    worker.attrs["RestartCount"] += 3


@pytest.mark.parametrize(("crash", "seen"), [(exit_container, "exited"), (restart_container, "restarted")])
def test_a_worker_container_exiting_or_restarting_stops_the_wait_naming_it(monkeypatch, head, crash, seen):
    worker = worker_engine(monkeypatch)
    polls = []

    def still_one_node(_cmd, **_kwargs):
        polls.append(1)
        if len(polls) == 2:
            crash(worker)
        return FakeExecResult(0, (json.dumps(recorded("nodes_head_only.json")) + "\n").encode())

    head.exec_handler = still_one_node
    failed, res = run_module(
        monkeypatch,
        ray_cluster_wait,
        dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, workers=WORKERS, timeout=300),
    )
    assert failed
    assert "the Ray container ray-worker on spark-2 %s: Ray exited in it" % seen in res["msg"]
    assert "--- spark-2 ray-worker log:\nLocal node IP: 192.0.2.3" in res["msg"]
    assert res["worker_engines"] == {"spark-2": "watched"}
    assert head.clock.now < 5


def test_an_unreachable_worker_engine_is_reported_and_the_join_still_decides(monkeypatch, head):
    def refuse(host, _timeout):
        raise ray_cluster_wait.DockerException("ssh: connect to host 192.0.2.3 port 22: Connection refused")

    monkeypatch.setattr(_docker, "connect", refuse)
    answers(head, [recorded("nodes_head_only.json"), recorded("nodes_two_alive.json")])
    failed, res = run_module(
        monkeypatch,
        ray_cluster_wait,
        dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, workers=WORKERS),
    )
    assert not failed, res
    assert res["worker_engines"]["spark-2"].startswith("not watched: ssh: connect to host 192.0.2.3")
    assert res["alive_nodes"] == 2


def test_a_worker_restarting_once_to_join_the_new_head_is_let_be(monkeypatch, head):
    # Its old head went away: Ray exits once in it and the restart policy brings it to the new head.
    worker = worker_engine(monkeypatch)
    polls = []

    def rejoin(_cmd, **_kwargs):
        polls.append(1)
        if len(polls) == 2:
            worker.attrs["RestartCount"] += 1
        doc = recorded("nodes_head_only.json" if len(polls) < 4 else "nodes_two_alive.json")
        return FakeExecResult(0, (json.dumps(doc) + "\n").encode())

    head.exec_handler = rejoin
    failed, res = run_module(
        monkeypatch,
        ray_cluster_wait,
        dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, workers=WORKERS, timeout=300),
    )
    assert not failed, res
    assert res["alive_nodes"] == 2 and res["worker_engines"] == {"spark-2": "watched"}


def test_a_watch_runs_no_later_than_the_timeout(monkeypatch, head):
    seen = recorded_execs(head, [recorded("nodes_head_only.json"), recorded("nodes_two_alive.json")])
    monkeypatch.setattr(ray_cluster_wait.time, "monotonic", lambda: 100.0)
    args = dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, timeout=3, poll_timeout=7)
    failed, res = run_module(monkeypatch, ray_cluster_wait, args)
    assert not failed, res
    # The default watch (60 s) cut to the 3 s the wait has left.
    assert [cmd[4] for cmd in seen[1:]] == ["3"]


def test_a_worker_exiting_while_a_watch_runs_ends_the_watch_at_once(monkeypatch, head):
    worker = worker_engine(monkeypatch)
    stopped = threading.Event()
    calls = []

    def handler(cmd, **_kwargs):
        calls.append(cmd)
        if cmd[2] == _ray.STOP_WATCH:
            stopped.set()
            return FakeExecResult(0, b"")
        if len(cmd) > 4:
            # The watch: the worker's Ray exits while it runs; it answers only once it is stopped.
            exit_container(worker)
            assert stopped.wait(10), "the watch was never stopped"
            return FakeExecResult(-15, b"")
        return FakeExecResult(0, (json.dumps(recorded("nodes_head_only.json")) + "\n").encode())

    head.exec_handler = handler
    started = time.monotonic()
    failed, res = run_module(
        monkeypatch,
        ray_cluster_wait,
        dict(container="ray-head", expected_nodes=EXPECTED, expected_gpus=2, workers=WORKERS, timeout=300),
    )
    assert failed
    assert "the Ray container ray-worker on spark-2 exited: Ray exited in it" in res["msg"]
    assert calls[-1] == ["python3", "-c", _ray.STOP_WATCH, _ray.RAY_QUERY]
    # Found by the check beside the watch (every 2.5 s), not after the watch's 60 s.
    assert time.monotonic() - started < 5


def test_stop_watch_ends_only_the_watching_queries():
    # Real processes with the argv shapes ray_cluster_wait execs: a one-read query and a watch of the same script.
    script = "import time; time.sleep(60)"
    one_read = subprocess.Popen([sys.executable, "-c", script, "7"])
    watching = subprocess.Popen([sys.executable, "-c", script, "7", "60", "[]", "2.0", "{}"])
    try:
        # Popen returns once each child has exec'd: its argv is in /proc already.
        subprocess.run([sys.executable, "-c", _ray.STOP_WATCH, script], check=True, timeout=30)
        assert watching.wait(10) == -15
        assert one_read.poll() is None
    finally:
        for proc in (one_read, watching):
            proc.kill()
            proc.wait()
