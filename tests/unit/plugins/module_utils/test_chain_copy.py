"""_chain_copy: the pipelined chain copy, run as real processes (tar, ssh-agent, ssh-add, python3 relays).

Only ssh (and docker, for an image) is a stand-in: `ssh` on PATH runs the remote command here, with the
hop's destination in FAKE_SSH_DEST, and logs its argv, so each hop's relay, tar and agent forwarding check
are the real ones. `docker` on PATH saves a deterministic pseudo-random stream and loads into a file per load.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _chain_copy, _model, _ssh

FAKE_SSH = r"""#!/usr/bin/env python3
import json, os, subprocess, sys
args = sys.argv[1:]
known = [a.split("=", 1)[1] for a in args if a.startswith("UserKnownHostsFile=")]
with open(known[-1]) as handle:
    known_text = handle.read()
with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(json.dumps(dict(argv=args, known=known_text)) + "\n")
dest = args[-2]
if dest in os.environ.get("FAKE_SSH_DOWN", "").split(","):
    sys.stderr.write("ssh: connect to host %s port 22: No route to host\n" % dest.split("@")[1])
    sys.exit(255)
if dest == os.environ.get("FAKE_SSH_CUT"):
    sys.stdin.buffer.read(2 << 20)  # the node dies mid-stream: its relay never reports
    sys.stderr.write("Connection to %s closed by remote host.\n" % dest.split("@")[1])
    sys.exit(255)
# A relay's ssh holds no key of its own: it logs in only through the agent forwarded to it.
if "-i" not in args and "SSH_AUTH_SOCK" not in os.environ:
    sys.stderr.write("%s: Permission denied (publickey).\n" % dest)
    sys.exit(255)
if "-A" in args and "SSH_AUTH_SOCK" not in os.environ:
    sys.stderr.write("no agent to forward\n")
    sys.exit(255)
# The remote side learns which hop it is (a fake docker keys on it; every hop runs on this one machine), and
# holds the agent only where -A forwarded it.
env = dict(os.environ, FAKE_SSH_DEST=dest)
if "-A" not in args:
    env.pop("SSH_AUTH_SOCK", None)
