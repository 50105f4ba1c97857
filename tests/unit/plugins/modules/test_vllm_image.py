"""vllm_image against a fake engine: argument validation, verification gate, promotion, copies (star and chain),
idempotence."""

from __future__ import annotations

import pytest
from ansible.module_utils import basic
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _chain_copy, _image
from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_image
from module_runner import fixture_text, run_module

ARCH = "Qwen3_5MoeForConditionalGeneration"
IN_SERVICE = "dgx-spark/vllm-runtime:in-service"


class FakeImage:
    def __init__(self, engine, image_id, labels=None, entrypoint=None):
        self.engine = engine
        self.id = image_id
        self.labels = labels or {}
        self.attrs = {"Config": {"Entrypoint": entrypoint, "Cmd": ["--help"], "Labels": self.labels}}

    def reload(self):
        pass

    def tag(self, repo, tag):
        self.engine.tags["%s:%s" % (repo, tag)] = self
        self.engine.actions.append(("tag", "%s:%s" % (repo, tag), self.id))
        return True


class FakeImages:
    def __init__(self, engine):
        self.engine = engine

    def get(self, ref):
        if ref in self.engine.tags:
            return self.engine.tags[ref]
        for image in self.engine.tags.values():
            if image.id == ref:
                return image
        raise _image.ImageNotFound("No such image: %s" % ref)

    def pull(self, ref):
        self.engine.actions.append(("pull", ref))
        return self.engine.add(ref, "sha256:pulled")


class FakeEngine:
    def __init__(self, name="build"):
        self.name = name
        self.tags = {}
        self.actions = []
        self.images = FakeImages(self)

    def add(self, ref, image_id, **kwargs):
        self.tags[ref] = FakeImage(self, image_id, **kwargs)
        return self.tags[ref]


@pytest.fixture
def engine(monkeypatch):
    """The build node's engine and two peers; verification answers with a recorded real output."""
    eng = FakeEngine()
    eng.peers = {"ssh://root@spark-2": FakeEngine("spark-2"), "ssh://root@spark-3": FakeEngine("spark-3")}
    eng.verify_output = fixture_text("vllm_image", "verify-runtime-donor.txt")
    eng.missing = []

    def build(client, tag, labels, buildargs=None, timeout=None, **source):
        eng.actions.append(("build", tag, sorted(source)))
        return eng.add(tag, "sha256:built-" + labels[_image.INPUTS_LABEL][:8], labels=labels)

    def stream(source, target, ref):
        target.add(ref, source.tags[ref].id)
        eng.actions.append(("stream", target.name))
        return 1234

    monkeypatch.setattr(vllm_image, "docker_client", lambda module: eng)
    monkeypatch.setattr(vllm_image, "build_image", build)
    monkeypatch.setattr(vllm_image, "run_verification", lambda *a: eng.verify_output)
    monkeypatch.setattr(
        vllm_image, "missing_donor_paths", lambda c, donor, paths: [p for p in paths if p in eng.missing]
    )
    eng.connected = []

    def connect(host, timeout):
        eng.connected.append((host, timeout))
        return eng if host == "unix:///var/run/docker.sock" else eng.peers[host]

    monkeypatch.setattr(vllm_image, "connect", connect)
    monkeypatch.setattr(vllm_image, "stream_image", stream)
    return eng


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(fixture_text("vllm_image", "config.json"))
    return str(tmp_path)


PEERS = [
    {"name": "spark-2", "docker_host": "ssh://root@spark-2"},
    {"name": "spark-3", "docker_host": "ssh://root@spark-3"},
]


def graft_args(model_dir, **extra):
    args = {
        "name": "dgx-spark/vllm-runtime:graft",
        "graft": {
            "base": "lab/old:1",
            "donor": "lab/donor:1",
            "files": ["/m.py"],
            "pip_requirements": ["transformers>=5"],
        },
        "model_dir": model_dir,
    }
    args.update(extra)
    return args


