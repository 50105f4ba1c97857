"""stage_state: record what a stage left, then probe it against recorded ip/ping runs, files and images."""

from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import threading
import time

import pytest
from _fabric_fakes import FakeHost, recorded
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _stage_state
from ansible_collections.dgx_spark.vllm.plugins.modules import stage_state
from fake_docker import FakeClient
from module_runner import FIXTURES, run_module

IF0, PEER0 = "enp1s0f1np1", "198.18.100.12"
IMAGE = "dgx-spark/vllm-runtime:in-service"


@pytest.fixture
def node(monkeypatch, tmp_path):
    """A node with one configured rail (recorded ip output), a pingable peer, an env file and an image."""
    host = FakeHost(monkeypatch, "addr_configured")
    host.ping_results[(IF0, PEER0, True)] = recorded("ping", "ping_ok")
    env = tmp_path / "nccl.env"
    env.write_text("NCCL_SOCKET_IFNAME=enp1s0f1np1\n")
    client = FakeClient(images={IMAGE: {"Id": "sha256:" + "a" * 64}})
    monkeypatch.setattr(_stage_state, "HAS_DOCKER", True)
    monkeypatch.setattr(_stage_state.LiveState, "docker", lambda _self, _host: (client, None))
    return dict(host=host, env=env, client=client, record=tmp_path / "stages.json", tmp=tmp_path)


def stages(node, **inputs):
    fabric_checks = dict(
        interfaces=[dict(name=IF0, mtu=9000, address="198.18.100.11/24")],
        files=[str(node["env"])],
        ping=dict(mtu=9000, count=3, timeout=1, rails=[dict(interface=IF0, peers=[PEER0])]),
    )
    return [
        dict(name="preflight", inputs=inputs.get("preflight", "p1"), checks=dict(directories=[str(node["tmp"])])),
        dict(name="fabric", inputs=inputs.get("fabric", "f1"), checks=fabric_checks),
        dict(
            name="runtime_image",
            inputs=inputs.get("runtime_image", "r1"),
            checks=dict(images=dict(docker_host="unix:///var/run/docker.sock", refs=[IMAGE])),
        ),
    ]


def record(monkeypatch, node, given=None, facts=None, check_mode=False):
    given = given or stages(node)
    for stage in given:
        stage["facts"] = (facts or {}).get(stage["name"], {})
    args = dict(operation="record", path=str(node["record"]), stages=given)
    if check_mode:
        args["_ansible_check_mode"] = True
    return run_module(monkeypatch, stage_state, args)


def probe(monkeypatch, node, given=None):
    failed, result = run_module(
        monkeypatch, stage_state, dict(operation="probe", path=str(node["record"]), stages=given or stages(node))
    )
    assert not failed, result
    return result


def verdicts(result):
    return [(s["name"], s["converged"]) for s in result["stages"]]


def test_no_record_runs_every_stage(monkeypatch, node):
    result = probe(monkeypatch, node)
    assert result["first_run"] == 0
    assert verdicts(result) == [("preflight", False), ("fabric", False), ("runtime_image", False)]
    assert result["stages"][0]["reasons"] == ["no record of a successful run"]
    assert [s["recorded"] for s in result["stages"]] == [False] * 3
    assert result["stages"][2]["reasons"] == ["an earlier stage (preflight) runs"]