sys.exit(subprocess.call(["/bin/sh", "-c", args[-1]], env=env))
"""


@pytest.fixture
def lab(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(
        "10.0.0.3 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfNodeThree\n"
        "10.0.0.4 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfNodeFour\n"
    )
    source = tmp_path / "head"
    (source / "sub").mkdir(parents=True)
    for index in range(4):
        (source / ("model-%d.safetensors" % index)).write_bytes(os.urandom(300_000 + index))
    (source / "config.json").write_text('{"model_type": "lab"}')
    (source / "sub" / "tokenizer.json").write_text("{}")
    bins = {name: name for name in ("ssh", "ssh-agent", "ssh-add", "ssh-keygen", "tar")}
    return dict(tmp=tmp_path, key=str(key), known=str(known), source=str(source), bins=bins)


def entries(path):
    return _model.manifest(path, "sample")[0]


def targets(lab, names, manifests=None):
    manifests = manifests or {}
    out = []
    for index, name in enumerate(names):
        path = lab["tmp"] / name
        out.append(dict(host=name, address="10.0.0.%d" % (index + 2), path=str(path), manifest=manifests.get(name)))
    return out


def send(lab, hops, files):
    ssh_argv = _ssh.client_argv("ssh", lab["key"], lab["known"], accept_new=True)
    return _chain_copy.send(
        _chain_copy.tar_source("tar", lab["source"], files),
        hops,
        fallback="sync_topology=star",
        bins=lab["bins"],
        ssh_argv=ssh_argv,
        user="root",
        key=lab["key"],
        known_hosts=lab["known"],
    )


def ssh_log(lab):
    with open(lab["tmp"] / "ssh.log") as handle:
        return [json.loads(line) for line in handle]


def test_three_workers_get_the_head_files_and_each_is_sent_one_copy(lab):
    head = entries(lab["source"])
    hops, files = _chain_copy.plan(head, targets(lab, ["w1", "w2", "w3"]))
    result = send(lab, hops, files)
    assert result["source_error"] == "", result["reports"][0]["error"]
    reports = result["reports"]
    assert [r["host"] for r in reports] == ["w1", "w2", "w3"]
    assert all(r["ok"] for r in reports), [r["error"] for r in reports]
    assert len({r["bytes"] for r in reports}) == 1 and reports[0]["bytes"] > sum(e["size"] for e in head)
    for hop in hops:
        assert _model.manifest(hop["path"], "sample")[1] == _model.manifest(lab["source"], "sample")[1]
    calls = ssh_log(lab)
    argvs = [c["argv"] for c in calls]
    # The head connects to w1 with its key; each worker to the next through the forwarded agent only.
    assert [a[-2] for a in argvs] == ["root@10.0.0.2", "root@10.0.0.3", "root@10.0.0.4"]
    assert "-i" in argvs[0] and all("-i" not in a for a in argvs[1:])
    # The agent goes only to hops that connect on: not to the last.
    assert ["-A" in a for a in argvs] == [True, True, False]
    assert all("ControlPath=none" in a for a in argvs)
    # Each worker checks the next one's host key against the line the head knows for that address, only.
    assert all("StrictHostKeyChecking=yes" in a for a in argvs[1:])
    assert [c["known"].split()[0] for c in calls[1:]] == ["10.0.0.3", "10.0.0.4"]
    assert all(len(c["known"].splitlines()) == 1 for c in calls[1:])


def test_a_relayed_worker_whose_host_key_the_head_lacks_is_refused_before_anything_starts(lab):
    hops, files = _chain_copy.plan(entries(lab["source"]), targets(lab, ["w1", "w2", "w3", "w4"]))
    with pytest.raises(RuntimeError, match=r"no host key for w4 \(10\.0\.0\.5\) in .*known_hosts"):
        send(lab, hops, files)
    assert not (lab["tmp"] / "ssh.log").exists()
    assert not any((lab["tmp"] / name).exists() for name in ("w1", "w2", "w3", "w4"))


def test_a_spec_larger_than_a_command_line_and_odd_names_reach_every_hop(lab):
    # 1500 names of 100 bytes for 3 hops: the spec is about 480 KB, a command line argument at most 128 KiB.
    many = os.path.join(lab["source"], "many")
    os.mkdir(many)
    for index in range(1500):
        with open(os.path.join(many, "%s-%04d" % ("n" * 95, index)), "w") as handle:
            handle.write(str(index))
    # Names tar would read as an option or as two names from a newline-separated list.
    for odd in ("-v", "--remove-files", "two\nlines"):
        with open(os.path.join(lab["source"], odd), "w") as handle:
            handle.write(odd)
    hops, files = _chain_copy.plan(entries(lab["source"]), targets(lab, ["w1", "w2", "w3"]))
    assert len(json.dumps(_chain_copy.hop_spec(hops))) > 3 * 128 * 1024
    result = send(lab, hops, files)
    assert result["source_error"] == "" and all(r["ok"] for r in result["reports"]), result
    for hop in hops:
        assert _model.manifest(hop["path"], "sample")[1] == _model.manifest(lab["source"], "sample")[1]
    assert os.path.exists(os.path.join(lab["source"], "-v"))


def test_the_forwarded_key_leaves_the_agent_after_its_lifetime(lab):
    agent = _chain_copy.Agent("ssh-agent", "ssh-add", lab["key"], str(lab["tmp"]), 1)
    try:
        listed = subprocess.run(["ssh-add", "-l"], env=agent.env(), capture_output=True, text=True, check=False)
        assert listed.returncode == 0 and "ED25519" in listed.stdout
        time.sleep(2.5)
        listed = subprocess.run(["ssh-add", "-l"], env=agent.env(), capture_output=True, text=True, check=False)
        assert listed.returncode == 1 and "no identities" in listed.stdout
    finally:
        agent.stop()


def test_a_worker_that_lacks_one_file_writes_only_that_one(lab):
    head = entries(lab["source"])
    partial = lab["tmp"] / "w2"
    subprocess.run(["cp", "-a", lab["source"] + "/.", str(partial)], check=True)
    (partial / "model-2.safetensors").write_bytes(b"cut short")
    before = {e["path"]: e for e in entries(str(partial))}
    w2_manifest = entries(str(partial))
    hops, files = _chain_copy.plan(head, targets(lab, ["w1", "w2"], {"w2": w2_manifest}))
    assert [h["extract"] for h in hops] == [[e["path"] for e in head], ["model-2.safetensors"]]
    result = send(lab, hops, files)
    assert all(r["ok"] for r in result["reports"]), result
    after = {e["path"]: e for e in entries(str(partial))}
    assert after == {e["path"]: e for e in head}
    assert before["model-1.safetensors"] == after["model-1.safetensors"]


def test_an_older_revision_s_extra_shard_is_removed_and_nothing_else_written(lab):
    head = entries(lab["source"])
    older = lab["tmp"] / "w1"
    subprocess.run(["cp", "-a", lab["source"] + "/.", str(older)], check=True)
    (older / "model-9.safetensors").write_bytes(b"an older revision's shard")
    (older / ".cache").mkdir()
    (older / ".cache" / "hub-lock").write_text("")
    hops, files = _chain_copy.plan(head, targets(lab, ["w1"], {"w1": entries(str(older))}))
    assert hops[0]["extract"] == [] and hops[0]["remove"] == ["model-9.safetensors"] and files == []
    (report,) = send(lab, hops, files)["reports"]
    assert report["ok"], report
    assert _model.manifest(str(older), "sample")[1] == _model.manifest(lab["source"], "sample")[1]
    assert (older / ".cache" / "hub-lock").exists()


def test_a_converged_worker_is_left_out_of_the_chain(lab):
    head = entries(lab["source"])
    hops, files = _chain_copy.plan(head, [dict(host="w1", address="a", path="/x", manifest=head)])
    assert hops == [] and files == []


def test_an_unreachable_worker_is_named_and_the_ones_after_it_not_reached(lab, monkeypatch):
    monkeypatch.setenv("FAKE_SSH_DOWN", "root@10.0.0.3")
    hops, files = _chain_copy.plan(entries(lab["source"]), targets(lab, ["w1", "w2", "w3"]))
    reports = send(lab, hops, files)["reports"]
    assert reports[0]["ok"] and not reports[1]["ok"] and not reports[2]["ok"]
    assert "the stream to w2 ended (ssh rc 255)" in reports[1]["error"]
    assert "No route to host" in reports[1]["error"]
    assert reports[2]["error"] == "not reached: the stream to w2 ended"


def test_a_worker_that_cannot_write_fails_alone_and_passes_the_stream_on(lab):
    hops, files = _chain_copy.plan(entries(lab["source"]), targets(lab, ["w1", "w2"]))
    (lab["tmp"] / "w1").write_text("a file where the model directory should be")
    reports = send(lab, hops, files)["reports"]
    assert not reports[0]["ok"] and reports[0]["error"].startswith("cannot write %s/w1: " % lab["tmp"])
    assert reports[1]["ok"] and reports[1]["bytes"] == reports[0]["bytes"] > 0


def test_a_stream_cut_short_fails_the_hop_with_tar_saying_so(lab, tmp_path):
    archive = subprocess.run(["tar", "-c", "-f", "-", "-C", lab["source"], "."], capture_output=True, check=True)
    spec = dict(host="w1", address="", path=str(tmp_path / "cut"), extract=["./config.json"], remove=[], rest=[])

    class Cut:
        def __init__(self, data):
            self.data = data

        def read(self, size):
            chunk, self.data = self.data[:size], self.data[size:]
            return chunk

    (report,) = _chain_copy.relay(spec, Cut(archive.stdout[:700]), "")
    assert not report["ok"] and "tar -x into" in report["error"] and report["bytes"] == 700


# The image path: docker save on the head, docker load on each hop.

FAKE_DOCKER = r"""#!/usr/bin/env python3
import hashlib, json, os, shutil, signal, sys, tempfile
# As the real docker CLI (Go): a write to a pipe nobody reads kills it with SIGPIPE.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
args = sys.argv[1:]
dest = os.environ.get("FAKE_SSH_DEST", "head")
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(dict(argv=args, dest=dest)) + "\n")
if len(args) == 4 and args[0] == "-H" and args[2] == "save":
    if os.environ.get("FAKE_DOCKER_SAVE_FAIL"):
        sys.stderr.write(os.environ["FAKE_DOCKER_SAVE_FAIL"] + "\n")
        sys.exit(1)
    data = hashlib.shake_256(args[3].encode()).digest(int(os.environ["FAKE_DOCKER_SAVE_BYTES"]))
    if os.environ.get("FAKE_DOCKER_SAVE_HANG"):
        sys.stdout.buffer.write(data[: 1 << 20])
        sys.stdout.buffer.flush()
        import time
        time.sleep(60)
    for start in range(0, len(data), 65536):
        sys.stdout.buffer.write(data[start : start + 65536])
    sys.stdout.buffer.flush()
    sys.exit(0)