# Bad input: each names the parameter; nothing built or tagged.
def test_no_source(monkeypatch, engine):
    failed, result = run_module(monkeypatch, vllm_image, {"architecture": ARCH})
    assert failed
    assert "one of the following is required: pull, build, graft" in result["msg"]
    assert engine.actions == []


def test_two_sources(monkeypatch, engine, tmp_path):
    args = {"pull": "a:1", "build": {"context": str(tmp_path)}}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert failed
    assert "mutually exclusive: pull|build|graft" in result["msg"]
    assert engine.actions == []


def test_build_context_without_dockerfile(monkeypatch, engine, tmp_path):
    failed, result = run_module(monkeypatch, vllm_image, {"build": {"context": str(tmp_path)}, "architecture": ARCH})
    assert failed
    assert result["msg"].startswith("build.dockerfile: %s has no Dockerfile" % tmp_path)
    assert engine.actions == []


def test_model_dir_without_config(monkeypatch, engine, tmp_path):
    engine.add("a:1", "sha256:a")
    failed, result = run_module(monkeypatch, vllm_image, {"pull": "a:1", "model_dir": str(tmp_path)})
    assert failed
    assert result["msg"].startswith("model_dir: ")
    assert "config.json" in result["msg"]
    assert engine.actions == []


@pytest.mark.parametrize("missing", ["base", "donor"])
def test_graft_image_missing(monkeypatch, engine, model_dir, missing):
    present = {"base": "lab/old:1", "donor": "lab/donor:1"}
    present.pop(missing)
    for ref in present.values():
        engine.add(ref, "sha256:" + ref)
    failed, result = run_module(monkeypatch, vllm_image, graft_args(model_dir))
    assert failed
    assert result["msg"].startswith("graft.%s: image lab/" % missing)
    assert engine.actions == []


def test_graft_donor_file_missing(monkeypatch, engine, model_dir):
    engine.add("lab/old:1", "sha256:old")
    engine.add("lab/donor:1", "sha256:donor")
    engine.missing = ["/m.py"]
    failed, result = run_module(monkeypatch, vllm_image, graft_args(model_dir))
    assert failed
    assert result["msg"] == "graft.files: not in donor image lab/donor:1: /m.py"
    assert engine.actions == []


# The verification gate.
def test_failed_graft_keeps_previous_image_in_service(monkeypatch, engine, model_dir):
    engine.add("lab/old:1", "sha256:old")
    engine.add("lab/donor:1", "sha256:donor")
    engine.add(IN_SERVICE, "sha256:good")
    engine.verify_output = fixture_text("vllm_image", "verify-graft-old-donor.txt")
    failed, result = run_module(monkeypatch, vllm_image, graft_args(model_dir))
    assert failed
    assert "vllm 0.11.0+lab.replay has requirement transformers<5,>=4.56.0" in result["msg"]
    assert "closest registered: Qwen3VLMoeForConditionalGeneration" in result["msg"]
    assert "stays in service (sha256:good)" in result["msg"]
    assert engine.tags[IN_SERVICE].id == "sha256:good"
    assert [a[0] for a in engine.actions] == ["build"]
    assert "FROM lab/donor:1 AS donor" in result["dockerfile"]


def test_pull_verify_promote_copy_then_nothing(monkeypatch, engine, model_dir):
    engine.add("lab/donor:1", "sha256:donor", entrypoint=["/usr/local/bin/spark-vllm-entrypoint.sh"])
    engine.peers["ssh://root@spark-3"].add(IN_SERVICE, "sha256:donor")
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": PEERS, "_ansible_diff": True}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert not failed, result["msg"]
    assert result["changed"] and result["promoted"]
    assert not result["built"]
    assert result["verification"]["entrypoint"] == ["/usr/local/bin/spark-vllm-entrypoint.sh"]
    assert engine.actions == [("tag", IN_SERVICE, "sha256:donor"), ("stream", "spark-2")]
    assert [(p["name"], p["bytes_moved"], p["image_id"]) for p in result["peers"]] == [
        ("spark-2", 1234, "sha256:donor"),
        ("spark-3", 0, "sha256:donor"),
    ]
    assert result["diff"]["before"]["in_service_id"] is None
    engine.actions.clear()
    failed, again = run_module(monkeypatch, vllm_image, args)
    assert not failed
    assert not again["changed"]
    assert again["bytes_moved"] == 0
    assert engine.actions == []