def test_recorded_state_is_converged_and_returns_the_facts(monkeypatch, node):
    failed, result = record(monkeypatch, node, facts={"fabric": {"fabric_ip": "198.18.100.11"}})
    assert not failed, result
    assert result["changed"] is True
    assert stat.S_IMODE(os.stat(node["record"]).st_mode) == 0o600
    saved = json.loads(node["record"].read_text())["stages"]
    assert saved["runtime_image"]["fingerprint"]["images"] == {IMAGE: "sha256:" + "a" * 64}
    assert saved["fabric"]["fingerprint"]["interfaces"][IF0]["mtu"] == 9000

    result = probe(monkeypatch, node)
    assert result["first_run"] == 3
    assert verdicts(result) == [("preflight", True), ("fabric", True), ("runtime_image", True)]
    assert result["stages"][1]["facts"] == {"fabric_ip": "198.18.100.11"}
    assert set(result["seconds"]) >= {"interfaces", "ping", "images", "files", "directories"}

    # Recorded again, the stages carry the new run's time (the one thing that changed).
    first = saved["fabric"]["at"]
    failed, _again = record(monkeypatch, node, facts={"fabric": {"fabric_ip": "198.18.100.11"}})
    resaved = json.loads(node["record"].read_text())["stages"]
    assert not failed and resaved["fabric"]["at"] > first
    assert {k: v for k, v in resaved["fabric"].items() if k != "at"} == {
        k: v for k, v in saved["fabric"].items() if k != "at"
    }
    assert probe(monkeypatch, node)["first_run"] == 3


def test_a_stage_recorded_alone_after_the_later_ones_runs_them_again(monkeypatch, node):
    """--tags fabric alone, after a full run: what the later stages were recorded on is older than it."""
    record(monkeypatch, node)
    time.sleep(0.01)
    record(monkeypatch, node, given=stages(node)[1:2])
    result = probe(monkeypatch, node)
    assert verdicts(result) == [("preflight", True), ("fabric", True), ("runtime_image", False)]
    assert result["stages"][2]["reasons"] == ["an earlier stage (fabric) ran after its last successful run"]
    assert result["first_run"] == 2


def test_mtu_drift_runs_the_fabric_stage_and_every_later_one(monkeypatch, node):
    record(monkeypatch, node, facts={"runtime_image": {"runtime_image_id": "sha256:" + "a" * 64}})
    node["host"].link["mtu"] = 1500
    result = probe(monkeypatch, node)
    assert result["first_run"] == 1
    assert verdicts(result) == [("preflight", True), ("fabric", False), ("runtime_image", False)]
    reasons = " ".join(result["stages"][1]["reasons"])
    assert "enp1s0f1np1 has MTU 1500, 9000 wanted" in reasons
    assert "changed since the last successful run: interfaces" in reasons
    assert result["stages"][2]["reasons"] == ["an earlier stage (fabric) runs"]
    # Recorded but not converged: its last run's facts still come back (for a run with --tags of a later stage).
    assert result["stages"][2]["recorded"] is True
    assert result["stages"][2]["facts"] == {"runtime_image_id": "sha256:" + "a" * 64}


def test_lost_df_ping_runs_the_fabric_stage(monkeypatch, node):
    record(monkeypatch, node)
    node["host"].ping_results[(IF0, PEER0, True)] = recorded("ping", "ping_frag_needed")
    result = probe(monkeypatch, node)
    assert verdicts(result)[1] == ("fabric", False)
    assert "MTU mismatch on the path" in result["stages"][1]["reasons"][0]


def test_edited_env_file_and_replaced_image_are_seen(monkeypatch, node):
    record(monkeypatch, node)
    node["env"].write_text("NCCL_SOCKET_IFNAME=eth0\n")
    node["client"].images.items[IMAGE] = {"Id": "sha256:" + "b" * 64}
    result = probe(monkeypatch, node)
    assert result["stages"][1]["reasons"] == ["changed since the last successful run: files"]
    # The chain reports the first cause only; the image stage runs because fabric does.
    assert result["stages"][2]["reasons"] == ["an earlier stage (fabric) runs"]

    node["env"].write_text("NCCL_SOCKET_IFNAME=enp1s0f1np1\n")
    result = probe(monkeypatch, node)
    assert result["first_run"] == 2
    assert result["stages"][2]["reasons"] == ["changed since the last successful run: images"]


def test_changed_settings_run_the_stage(monkeypatch, node):
    record(monkeypatch, node)
    result = probe(monkeypatch, node, stages(node, fabric="f2"))
    assert result["first_run"] == 1
    assert result["stages"][1]["reasons"] == ["its settings changed since the last successful run"]


