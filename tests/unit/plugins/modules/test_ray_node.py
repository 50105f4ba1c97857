"""ray_node against a fake engine holding recorded real `docker inspect` output."""

from __future__ import annotations

import json

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _container
from ansible_collections.dgx_spark.vllm.plugins.modules import ray_node
from fake_docker import FakeClient, FakeContainer, inspect, use_client
from module_runner import fixture_text, run_module

IMAGE = "bringup-test/ray-entrypoint:1"

# The arguments the recorded container (fixtures/docker/container_ray_head.json) was created with
# by this module on the real engine.
RECORDED_ARGS = dict(
    name="bringup-test-ray-head",
    role="head",
    image=IMAGE,
    node_ip="127.0.0.1",
    declared_gpus=1,
    shm_size="1g",
    env={"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"},
    mounts=[{"source": "/tmp/bt", "target": "/models", "read_only": True}],  # noqa: S108 - as recorded
    start_timeout=5,
)


@pytest.fixture
def client(monkeypatch):
    fake = FakeClient(
        images={IMAGE: inspect("image_with_entrypoint.json"), "plain:1": inspect("image_no_entrypoint.json")}
    )
    return use_client(monkeypatch, ray_node, fake)


def recorded_container(client):
    return client.containers.add(
        FakeContainer(inspect("container_ray_head.json"), log=fixture_text("docker", "container_ray_head.log").encode())
    )


def test_create_overrides_entrypoint_and_builds_the_container(monkeypatch, client):
    failed, res = run_module(monkeypatch, ray_node, RECORDED_ARGS)
    assert not failed, res
    assert res["changed"] and res["actions"] == ["created"]
    assert res["image_entrypoint"] == ["/opt/start.sh"]
    assert res["entrypoint"] == "overrode ENTRYPOINT ['/opt/start.sh'] with ['ray']"
    kwargs = client.containers.created[0]
    assert kwargs["entrypoint"] == ["ray"]
    assert kwargs["command"][:2] == ["start", "--head"]
    assert "--node-ip-address=127.0.0.1" in kwargs["command"]
    assert "--num-gpus=1" in kwargs["command"]
    assert "--include-dashboard=false" in kwargs["command"]
    assert kwargs["command"][-2:] == ["--disable-usage-stats", "--block"]
    assert kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host"
    assert kwargs["init"] is True and kwargs["privileged"] is False
    assert kwargs["restart_policy"] == {"Name": "unless-stopped"}
    # Declared GPU only: no device request, no RDMA devices in the lab.
    assert "device_requests" not in kwargs and "devices" not in kwargs and "cap_add" not in kwargs
    assert kwargs["environment"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert kwargs["mounts"][0]["Target"] == "/models" and kwargs["mounts"][0]["ReadOnly"] is True


def test_hash_matches_the_label_the_real_engine_holds(monkeypatch, client):
    container = recorded_container(client)
    failed, res = run_module(monkeypatch, ray_node, RECORDED_ARGS)
    assert not failed, res
    assert res["config_hash"] == container.labels[_container.HASH_LABEL]
    assert not res["changed"] and res["actions"] == []
    assert client.containers.created == [] and "start" not in container.calls
    # The Ray wait holds this node's registration against the container's last start.
    assert res["container"]["started_at"] == container.attrs["State"]["StartedAt"]


def test_changed_env_recreates(monkeypatch, client):
    container = recorded_container(client)
    args = dict(RECORDED_ARGS, env={"NCCL_SOCKET_IFNAME": "enp1s0f1np1"})
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed, res
    assert res["actions"] == ["recreated"]
    assert ("remove", True) in container.calls
    assert client.containers.created[0]["environment"]["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert res["diff"]["before"]["config_hash"] != res["diff"]["after"]["config_hash"]


def test_the_env_file_is_the_same_environment_and_hash_as_the_same_entries_given_inline(monkeypatch, client, tmp_path):
    # The fabric stage's nccl.env as the nccl_env module renders it: the recorded container is left alone.
    env_file = tmp_path / "nccl.env"
    env_file.write_text("# written by dgx_spark.vllm\nNCCL_IB_DISABLE=1\n\nNCCL_SOCKET_IFNAME=lo\n")
    container = recorded_container(client)
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, env={}, env_file=str(env_file)))
    assert not failed, res
    assert res["config_hash"] == container.labels[_container.HASH_LABEL] and res["actions"] == []
    # The module's own entries win over the file's; a changed file recreates.
    failed, res = run_module(
        monkeypatch, ray_node, dict(RECORDED_ARGS, env={"NCCL_SOCKET_IFNAME": "eth9"}, env_file=str(env_file))
    )
    assert not failed and res["actions"] == ["recreated"]
    environment = client.containers.created[0]["environment"]
    assert environment["NCCL_IB_DISABLE"] == "1" and environment["NCCL_SOCKET_IFNAME"] == "eth9"