def test_build_twice_builds_once(monkeypatch, engine, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    args = {"build": {"context": str(tmp_path)}, "architecture": ARCH}
    assert run_module(monkeypatch, vllm_image, args)[1]["built"]
    failed, again = run_module(monkeypatch, vllm_image, args)
    assert not failed
    assert not again["changed"]
    assert [a[0] for a in engine.actions] == ["build", "tag"]
    (tmp_path / "Dockerfile").write_text("FROM y\n")
    assert run_module(monkeypatch, vllm_image, args)[1]["built"]


def test_check_mode_builds_and_copies_nothing(monkeypatch, engine, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    args = {"build": {"context": str(tmp_path)}, "architecture": ARCH, "peers": PEERS, "_ansible_check_mode": True}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert not failed
    assert result["changed"] and result["built"]
    assert result["image_id"] is None
    assert engine.actions == []
    assert all(p["bytes_moved"] == 0 for p in result["peers"])


def test_verified_record_skips_a_passed_verification_of_the_same_image(monkeypatch, engine, model_dir, tmp_path):
    engine.add("lab/donor:1", "sha256:donor", entrypoint=["/usr/local/bin/spark-vllm-entrypoint.sh"])
    record = str(tmp_path / "verified.json")
    runs = []
    monkeypatch.setattr(vllm_image, "run_verification", lambda *a: runs.append(a) or engine.verify_output)
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": [], "verified_record": record}
    failed, first = run_module(monkeypatch, vllm_image, args)
    assert not failed, first["msg"]
    assert first["verification"]["passed"] and not first["verification"]["recorded"]
    failed, again = run_module(monkeypatch, vllm_image, args)
    assert not failed and not again["changed"]
    assert again["verification"]["recorded"] and again["verification"]["passed"]
    assert len(runs) == 1
    # Another image under the same name is verified again.
    engine.add("lab/donor:1", "sha256:other", entrypoint=["/usr/local/bin/spark-vllm-entrypoint.sh"])
    failed, other = run_module(monkeypatch, vllm_image, args)
    assert not failed and not other["verification"]["recorded"]
    assert len(runs) == 2


def test_a_verification_recorded_without_the_ray_agent_check_is_made_again_with_it(
    monkeypatch, engine, model_dir, tmp_path
):
    engine.add("lab/donor:1", "sha256:donor", entrypoint=["/usr/local/bin/spark-vllm-entrypoint.sh"])
    runs = []
    monkeypatch.setattr(vllm_image, "run_verification", lambda *a: runs.append(a) or engine.verify_output)
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": [], "verified_record": str(tmp_path / "v.json")}
    failed, first = run_module(monkeypatch, vllm_image, args)
    assert not failed and first["verification"]["passed"] and len(runs) == 1
    failed, again = run_module(monkeypatch, vllm_image, dict(args, require_ray_agent=True))
    assert not failed, again["msg"]
    assert not again["verification"]["recorded"] and again["verification"]["ray_agent"] is True
    assert len(runs) == 2


def test_peer_engine_dies_mid_copy_names_the_peer(monkeypatch, engine, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    engine.ping = lambda: True
    calls = []

    def stream(source, target, ref):
        calls.append("copy")
        raise _image.CopyBroken("BrokenPipeError: [Errno 32] Broken pipe", 5 * 1048576)

    def connect(host, timeout):
        if "copy" in calls:  # the engine answered before the copy, not after
            raise _image.DockerException("Error while fetching server API version: Connection refused")
        return engine if host.startswith("unix://") else engine.peers[host]

    monkeypatch.setattr(vllm_image, "stream_image", stream)
    monkeypatch.setattr(vllm_image, "connect", connect)
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": PEERS[:1]}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert failed
    assert result["failed_peer"] == "spark-2"
    msg = result["msg"]
    assert "to spark-2 (ssh://root@spark-2) failed after 5242880 bytes (5.0 MiB)" in msg
    assert "the Docker engine on spark-2 stopped answering" in msg
    assert "run the deploy again" in msg
    assert engine.peers["ssh://root@spark-2"].tags == {}


def test_peer_whose_engine_cannot_read_its_image_is_named_before_any_copy(monkeypatch, engine, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    broken = engine.peers["ssh://root@spark-3"]
    error = "500 Server Error: stat /var/lib/docker/overlay2/157e6841: no such file or directory"

    def get(ref):
        raise _image.DockerException(error)

    monkeypatch.setattr(broken.images, "get", get)
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": PEERS}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert failed
    msg = result["msg"]
    assert msg.startswith("peers: the Docker engine on spark-3 (ssh://root@spark-3) could not read %s: " % IN_SERVICE)
    assert error in msg
    fix = "docker rm -f $(docker ps -aq --filter ancestor=%s); docker image rm -f %s" % (IN_SERVICE, IN_SERVICE)
    assert "on spark-3 remove the containers made from it, then the image (%s)" % fix in msg
    assert ("stream", "spark-2") not in engine.actions


def test_copy_silent_for_copy_timeout_names_the_setting(monkeypatch, engine, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    engine.ping = lambda: True

    def stream(source, target, ref):
        # Both engines answer; this node's docker save had not sent its first byte within the timeout.
        raise _image.CopyBroken("ConnectionError: Read timed out. (read timeout=900)", 0, timed_out=True)

    monkeypatch.setattr(vllm_image, "stream_image", stream)
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": PEERS[:1], "copy_timeout": 900}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert failed and result["failed_peer"] == "spark-2"
    msg = result["msg"]
    assert "this node's docker save sent nothing for copy_timeout (900 s" in msg
    assert "runtime_image_copy_timeout" in msg and "stopped answering" not in msg
    # The copy's own clients wait copy_timeout; the others keep docker_timeout.
    assert ("unix:///var/run/docker.sock", 900) in engine.connected
    assert ("ssh://root@spark-2", 900) in engine.connected


# copy_topology=chain: one docker save down the stale peers, each loading it (_chain_copy.send is faked).
CHAIN_PEERS = [
    {"name": "spark-2", "docker_host": "ssh://admin@10.0.0.2"},
    {"name": "spark-3", "docker_host": "ssh://admin@10.0.0.3"},
    {"name": "spark-4", "docker_host": "ssh://admin@[fd00::4]"},
]


@pytest.fixture
def chain(monkeypatch, engine, tmp_path):
    """The fake chain: records each send; every hop loads the head's in-service image unless `fail` names it."""
    engine.peers.update({p["docker_host"]: FakeEngine(p["name"]) for p in CHAIN_PEERS})
    by_name = {p["name"]: engine.peers[p["docker_host"]] for p in CHAIN_PEERS}
    fake = type("Chain", (), {})()
    fake.calls, fake.fail, fake.skip_load = [], {}, set()
    fake.source_error, fake.stalled = "", ""
    fake.args = {"ssh_key": str(tmp_path / "id_peer"), "ssh_known_hosts": str(tmp_path / "known_hosts")}

    def send(source, hops, **kwargs):
        fake.calls.append(dict(kwargs, source=source, hops=[dict(h) for h in hops]))
        reports = []
        for hop in hops:
            error = fake.fail.get(hop["host"], "")
            if not error and hop["host"] not in fake.skip_load:
                by_name[hop["host"]].add(IN_SERVICE, engine.tags[IN_SERVICE].id)
            reports.append(dict(host=hop["host"], ok=not error, bytes=7000, files=0, seconds=1.5, error=error))
        return dict(reports=reports, source_error=fake.source_error, stalled=fake.stalled)

    monkeypatch.setattr(_chain_copy, "send", send)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    return fake


def chain_args(model_dir, chain, peers=None, **extra):
    peers = CHAIN_PEERS if peers is None else peers
    args = {"pull": "lab/donor:1", "model_dir": model_dir, "peers": peers, "copy_topology": "chain"}
    return dict(args, **chain.args, **extra)


def test_chain_without_ssh_key_fails_before_anything_is_built(monkeypatch, engine, chain, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    args = {"build": {"context": str(tmp_path)}, "architecture": ARCH, "peers": CHAIN_PEERS, "copy_topology": "chain"}
    failed, result = run_module(monkeypatch, vllm_image, args)
    assert failed
    assert result["msg"].startswith("ssh_key: ") and "copy_topology=star" in result["msg"]
    assert engine.actions == [] and chain.calls == []


@pytest.mark.parametrize(
    "bad",
    [
        (0, "tcp://10.0.0.2:2375"),
        (0, "unix:///var/run/docker.sock"),
        (1, "ssh://spark-3"),
        (1, "ssh://admin@spark-3:2222"),
    ],
)
def test_chain_peer_not_reached_over_ssh_user_at_address_is_named(monkeypatch, engine, chain, model_dir, bad):
    index, docker_host = bad
    engine.add("lab/donor:1", "sha256:donor")
    peers = [dict(p) for p in CHAIN_PEERS[:2]]
    peers[index]["docker_host"] = docker_host
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, peers))
    assert failed
    assert result["msg"].startswith("peers[%d].docker_host: %r is not ssh://USER@ADDRESS" % (index, docker_host))
    assert "copy_topology=star" in result["msg"]
    assert engine.actions == [] and chain.calls == []


def test_chain_peers_reached_as_different_users_are_refused(monkeypatch, engine, chain, model_dir):
    # The relays pass the stream on as one user: a second user would silently be reached as the first.
    engine.add("lab/donor:1", "sha256:donor")
    peers = [dict(p) for p in CHAIN_PEERS[:2]]
    peers[1]["docker_host"] = peers[1]["docker_host"].replace("admin@", "root@")
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, peers))
    assert failed
    assert result["msg"].startswith("peers[1].docker_host: %r is not the user" % peers[1]["docker_host"])
    assert "(admin)" in result["msg"] and engine.actions == [] and chain.calls == []


def test_chain_sends_once_down_the_stale_peers_in_order(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor", entrypoint=["/usr/local/bin/spark-vllm-entrypoint.sh"])
    engine.peers["ssh://admin@10.0.0.3"].add(IN_SERVICE, "sha256:donor")
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain))
    assert not failed, result["msg"]
    (call,) = chain.calls
    assert call["hops"] == [
        dict(host="spark-2", address="10.0.0.2", user="admin", load=True),
        dict(host="spark-4", address="fd00::4", user="admin", load=True),
    ]
    assert call["user"] == "admin"
    assert call["key"] == chain.args["ssh_key"] and call["known_hosts"] == chain.args["ssh_known_hosts"]
    assert call["ssh_argv"][:3] == ["/usr/bin/ssh", "-i", chain.args["ssh_key"]]
    assert "UserKnownHostsFile=%s" % chain.args["ssh_known_hosts"] in call["ssh_argv"]
    assert "runtime_image_copy_topology" in call["fallback"]
    # One docker save, of the in-service tag, from this node's engine.
    argv, what = call["source"]("/unused")
    assert argv == ["/usr/bin/docker", "-H", "unix:///var/run/docker.sock", "save", IN_SERVICE]
    assert what == "docker save of " + IN_SERVICE
    assert result["changed"] and result["promoted"]
    assert [
        (p["name"], p["source"], p["image_id_before"], p["image_id"], p["bytes_moved"]) for p in result["peers"]
    ] == [
        ("spark-2", "this node", None, "sha256:donor", 7000),
        ("spark-3", "", "sha256:donor", "sha256:donor", 0),
        ("spark-4", "spark-2", None, "sha256:donor", 7000),
    ]
    assert result["sent_bytes"] == 7000
    # Nothing streamed engine to engine (star), and the image ID read back from each peer's engine.
    assert engine.actions == [("tag", IN_SERVICE, "sha256:donor")]
    chain.calls.clear()
    failed, again = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain))
    assert not failed and not again["changed"] and chain.calls == []