def test_a_stage_failing_its_checks_is_not_recorded_and_its_old_record_goes(monkeypatch, node):
    record(monkeypatch, node)
    node["client"].images.items.clear()
    failed, result = record(monkeypatch, node)
    assert not failed, result
    assert [(s["name"], s["converged"]) for s in result["stages"]][2] == ("runtime_image", False)
    assert result["stages"][2]["reasons"] == ["image %s is missing" % IMAGE]
    assert "runtime_image" not in json.loads(node["record"].read_text())["stages"]


def test_check_mode_writes_nothing(monkeypatch, node):
    failed, result = record(monkeypatch, node, check_mode=True)
    assert not failed and result["changed"] is True
    assert not node["record"].exists()


def test_model_manifest_change_is_seen(monkeypatch, node):
    model = node["tmp"] / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}')
    given = [dict(name="model", inputs="m1", checks=dict(model=dict(path=str(model), fingerprint="sample")))]
    record(monkeypatch, node, given=[dict(g) for g in given])
    assert probe(monkeypatch, node, given)["stages"][0]["converged"] is True
    (model / "config.json").write_text('{"architectures": ["Other"]}')
    assert probe(monkeypatch, node, given)["stages"][0]["reasons"] == ["changed since the last successful run: model"]


def test_unknown_check_is_refused_naming_it(monkeypatch, node):
    failed, result = run_module(
        monkeypatch,
        stage_state,
        dict(operation="probe", path=str(node["record"]), stages=[dict(name="fabric", inputs="x", checks={"mtu": 1})]),
    )
    assert failed
    assert "stages: fabric has unknown checks ['mtu']" in result["msg"]
    assert not node["record"].exists()


def test_a_record_of_another_version_is_ignored(monkeypatch, node):
    node["record"].write_text(json.dumps({"version": 0, "stages": {"preflight": {"inputs": "p1"}}}))
    assert probe(monkeypatch, node)["stages"][0]["reasons"] == ["no record of a successful run"]


def test_check_runs_the_checks_now_and_writes_no_record(monkeypatch, tmp_path):
    # No fakes: the real ssh client against loopback with a key that does not exist is refused, whatever
    # listens on port 22.
    key, path = str(tmp_path / "no-such-key"), tmp_path / "stages.json"
    given = [
        dict(name="dirs", inputs="", checks=dict(directories=[str(tmp_path)])),
        dict(name="peers", inputs="", checks=dict(ssh=dict(key=key, user="spark", addresses=["127.0.0.1"]))),
    ]
    failed, result = run_module(monkeypatch, stage_state, dict(operation="check", path=str(path), stages=given))
    assert not failed and not result["changed"]
    assert verdicts(result) == [("dirs", True), ("peers", False)]
    (reason,) = result["stages"][1]["reasons"]
    assert reason.startswith("ssh spark@127.0.0.1 with %s fails (" % key), reason
    assert not path.exists()


def test_check_passes_every_stage_whose_checks_pass(monkeypatch, node):
    given = [dict(name="dirs", inputs="", checks=dict(directories=[str(node["tmp"])]))]
    failed, result = run_module(monkeypatch, stage_state, dict(operation="check", stages=given))
    assert not failed and verdicts(result) == [("dirs", True)] and result["stages"][0]["reasons"] == []
    given[0]["checks"]["directories"].append(str(node["tmp"] / "gone"))
    failed, result = run_module(monkeypatch, stage_state, dict(operation="check", stages=given))
    assert not failed and verdicts(result) == [("dirs", False)]


def ray_stage(running=("ray-head",), absent=("vllm-mp",)):
    spec = dict(running=list(running), absent=list(absent))
    return [dict(name="ray_cluster", inputs="c1", checks=dict(containers=spec))]


def start_container(node, name, started):
    """A container made the way the engine does (the recorded ray-head inspect), started at `started`."""
    container = node["client"].containers.create(name=name)
    container.start()
    container.attrs["State"]["StartedAt"] = started
    return container