def test_a_missing_or_malformed_env_file_is_named(monkeypatch, client, tmp_path):
    missing = str(tmp_path / "nccl.env")
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, env_file=missing))
    assert failed and res["msg"].startswith("env_file: %s is not on this node; the fabric stage writes it" % missing)
    assert client.containers.created == []
    warnings = []
    monkeypatch.setattr(ray_node.AnsibleModule, "warn", lambda self, msg: warnings.append(msg))
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, env_file=missing, _ansible_check_mode=True))
    assert not failed and any("is not on this node" in w for w in warnings)
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_IB_DISABLE=1\nexport NCCL_DEBUG\n")
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, env_file=str(bad)))
    assert failed and "line 2 is not KEY=VALUE" in res["msg"] and client.containers.created == []


def test_stopped_container_is_started_not_recreated(monkeypatch, client):
    container = recorded_container(client)
    container.attrs["State"]["Status"] = "exited"
    failed, res = run_module(monkeypatch, ray_node, RECORDED_ARGS)
    assert not failed, res
    assert res["actions"] == ["started"]
    assert "start" in container.calls and client.containers.created == []
    # Read again after the start: the start time returned is the new one.
    assert container.calls.index("reload") > container.calls.index("start")


def test_force_restart_recreates_unchanged(monkeypatch, client):
    recorded_container(client)
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, force_restart=True))
    assert not failed and res["actions"] == ["recreated"]


def test_check_mode_changes_nothing(monkeypatch, client):
    container = recorded_container(client)
    args = dict(RECORDED_ARGS, env={}, _ansible_check_mode=True)
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed and res["changed"]
    assert client.containers.created == [] and not any(
        c[0] == "remove" for c in container.calls if isinstance(c, tuple)
    )


def test_gpus_and_rdma(monkeypatch, client):
    args = dict(RECORDED_ARGS, gpus=1, declared_gpus=None, rdma_devices=["/dev/infiniband"])
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed, res
    kwargs = client.containers.created[0]
    assert kwargs["device_requests"][0]["Count"] == -1
    assert kwargs["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert kwargs["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert kwargs["cap_add"] == ["IPC_LOCK"]
    assert kwargs["ulimits"][0]["Soft"] == -1
    assert "--num-gpus=1" in kwargs["command"]
    assert kwargs["privileged"] is False


def test_worker_command(monkeypatch, client):
    args = dict(
        RECORDED_ARGS, name="ray-worker", role="worker", head_address="198.18.100.11", ray_port=6380, image="plain:1"
    )
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed, res
    assert res["command"][:3] == ["ray", "start", "--address=198.18.100.11:6380"]
    assert "--head" not in res["command"] and "--include-dashboard=false" not in res["command"]
    assert res["entrypoint"] == "image has no ENTRYPOINT; set ['ray']"


def test_dashboard_when_asked(monkeypatch, client):
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, include_dashboard=True, dashboard_port=8300))
    assert not failed
    assert "--include-dashboard=true" in res["command"] and "--dashboard-port=8300" in res["command"]


def test_fixed_metrics_port_is_a_new_container_unset_is_not(monkeypatch, client):
    # Unset (the ray_cluster default) keeps the recorded hash: test_hash_matches_the_label_the_real_engine_holds.
    recorded_container(client)
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, metrics_export_port=8080))
    assert not failed, res
    assert "--metrics-export-port=8080" in res["command"] and res["actions"] == ["recreated"]