if args == ["load", "-q"]:
    if dest == os.environ.get("FAKE_DOCKER_LOAD_HANG"):
        sys.stdin.buffer.read(1 << 20)  # then a frozen engine: takes nothing more, says nothing
        import time
        time.sleep(60)
        sys.exit(0)
    if dest == os.environ.get("FAKE_DOCKER_LOAD_FAIL"):
        sys.stdin.buffer.read(1 << 20)  # then gives up: the relay's writes to it break
        sys.stderr.write("Error processing tar file(exit status 1): write /var/lib/docker: no space left on device\n")
        sys.exit(1)
    fd, path = tempfile.mkstemp(prefix=dest + "--", suffix=".tar", dir=os.environ["FAKE_DOCKER_LOADS"])
    with os.fdopen(fd, "wb") as handle:
        shutil.copyfileobj(sys.stdin.buffer, handle)
    if os.path.getsize(path) == 0:
        os.remove(path)
        sys.stderr.write("Error response from daemon: unexpected EOF\n")
        sys.exit(1)
    print("Loaded image: " + os.environ["FAKE_DOCKER_IMAGE"])
    sys.exit(0)
sys.stderr.write("fake docker: unexpected %r\n" % args)
sys.exit(2)
"""
IMAGE = "dgx-spark/vllm-runtime:in-service"
HEAD_ENGINE = "unix:///var/run/docker.sock"
# Several chunks, and not a whole number of them.
IMAGE_BYTES = 5 * _chain_copy.CHUNK + 12345


@pytest.fixture
def images(lab, monkeypatch):
    docker = lab["tmp"] / "bin" / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    loads = lab["tmp"] / "loads"
    loads.mkdir()
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(lab["tmp"] / "docker.log"))
    monkeypatch.setenv("FAKE_DOCKER_LOADS", str(loads))
    monkeypatch.setenv("FAKE_DOCKER_SAVE_BYTES", str(IMAGE_BYTES))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", IMAGE)
    monkeypatch.delenv("FAKE_DOCKER_SAVE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_DOCKER_LOAD_FAIL", raising=False)
    return dict(lab, loads=loads, saved=hashlib.shake_256(IMAGE.encode()).digest(IMAGE_BYTES))


def image_hops(names):
    return [dict(host=name, address="10.0.0.%d" % (i + 2), user="root", load=True) for i, name in enumerate(names)]


def send_image(lab, hops, idle_timeout=None):
    return _chain_copy.send(
        _chain_copy.image_source("docker", HEAD_ENGINE, IMAGE),
        hops,
        fallback="copy_topology=star",
        bins=lab["bins"],
        ssh_argv=_ssh.client_argv("ssh", lab["key"], lab["known"], accept_new=True),
        user="root",
        key=lab["key"],
        known_hosts=lab["known"],
        idle_timeout=idle_timeout,
    )


def loaded(lab):
    """{hop destination: [bytes of each docker load that finished there]}."""
    out = {}
    for name in sorted(os.listdir(lab["loads"])):
        out.setdefault(name.split("--")[0], []).append((lab["loads"] / name).read_bytes())
    return out


def docker_log(lab):
    with open(lab["tmp"] / "docker.log") as handle:
        return [json.loads(line) for line in handle]


def test_three_workers_load_the_head_image_and_the_head_saves_and_sends_one_copy(images):
    result = send_image(images, image_hops(["w1", "w2", "w3"]))
    assert result["source_error"] == "", result
    reports = result["reports"]
    assert [r["host"] for r in reports] == ["w1", "w2", "w3"]
    assert all(r["ok"] for r in reports), [r["error"] for r in reports]
    assert [r["bytes"] for r in reports] == [IMAGE_BYTES] * 3 and all(r["files"] == 0 for r in reports)
    # Each worker loaded the saved stream once, byte for byte.
    assert loaded(images) == {"root@10.0.0.%d" % n: [images["saved"]] for n in (2, 3, 4)}
    # One docker save, on the head, of the image from the head's engine; one docker load on each worker.
    calls = docker_log(images)
    assert [(c["dest"], c["argv"]) for c in calls if "save" in c["argv"]] == [
        ("head", ["-H", HEAD_ENGINE, "save", IMAGE])
    ]
    assert sorted(c["dest"] for c in calls if c["argv"] == ["load", "-q"]) == ["root@10.0.0.%d" % n for n in (2, 3, 4)]
    argvs = [c["argv"] for c in ssh_log(images)]
    assert [a[-2] for a in argvs] == ["root@10.0.0.2", "root@10.0.0.3", "root@10.0.0.4"]
    assert "-i" in argvs[0] and all("-i" not in a for a in argvs[1:])
    # The agent goes only to hops that connect on: not to the last.
    assert ["-A" in a for a in argvs] == [True, True, False]
    assert all("ControlPath=none" in a for a in argvs)
    assert all("StrictHostKeyChecking=yes" in a for a in argvs[1:])
    assert [c["known"].split()[0] for c in ssh_log(images)[1:]] == ["10.0.0.3", "10.0.0.4"]


def test_a_failed_docker_save_is_the_source_error_naming_the_image_and_docker_s_message(images, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_SAVE_FAIL", "Error response from daemon: reference does not exist")
    result = send_image(images, image_hops(["w1", "w2"]))
    assert result["source_error"] == (
        "docker save of %s failed (rc 1): Error response from daemon: reference does not exist" % IMAGE
    )
    assert [r["host"] for r in result["reports"]] == ["w1", "w2"]
    assert loaded(images) == {}


def test_a_worker_whose_docker_load_fails_fails_alone_and_the_next_still_gets_every_byte(images, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_LOAD_FAIL", "root@10.0.0.3")
    result = send_image(images, image_hops(["w1", "w2", "w3"]))
    assert result["source_error"] == ""
    w1, w2, w3 = result["reports"]
    assert w1["ok"] and w3["ok"], result
    assert not w2["ok"]
    assert w2["error"].startswith("docker load failed (rc 1): ") and "no space left on device" in w2["error"]
    assert w1["bytes"] == w2["bytes"] == w3["bytes"] == IMAGE_BYTES
    assert loaded(images) == {"root@10.0.0.2": [images["saved"]], "root@10.0.0.4": [images["saved"]]}


def test_the_last_worker_whose_docker_load_fails_stops_the_stream_at_once(images, monkeypatch):
    # Nobody after it takes the bytes: its relay stops reading; the head's save, cut off by SIGPIPE, is not
    # reported as a second failure. The worker before it still reads the whole stream for its own load.
    monkeypatch.setenv("FAKE_DOCKER_SAVE_BYTES", str(64 * _chain_copy.CHUNK))
    monkeypatch.setenv("FAKE_DOCKER_LOAD_FAIL", "root@10.0.0.2")
    alone = send_image(images, image_hops(["w1"]))
    assert alone["source_error"] == ""
    assert alone["reports"][0]["error"].startswith("docker load failed (rc 1): ")
    assert alone["reports"][0]["bytes"] < 8 * _chain_copy.CHUNK, alone
    monkeypatch.setenv("FAKE_DOCKER_LOAD_FAIL", "root@10.0.0.3")
    w1, w2 = send_image(images, image_hops(["w1", "w2"]))["reports"]
    assert w1["ok"] and w1["bytes"] == 64 * _chain_copy.CHUNK
    assert not w2["ok"] and w2["bytes"] < 8 * _chain_copy.CHUNK, w2


def test_a_first_worker_whose_node_dies_mid_stream_is_named_with_the_bytes_the_head_sent_it(images, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_SAVE_BYTES", str(16 * _chain_copy.CHUNK))
    monkeypatch.setenv("FAKE_SSH_CUT", "root@10.0.0.2")
    result = send_image(images, image_hops(["w1", "w2"]))
    assert result["source_error"] == ""
    w1, w2 = result["reports"]
    assert not w1["ok"] and w1["error"].startswith("the stream to w1 ended (ssh rc 255): Connection to 10.0.0.2")
    # What the head sent before the pipe broke: at least what the dead node read, never the whole stream.
    assert 2 << 20 <= w1["bytes"] < 16 * _chain_copy.CHUNK, w1
    assert not w2["ok"] and w2["error"] == "not reached: the stream to w1 ended" and w2["bytes"] == 0


def test_a_worker_whose_engine_freezes_is_stopped_after_the_idle_timeout_and_the_next_gets_every_byte(
    images, monkeypatch
):
    monkeypatch.setenv("FAKE_DOCKER_LOAD_HANG", "root@10.0.0.2")
    started = time.monotonic()
    result = send_image(images, image_hops(["w1", "w2"]), idle_timeout=4)
    assert time.monotonic() - started < 30
    w1, w2 = result["reports"]
    assert not w1["ok"] and w1["error"].startswith("docker load took no bytes for 2 s"), w1
    assert w2["ok"] and w2["bytes"] == IMAGE_BYTES and result["stalled"] == "" and result["source_error"] == ""
    assert loaded(images) == {"root@10.0.0.3": [images["saved"]]}


def test_a_source_that_stops_sending_is_stopped_after_the_idle_timeout(images, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_SAVE_HANG", "1")
    started = time.monotonic()
    result = send_image(images, image_hops(["w1"]), idle_timeout=2)
    assert time.monotonic() - started < 30
    assert result["stalled"] == "no byte moved for 2 s: the stream was stopped"
    assert result["source_error"] == ""


def test_a_relayed_worker_whose_node_dies_mid_stream_is_named_with_the_bytes_passed_to_it(images, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_SAVE_BYTES", str(16 * _chain_copy.CHUNK))
    monkeypatch.setenv("FAKE_SSH_CUT", "root@10.0.0.3")
    w1, w2 = send_image(images, image_hops(["w1", "w2"]))["reports"]
    assert w1["ok"] and w1["bytes"] == 16 * _chain_copy.CHUNK
    assert not w2["ok"] and w2["error"].startswith("the stream to w2 ended (ssh rc 255)")
    assert 2 << 20 <= w2["bytes"] <= 16 * _chain_copy.CHUNK, w2