def test_the_same_running_container_is_converged(monkeypatch, node):
    start_container(node, "ray-head", "2026-12-02T13:00:00.1Z")
    failed, result = record(monkeypatch, node, given=ray_stage())
    assert not failed and result["changed"] is True
    saved = json.loads(node["record"].read_text())["stages"]["ray_cluster"]["fingerprint"]["containers"]
    assert saved == {"ray-head": "new0001@2026-12-02T13:00:00.1Z"}
    assert verdicts(probe(monkeypatch, node, ray_stage())) == [("ray_cluster", True)]


def test_a_container_docker_restarted_or_someone_recreated_runs_the_stage(monkeypatch, node):
    head = start_container(node, "ray-head", "2026-12-02T13:00:00.1Z")
    record(monkeypatch, node, given=ray_stage())
    head.attrs["State"]["StartedAt"] = "2026-12-02T13:05:00.2Z"
    result = probe(monkeypatch, node, ray_stage())
    assert result["stages"][0]["reasons"] == ["changed since the last successful run: containers"]
    node["client"].containers.items.pop("ray-head")
    start_container(node, "ray-head", "2026-12-02T13:00:00.1Z")
    assert probe(monkeypatch, node, ray_stage())["stages"][0]["converged"] is False


def test_a_stopped_container_or_one_of_the_other_backend_runs_the_stage(monkeypatch, node):
    head = start_container(node, "ray-head", "2026-12-02T13:00:00.1Z")
    record(monkeypatch, node, given=ray_stage())
    head.attrs["State"]["Status"] = "exited"
    assert probe(monkeypatch, node, ray_stage())["stages"][0]["reasons"][0] == "container ray-head is exited"
    head.attrs["State"]["Status"] = "running"
    # A changed fingerprint: the stage runs, though no check fails.
    head.attrs["State"]["StartedAt"] = "2026-12-02T13:05:00.0Z"
    (stage,) = probe(monkeypatch, node, ray_stage())["stages"]
    assert not stage["converged"] and stage["checks_passed"]
    head.attrs["State"]["StartedAt"] = "2026-12-02T13:00:00.1Z"
    start_container(node, "vllm-mp", "2026-12-02T13:06:00.0Z")
    (stage,) = probe(monkeypatch, node, ray_stage())["stages"]
    assert stage["reasons"] == ["container vllm-mp is there"] and stage["checks_passed"] is False
    node["client"].containers.items.pop("ray-head")
    assert "container ray-head is missing" in probe(monkeypatch, node, ray_stage())["stages"][0]["reasons"]


def test_a_service_that_stops_answering_runs_its_stage(monkeypatch, tmp_path):
    # A real listening socket on loopback, then the same port closed.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    given = [
        dict(
            name="monitoring",
            inputs="",
            checks=dict(listening=[dict(name="node_exporter", address="127.0.0.1", port=port)]),
        )
    ]
    args = dict(operation="check", path=str(tmp_path / "stages.json"), stages=given)
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and verdicts(result) == [("monitoring", True)]
    server.close()
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and verdicts(result) == [("monitoring", False)]
    (reason,) = result["stages"][0]["reasons"]
    assert reason.startswith("node_exporter does not answer at 127.0.0.1:%d (" % port), reason


# --- the endpoint the head serves, asked by the probe alongside the live checks -------------------------
with open(os.path.join(FIXTURES, "vllm_api", "lab-0.32.0-tp2-ray.json"), encoding="utf-8") as _handle:
    ENGINE = json.load(_handle)
SERVED = ENGINE["models"]["data"][0]["id"]