def test_pinned_agent_ports_are_the_ray_start_flags_of_their_names(monkeypatch, client):
    ports = dict(dashboard_agent_listen_port=52365, dashboard_agent_grpc_port=52366, runtime_env_agent_port=52367)
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, metrics_export_port=8080, **ports))
    assert not failed, res
    assert [a for a in res["command"] if "agent" in a] == [
        "--dashboard-agent-listen-port=52365",
        "--dashboard-agent-grpc-port=52366",
        "--runtime-env-agent-port=52367",
    ]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (dict(role="worker"), "head_address"),
        (dict(node_ip="spark-1"), "node_ip"),
        (dict(rdma_devices=["infiniband"]), "rdma_devices"),
        (dict(declared_gpus=-1), "declared_gpus"),
        (dict(metrics_export_port=0), "metrics_export_port"),
        (dict(dashboard_agent_grpc_port=70000), "dashboard_agent_grpc_port"),
        (dict(image="missing:1"), "runtime_image"),
    ],
)
def test_bad_input_fails_before_any_change(monkeypatch, client, args, named):
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, **args))
    assert failed and named in res["msg"]
    assert client.containers.created == []


def test_container_that_exits_fails_with_its_log(monkeypatch, client):
    client.containers.log_for_new = fixture_text("docker", "container_exited.log").encode()
    client.containers.status_after_start = "exited"
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, image="plain:1"))
    assert failed
    assert "container exited" in res["msg"]
    assert "exec ray failed" in res["msg"]


def test_absent_removes(monkeypatch, client):
    container = recorded_container(client)
    failed, res = run_module(monkeypatch, ray_node, dict(name="bringup-test-ray-head", state="absent"))
    assert not failed and res["actions"] == ["removed"]
    assert ("remove", True) in container.calls
    failed, res = run_module(monkeypatch, ray_node, dict(name="bringup-test-ray-head", state="absent"))
    assert not failed and not res["changed"]


def test_worker_waiting_for_its_head_says_so(monkeypatch, client):
    # Recorded from Ray 2.60: a worker whose head's GCS does not answer keeps retrying (no exit).
    client.containers.log_for_new = fixture_text("docker", "container_worker_no_gcs.log").encode()
    args = dict(RECORDED_ARGS, role="worker", head_address="198.18.140.11:6390", image="plain:1", start_timeout=0)
    failed, res = run_module(monkeypatch, ray_node, args)
    assert failed
    assert "no 'Ray runtime started' within 0s" in res["msg"]
    assert "the head's GCS at 198.18.140.11:6390 never answered" in res["msg"]
    # A head does not wait for a GCS: no such hint for it.
    failed, res = run_module(
        monkeypatch, ray_node, dict(RECORDED_ARGS, name="other-head", image="plain:1", start_timeout=0)
    )
    assert failed and "never answered" not in res["msg"]


def test_without_wait_ready_returns_once_the_container_runs(monkeypatch, client):
    # The recorded log of a worker still retrying its GCS: with the wait it would fail at once (timeout 0).
    client.containers.log_for_new = fixture_text("docker", "container_worker_no_gcs.log").encode()
    args = dict(RECORDED_ARGS, image="plain:1", start_timeout=0, wait_ready=False)
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed, res
    assert res["actions"] == ["created"] and "ready_seconds" not in res
    failed, res = run_module(monkeypatch, ray_node, dict(args, name="waited", wait_ready=True))
    assert failed and "no 'Ray runtime started' within 0s" in res["msg"]


def test_a_writable_mount_source_is_made_a_read_only_one_is_not(monkeypatch, client, tmp_path):
    cache, model = tmp_path / "cache" / "engine", tmp_path / "model"
    mounts = [
        {"source": str(model), "target": "/models", "read_only": True},
        {"source": str(cache), "target": str(cache), "read_only": False},
    ]
    # Check mode makes nothing.
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, mounts=mounts, _ansible_check_mode=True))
    assert not failed and res["changed"] and not cache.exists()
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, mounts=mounts))
    assert not failed, res
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o755 and not model.exists()
    # The same again: nothing to do.
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, mounts=mounts))
    assert not failed and not res["changed"], res
    # The cache removed under the running container: it is made again and the container recreated (the old one
    # writes where nothing reads it again).
    cache.rmdir()
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, mounts=mounts))
    assert not failed and res["actions"] == ["recreated"] and cache.is_dir(), res
    # A source that cannot be made fails naming it, and the running container is left as it was.
    cache.rmdir()
    cache.write_text("a file")
    created = len(client.containers.created)
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, mounts=mounts))
    assert failed and res["msg"].startswith("mounts: cannot make %s on this node" % cache), res
    assert len(client.containers.created) == created
    assert not any(
        c[0] == "remove" for c in client.containers.get("bringup-test-ray-head").calls if isinstance(c, tuple)
    )
    # Another node's engine (not a unix socket): its paths are not made here.
    other = tmp_path / "other"
    args = dict(
        RECORDED_ARGS, name="b", mounts=[{"source": str(other), "target": "/c"}], docker_host="tcp://10.0.0.2:2375"
    )
    failed, res = run_module(monkeypatch, ray_node, args)
    assert not failed, res
    assert not other.exists()