def test_chain_failed_hop_names_the_chain_the_host_and_the_fallback(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    chain.fail["spark-4"] = "docker load failed (rc 1): no space left on device"
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, CHAIN_PEERS[::2]))
    assert failed
    assert result["failed_peer"] == "spark-4"
    msg = result["msg"]
    assert "the chain copy of %s (this node -> spark-2 -> spark-4) did not complete" % IN_SERVICE in msg
    # The engine still answers: the load's own error, with the bytes that reached the hop.
    assert "to spark-4 after 7000 bytes (0.0 MiB): docker load failed (rc 1): no space left on device" in msg
    assert "to spark-2" not in msg and "stopped answering" not in msg
    assert "copy_topology=star (runtime_image_copy_topology)" in msg


def test_chain_hop_whose_engine_stopped_is_named_so(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    chain.fail["spark-2"] = "docker load failed (rc 1): error during connect: EOF"
    answering = vllm_image.connect

    def connect(host, timeout):
        if chain.calls and host == "ssh://admin@10.0.0.2":
            raise _image.DockerException("Error while fetching server API version: Connection refused")
        return answering(host, timeout)

    monkeypatch.setattr(vllm_image, "connect", connect)
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, CHAIN_PEERS[:1]))
    assert failed and result["failed_peer"] == "spark-2"
    assert (
        "to spark-2 after 7000 bytes (0.0 MiB): the Docker engine on spark-2 stopped answering (docker load failed"
        in result["msg"]
    )
    assert "run the deploy again" in result["msg"]