@pytest.fixture
def engine():
    """A real HTTP server on loopback answering as the lab engine did; `state["completion"]` can be set to
    an HTTP status (the engine core dead) or to "hang"."""
    state = dict(completion=200, keys=[], asked=[])

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args):
            pass

        def answer(self, code, body=None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            state["keys"].append(self.headers.get("Authorization"))
            state["asked"].append(self.path)
            known = {"/health": None, "/v1/models": ENGINE["models"], "/version": ENGINE["version"]}
            self.answer(200, known[self.path])

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            state["keys"].append(self.headers.get("Authorization"))
            state["asked"].append(self.path)
            if state["completion"] == "hang":
                time.sleep(3)
                return
            self.answer(state["completion"], ENGINE["completion"] if state["completion"] == 200 else {})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, server.server_address[1]
    server.shutdown()
    server.server_close()


def serving(node, port, **over):
    given = [dict(name="vllm_server", inputs="v1", checks=dict(directories=[str(node["tmp"])]))]
    endpoint = dict(
        stage="vllm_server",
        host="0.0.0.0",  # noqa: S104 - a wildcard bind is asked through loopback
        port=port,
        served_model_name=SERVED,
        api_key="s3cret",
    )
    endpoint.update(over)
    return dict(operation="probe", path=str(node["record"]), stages=given, endpoint=endpoint)


def test_a_serving_endpoint_keeps_its_stage_converged_and_is_reported(monkeypatch, node, engine):
    state, port = engine
    args = serving(node, port)
    assert not record(monkeypatch, node, given=args["stages"])[0]
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and verdicts(result) == [("vllm_server", True)]
    answer = result["endpoint"]
    # The warm check is the one completion: the engine's name and version come from the stage record.
    assert answer["probe"]["ok"] and state["asked"] == ["/v1/completions"]
    assert answer["engine"] is None and answer["probe"]["engine_version"] is None
    assert answer["endpoint"] == "http://127.0.0.1:%d/v1" % port and answer["model"] == SERVED
    assert answer["completion"] == ENGINE["completion"]["choices"][0]["text"]
    assert "endpoint" in result["seconds"]
    # The key went in the header, and nowhere in the result.
    assert set(state["keys"]) == {"Bearer s3cret"} and "s3cret" not in json.dumps(result)


FULL_PROBE = ["/v1/completions", "/health", "/v1/models", "/version", "/v1/completions"]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # A failed warm check is probed in full, which names the step; a hung one is not asked again.
        (500, ("the endpoint failed its probe at completion: the completion failed: HTTP 500", FULL_PROBE)),
        ("hang", ("the endpoint failed its probe at completion: no completion within", ["/v1/completions"])),
    ],
)
def test_an_engine_that_fails_its_probe_runs_the_stage(monkeypatch, node, engine, completion, expected):
    reason, asked = expected
    state, port = engine
    args = serving(node, port, timeout=2)
    record(monkeypatch, node, given=args["stages"])
    state["completion"] = completion
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and verdicts(result) == [("vllm_server", False)] and result["first_run"] == 0
    assert result["stages"][0]["reasons"][0].startswith(reason), result["stages"][0]["reasons"]
    assert state["asked"] == asked
    # A failed probe reports no endpoint to the summary, only the probe.
    assert not result["endpoint"]["probe"]["ok"] and set(result["endpoint"]) == {"probe"}


def test_no_endpoint_answering_runs_the_stage_naming_health(monkeypatch, node):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    args = serving(node, port, timeout=1)
    record(monkeypatch, node, given=args["stages"])
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and result["stages"][0]["reasons"] == [
        "the endpoint failed its probe at health: /health did not answer within 1s"
    ]


def test_a_stage_whose_settings_changed_runs_without_asking_its_endpoint(monkeypatch, node, engine):
    state, port = engine
    args = serving(node, port)
    record(monkeypatch, node, given=args["stages"])
    args["stages"][0]["inputs"] = "v2"
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and result["stages"][0]["reasons"] == ["its settings changed since the last successful run"]
    assert state["keys"] == [] and "endpoint" not in result


# --- the plan: one key for a run's settings and code; a node whose plan has it is probed from the record ---
def plan_probe(monkeypatch, node, key, api_key=None):
    failed, result = run_module(
        monkeypatch,
        stage_state,
        dict(operation="probe", path=str(node["record"]), plan=dict(key=key, api_key=api_key)),
    )
    assert not failed, result
    return result


def record_plan(monkeypatch, node, key, given, endpoint=None):
    plan = dict(key=key, stages=given)
    if endpoint:
        plan["endpoint"] = endpoint
    return run_module(monkeypatch, stage_state, dict(operation="record", path=str(node["record"]), plan=plan))


