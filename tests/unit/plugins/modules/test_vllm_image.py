"""vllm_image against a fake engine: argument validation, verification gate, promotion, copies, idempotence."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _image
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