def test_chain_peer_reporting_ok_but_holding_another_image_fails_the_read_back(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    engine.peers["ssh://admin@[fd00::4]"].add(IN_SERVICE, "sha256:older")
    chain.skip_load.add("spark-4")
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, CHAIN_PEERS[::2]))
    assert failed
    assert result["msg"] == "peers: spark-4 has sha256:older as %s after the copy, not sha256:donor" % IN_SERVICE


def test_chain_check_mode_sends_nothing(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    engine.add(IN_SERVICE, "sha256:donor")
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, _ansible_check_mode=True))
    assert not failed, result["msg"]
    assert result["changed"] and chain.calls == [] and engine.actions == []
    assert [(p["image_id_before"], p["image_id"], p["bytes_moved"]) for p in result["peers"]] == [
        (None, "sha256:donor", 0)
    ] * 3
    assert all(IN_SERVICE not in peer.tags for peer in engine.peers.values())


def test_chain_stalled_or_failed_save_is_this_node_s_not_a_peer_s(monkeypatch, engine, chain, model_dir):
    engine.add("lab/donor:1", "sha256:donor")
    chain.stalled = "no byte moved for 1800 s: the stream was stopped"
    chain.fail["spark-2"] = "the stream to spark-2 ended (ssh rc -9): no answer"
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, CHAIN_PEERS[:1]))
    assert failed and "no byte moved for 1800 s" in result["msg"] and result["failed_peer"] == "spark-2"
    assert chain.calls[0]["idle_timeout"] == 1800
    chain.stalled, chain.source_error = "", "docker save of %s failed (rc 1): no such image" % IN_SERVICE
    failed, result = run_module(monkeypatch, vllm_image, chain_args(model_dir, chain, CHAIN_PEERS[:1]))
    assert failed and "docker save of" in result["msg"] and "failed_peer" not in result