def test_without_a_plan_or_with_another_key_nothing_is_probed(monkeypatch, node):
    result = plan_probe(monkeypatch, node, "k1")
    assert result["plan"] == dict(matched=False, why="no plan recorded by a successful run")
    assert result["stages"] == [] and result["first_run"] == 0
    assert not record(monkeypatch, node)[0]
    assert not record_plan(monkeypatch, node, "k1", stages(node))[0]
    result = plan_probe(monkeypatch, node, "k2")
    assert result["plan"]["matched"] is False and result["plan"]["why"].startswith("the settings or the collection")
    # Nothing was read: no ping went out for the other key.
    assert result["seconds"] == {}


def test_the_plan_probes_the_recorded_checks_and_sees_drift(monkeypatch, node):
    assert not record(monkeypatch, node, facts={"fabric": {"fabric_ip": "198.18.100.11"}})[0]
    failed, result = record_plan(monkeypatch, node, "k1", stages(node))
    assert not failed and result["plan"] == dict(recorded=True, why=None) and result["changed"] is True
    # The same plan again changes nothing on the node.
    assert record_plan(monkeypatch, node, "k1", stages(node))[1]["changed"] is False
    result = plan_probe(monkeypatch, node, "k1")
    assert result["plan"]["matched"] is True and result["first_run"] == 3
    assert verdicts(result) == [("preflight", True), ("fabric", True), ("runtime_image", True)]
    # The plan's own stages come back, for a run that describes only the stages it runs to record again.
    given = stages(node)
    assert [(s["name"], s["inputs"], s["checks"]) for s in result["plan"]["stages"]] == [
        (s["name"], s["inputs"], s["checks"]) for s in given
    ]
    assert result["plan"]["endpoint"] is None
    # With the facts each stage's record keeps, and this node's memory for the memory-fit check.
    given[1]["fact_names"] = ["fabric_ip"]
    assert record_plan(monkeypatch, node, "k1", given)[1]["changed"] is True
    result = plan_probe(monkeypatch, node, "k1")
    assert [s["fact_names"] for s in result["plan"]["stages"]] == [[], ["fabric_ip"], []]
    assert result["meminfo"].startswith("MemTotal:")
    assert result["stages"][1]["facts"] == {"fabric_ip": "198.18.100.11"}
    # The recorded checks are read live: an edited env file runs the fabric stage and the later ones.
    node["env"].write_text("NCCL_SOCKET_IFNAME=other\n")
    result = plan_probe(monkeypatch, node, "k1")
    assert result["first_run"] == 1 and verdicts(result)[1:] == [("fabric", False), ("runtime_image", False)]
    # No check fails (a changed file is a changed fingerprint): the image stage runs after the fabric one
    # though its own checks pass.
    assert [s["checks_passed"] for s in result["stages"]] == [True, True, True]


def test_a_plan_is_kept_only_where_every_stage_is_recorded_under_its_settings(monkeypatch, node):
    assert not record(monkeypatch, node)[0]
    failed, result = record_plan(monkeypatch, node, "k1", stages(node, fabric="f2"))
    assert not failed and result["plan"] == dict(recorded=False, why="not recorded under these settings: fabric")
    assert "plan" not in json.loads(node["record"].read_text())
    assert plan_probe(monkeypatch, node, "k1")["plan"]["matched"] is False
    # A stage recorded again later (a --tags run) keeps the plan: its probe compares that stage's settings.
    assert not record_plan(monkeypatch, node, "k1", stages(node))[0]
    assert not record(monkeypatch, node, given=stages(node, fabric="f2")[1:2])[0]
    result = plan_probe(monkeypatch, node, "k1")
    assert result["plan"]["matched"] is True and result["first_run"] == 1
    assert result["stages"][1]["reasons"] == ["its settings changed since the last successful run"]