def test_a_started_worker_records_the_stage_group_it_ends_and_check_mode_does_not(monkeypatch, client, tmp_path):
    path = tmp_path / "record" / "stages.json"
    stage = dict(name="ray_cluster", inputs="r1", facts=dict(ray_cluster_engine_url="ssh://root@198.18.100.12"))
    record = dict(
        path=str(path),
        stages=[dict(stage, checks=dict(directories=[str(tmp_path)])), dict(name="vllm_server", inputs="v1")],
    )
    worker = dict(RECORDED_ARGS, role="worker", head_address="127.0.0.2", wait_ready=False, record=record)
    failed, res = run_module(monkeypatch, ray_node, dict(worker, _ansible_check_mode=True))
    assert not failed and res["changed"] and "record" not in res and not path.exists()
    failed, res = run_module(monkeypatch, ray_node, worker)
    assert not failed, res
    assert res["record"] == dict(recorded=["ray_cluster", "vllm_server"], reasons={}, changed=True)
    saved = json.loads(path.read_text())
    assert saved["stages"]["ray_cluster"]["facts"] == stage["facts"]
    assert saved["stages"]["ray_cluster"]["fingerprint"] == {}  # a directory check passes or fails; nothing to hold
    # A stage whose live check fails now is not recorded (the next run does it again); the module still succeeds.
    record["stages"][0]["checks"] = dict(directories=[str(tmp_path / "gone")])
    failed, res = run_module(monkeypatch, ray_node, worker)
    assert not failed and res["record"]["recorded"] == ["vllm_server"]
    assert res["record"]["reasons"]["ray_cluster"] and "ray_cluster" not in json.loads(path.read_text())["stages"]


def test_a_record_naming_an_unknown_check_fails_before_any_change(monkeypatch, client, tmp_path):
    record = dict(path=str(tmp_path / "stages.json"), stages=[dict(name="ray_cluster", inputs="r1", checks={"gpu": 1})])
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, record=record))
    assert failed and res["msg"].startswith("record.stages: ray_cluster has unknown checks ['gpu']; use ")
    assert client.containers.created == [] and not (tmp_path / "stages.json").exists()


def test_the_heads_start_drops_the_records_of_the_group_a_later_stage_records(monkeypatch, client, tmp_path):
    path = tmp_path / "stages.json"
    before = dict(name="preflight", inputs="p1", facts={}, fact_names=[], checks=dict(directories=[str(tmp_path)]))
    group = [dict(before, name=name, inputs=name) for name in ("ray_cluster", "vllm_server")]
    everything = dict(path=str(path), stages=[before, *group], plan=dict(key="k1", stages=[before, *group]))
    failed, _result = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, name="other", record=everything))
    assert not failed and sorted(json.loads(path.read_text())["stages"]) == ["preflight", "ray_cluster", "vllm_server"]
    forget = dict(path=str(path), stages=[], forget=["ray_cluster", "vllm_server"])
    # Dropped before the start: one that fails (here the image is not on the node) leaves them dropped too.
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, image="missing:1", record=forget))
    assert failed and "missing:1 is not on this node" in res["msg"]
    saved = json.loads(path.read_text())
    # Until the serve records them again, the next run finds the group unrecorded here: it runs on every node.
    assert sorted(saved["stages"]) == ["preflight"] and saved["plan"]["key"] == "k1"
    # Check mode drops nothing.
    run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, name="other", record=everything))
    failed, res = run_module(monkeypatch, ray_node, dict(RECORDED_ARGS, record=forget, _ansible_check_mode=True))
    assert not failed and sorted(json.loads(path.read_text())["stages"]) == ["preflight", "ray_cluster", "vllm_server"]