def test_the_plan_asks_the_recorded_endpoint_with_the_key_given_never_written(monkeypatch, node, engine):
    state, port = engine
    args = serving(node, port)
    assert not record(monkeypatch, node, given=args["stages"])[0]
    assert not record_plan(monkeypatch, node, "k1", args["stages"], endpoint=args["endpoint"])[0]
    assert "s3cret" not in node["record"].read_text()
    result = plan_probe(monkeypatch, node, "k1", api_key="s3cret")
    assert verdicts(result) == [("vllm_server", True)] and result["endpoint"]["probe"]["ok"]
    assert state["asked"] == ["/v1/completions"] and set(state["keys"]) == {"Bearer s3cret"}
    # The recorded endpoint comes back without the key.
    assert result["plan"]["endpoint"]["port"] == port and "api_key" not in result["plan"]["endpoint"]
    state["completion"] = 500
    result = plan_probe(monkeypatch, node, "k1", api_key="s3cret")
    assert result["first_run"] == 0 and result["stages"][0]["reasons"][0].startswith(
        "the endpoint failed its probe at completion"
    )


def test_neither_stages_nor_a_plan_is_refused(monkeypatch, node):
    failed, result = run_module(monkeypatch, stage_state, dict(operation="probe", path=str(node["record"])))
    assert failed and result["msg"].startswith("stages: give the stages")


def test_a_plan_endpoint_without_its_required_keys_is_refused(monkeypatch, node):
    failed, result = record_plan(monkeypatch, node, "k1", stages(node), endpoint=dict(stage="vllm_server", port=8000))
    assert failed and result["msg"].startswith("plan.endpoint: missing required arguments: host, served_model_name")
    assert not node["record"].exists()


def test_a_hung_endpoint_is_not_waited_for_when_an_earlier_stage_runs(monkeypatch, node, engine):
    state, port = engine
    args = serving(node, port, timeout=3)
    args["stages"] = [*stages(node), *args["stages"]]
    assert not record(monkeypatch, node, given=args["stages"])[0]
    state["completion"] = "hang"
    node["env"].write_text("NCCL_SOCKET_IFNAME=other\n")
    failed, result = run_module(monkeypatch, stage_state, args)
    # The fabric stage runs (and every later one): the hung completion is not waited out, so no answer of
    # it (waited for, it would be reported as failed at the completion) comes back.
    assert not failed and result["first_run"] == 1 and "endpoint" not in result
    assert "endpoint" not in result["seconds"]


def test_an_answer_given_from_earlier_in_the_run_is_taken_and_the_endpoint_not_asked(monkeypatch, node, engine):
    state, port = engine
    args = serving(node, port)
    record(monkeypatch, node, given=args["stages"])
    failed_answer = dict(ok=False, step="completion", why="no completion within 60s: the engine hangs", seconds=60.0)
    args["endpoint"]["answer"] = failed_answer
    failed, result = run_module(monkeypatch, stage_state, args)
    assert not failed and state["asked"] == [] and result["endpoint"]["probe"]["why"] == failed_answer["why"]
    assert result["stages"][0]["reasons"] == [
        "the endpoint failed its probe at completion: no completion within 60s: the engine hangs"
    ]


def test_a_source_image_named_again_runs_the_stage_and_one_removed_does_not(monkeypatch, node):
    source = "registry.example/vllm/vllm-openai:v0.33.0"
    given = stages(node)
    given[2]["checks"]["sources"] = dict(docker_host="unix:///var/run/docker.sock", refs=[source])
    node["client"].images.items[source] = {"Id": "sha256:" + "c" * 64}
    record(monkeypatch, node, given)
    assert verdicts(probe(monkeypatch, node, given))[2] == ("runtime_image", True)

    # Removed after its image was promoted: the in-service image still serves, nothing to run.
    del node["client"].images.items[source]
    assert verdicts(probe(monkeypatch, node, given))[2] == ("runtime_image", True)

    # Pulled again under the same name: a full run would verify and promote it.
    node["client"].images.items[source] = {"Id": "sha256:" + "d" * 64}
    result = probe(monkeypatch, node, given)
    assert result["stages"][2]["reasons"] == ["changed since the last successful run: sources"]
