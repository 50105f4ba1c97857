"""model_files on fixture model trees (tests/unit/fixtures/model/) with recorded rsync output."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from ansible.module_utils import basic
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _model
from ansible_collections.dgx_spark.vllm.plugins.modules import model_files
from module_runner import FIXTURES, fixture_text, run_module

SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture
def tree(tmp_path):
    dest = tmp_path / "Qwen3.5-test"
    shutil.copytree(os.path.join(FIXTURES, "model", "sharded"), dest)
    return str(dest)


def test_complete_tree_and_manifest(monkeypatch, tree):
    failed, res = run_module(monkeypatch, model_files, dict(path=tree))
    assert not failed, res
    assert res["state"] == "complete" and res["layout"] == "sharded" and res["shards"] == 2
    assert [e["path"] for e in res["manifest"]] == sorted(os.listdir(tree))
    assert all(e["fingerprint"].startswith("sample:") for e in res["manifest"])
    assert res["total_bytes"] == sum(os.path.getsize(os.path.join(tree, f)) for f in os.listdir(tree))
    assert not res["changed"]


def test_digest_equal_for_copies_and_different_after_an_edit(monkeypatch, tree, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(tree, copy)
    one = run_module(monkeypatch, model_files, dict(path=tree))[1]
    two = run_module(monkeypatch, model_files, dict(path=copy))[1]
    assert one["manifest_digest"] == two["manifest_digest"]
    with open(os.path.join(copy, "tokenizer_config.json"), "a", encoding="utf-8") as handle:
        handle.write(" ")
    three = run_module(monkeypatch, model_files, dict(path=copy))[1]
    assert three["manifest_digest"] != one["manifest_digest"]


def test_missing_shard_is_named(monkeypatch, tree):
    os.remove(os.path.join(tree, SHARD2))
    failed, res = run_module(monkeypatch, model_files, dict(path=tree))
    assert failed
    assert res["state"] == "incomplete" and res["missing"] == [SHARD2]
    assert "Missing: %s" % SHARD2 in res["msg"]


def test_short_shard_is_named_with_sizes(monkeypatch, tree):
    path = os.path.join(tree, SHARD2)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.truncate(size - 100)
    failed, res = run_module(monkeypatch, model_files, dict(path=tree))
    assert failed
    assert res["short"] == [{"file": SHARD2, "size": size - 100, "expected": size}]
    assert "Short: %s (%d of %d bytes)" % (SHARD2, size - 100, size) in res["msg"]


def test_header_size_matches_the_file():
    for name in ("model-00001-of-00002.safetensors", SHARD2):
        path = os.path.join(FIXTURES, "model", "sharded", name)
        assert _model.safetensors_expected_size(path) == (os.path.getsize(path), None)


def test_single_file_layout(monkeypatch, tmp_path):
    dest = str(tmp_path / "m")
    shutil.copytree(os.path.join(FIXTURES, "model", "single"), dest)
    failed, res = run_module(monkeypatch, model_files, dict(path=dest))
    assert not failed and res["layout"] == "single" and res["shards"] == 1
    os.remove(os.path.join(dest, "config.json"))
    failed, res = run_module(monkeypatch, model_files, dict(path=dest))
    assert failed and res["missing"] == ["config.json"]


def test_missing_directory_report_without_failing(monkeypatch, tmp_path):
    failed, res = run_module(monkeypatch, model_files, dict(path=str(tmp_path / "nope"), fail_on_incomplete=False))
    assert not failed and res["state"] == "missing" and res["manifest"] == []


def test_download_needs_the_library(monkeypatch, tmp_path):
    monkeypatch.setattr(model_files, "HAS_HF_HUB", False)
    failed, res = run_module(monkeypatch, model_files, dict(path=str(tmp_path / "m"), download=True, repo_id="Qwen/x"))
    assert failed and "huggingface_hub" in res["msg"]


def test_download_unreachable_hub_is_clear_and_token_not_logged(monkeypatch, tmp_path):
    calls = []

    def snapshot_download(**kwargs):
        calls.append(kwargs)
        raise OSError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(model_files, "HAS_HF_HUB", True)
    monkeypatch.setattr(model_files, "snapshot_download", snapshot_download)
    args = dict(path=str(tmp_path / "m"), download=True, repo_id="Qwen/Qwen3.5-122B-A10B-FP8", token="hf_secret")  # noqa: S106
    failed, res = run_module(monkeypatch, model_files, args)
    assert failed
    assert "Could not download Qwen/Qwen3.5-122B-A10B-FP8 from the Hugging Face hub" in res["msg"]
    assert "cannot reach the hub" in res["msg"]
    assert calls[0]["local_dir"] == args["path"] and calls[0]["token"] == "hf_secret"  # noqa: S105
    assert "hf_secret" not in str(res)


def test_download_completes_the_tree(monkeypatch, tmp_path):
    def snapshot_download(repo_id, revision, local_dir, token):
        shutil.copytree(os.path.join(FIXTURES, "model", "sharded"), local_dir, dirs_exist_ok=True)

    monkeypatch.setattr(model_files, "HAS_HF_HUB", True)
    monkeypatch.setattr(model_files, "snapshot_download", snapshot_download)
    failed, res = run_module(monkeypatch, model_files, dict(path=str(tmp_path / "m"), download=True, repo_id="Qwen/x"))
    assert not failed and res["changed"] and res["state"] == "complete" and res["download"]["ok"]


def fake_rsync(monkeypatch, output, rc=0):
    calls = []

    def run_command(self, argv, **kwargs):
        calls.append(argv)
        return rc, output, "" if rc == 0 else "ssh: connect to host 198.18.100.12 port 22: No route to host"

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, required=False: "/usr/bin/" + name)
    return calls


SYNC = dict(
    sync_to=[{"host": "spark-2", "address": "198.18.100.12"}],
    ssh_key="/root/.ssh/dgx_spark_vllm_sync",
    sync_topology="star",
)


def test_sync_transfers_node_to_node(monkeypatch, tree):
    calls = fake_rsync(monkeypatch, fixture_text("model", "rsync_first.txt"))
    failed, res = run_module(monkeypatch, model_files, dict(path=tree, **SYNC))
    assert not failed, res
    assert res["changed"] and res["synced"][0]["changed"] and res["synced"][0]["files"] == 5
    argv = calls[0]
    assert argv[0] == "/usr/bin/rsync" and {"--partial", "--delete", "--exclude=/.cache"} <= set(argv)
    assert argv[-2:] == [tree + "/", "root@198.18.100.12:%s/" % tree]
    assert "-i /root/.ssh/dgx_spark_vllm_sync" in argv[argv.index("-e") + 1]


def test_sync_identical_is_not_a_change(monkeypatch, tree):
    fake_rsync(monkeypatch, fixture_text("model", "rsync_again.txt"))
    failed, res = run_module(monkeypatch, model_files, dict(path=tree, **SYNC))
    assert not failed and not res["changed"] and res["synced"][0]["changed"] is False


def test_sync_failure_names_the_target(monkeypatch, tree):
    fake_rsync(monkeypatch, "", rc=255)
    failed, res = run_module(monkeypatch, model_files, dict(path=tree, **SYNC))
    assert failed and "spark-2 (198.18.100.12)" in res["msg"] and "No route to host" in res["msg"]


def test_sync_check_mode_is_a_dry_run(monkeypatch, tree):
    calls = fake_rsync(monkeypatch, fixture_text("model", "rsync_first.txt"))
    run_module(monkeypatch, model_files, dict(path=tree, _ansible_check_mode=True, **SYNC))
    assert "--dry-run" in calls[0]


def test_sync_needs_a_key(monkeypatch, tree):
    failed, res = run_module(monkeypatch, model_files, dict(path=tree, sync_to=SYNC["sync_to"]))
    assert failed and res["msg"].startswith("ssh_key:")


def fake_chain(monkeypatch, fail_host=None):
    """The chain's transport (run for real in test_chain_copy.py); here what the module asks of it."""
    calls = []

    def send(source, hops, *, bins, ssh_argv, user, key, known_hosts, fallback, connect_timeout=5):
        with tempfile.TemporaryDirectory() as workdir:
            argv, _what = source(workdir)
            with open(argv[-1], "rb") as listing:
                files = [name.decode() for name in listing.read().split(b"\0") if name]
        calls.append(dict(argv=argv, hops=hops, files=files, user=user, key=key, fallback=fallback))
        reports = []
        for hop in hops:
            failed = hop["host"] == fail_host
            error = "the stream to %s ended (ssh rc 255): No route to host" % hop["host"] if failed else ""
            reports.append(dict(host=hop["host"], ok=not failed, bytes=4096, files=len(hop["extract"]), seconds=0.1))
            reports[-1]["error"] = error
        return dict(reports=reports, source_error="")

    monkeypatch.setattr(model_files._chain_copy, "send", send)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, required=False: "/usr/bin/" + name)
    return calls


def chain_args(tree, manifests):
    targets = [dict(host=h, address="198.18.100.%d" % (12 + i), manifest=m) for i, (h, m) in enumerate(manifests)]
    return dict(path=tree, sync_to=targets, ssh_key="/root/.ssh/k")


def test_chain_sends_each_stale_worker_what_it_lacks_and_skips_a_converged_one(monkeypatch, tree):
    head = _model.manifest(tree, "sample")[0]
    lacking = [e for e in head if e["path"] != SHARD2]
    calls = fake_chain(monkeypatch)
    args = chain_args(tree, [("spark-2", None), ("spark-3", head), ("spark-4", lacking)])
    failed, res = run_module(monkeypatch, model_files, args)
    assert not failed, res
    (call,) = calls
    assert [h["host"] for h in call["hops"]] == ["spark-2", "spark-4"]
    assert call["hops"][1]["extract"] == [SHARD2] and call["files"] == [e["path"] for e in head]
    assert call["argv"][:6] == ["/usr/bin/tar", "-c", "-f", "-", "-C", tree]
    synced = {r["host"]: r for r in res["synced"]}
    assert synced["spark-3"]["changed"] is False and synced["spark-3"]["files"] == 0
    assert synced["spark-4"]["source"] == "spark-2" and synced["spark-2"]["source"] == "this node"
    assert res["changed"] and res["sent_bytes"] == 4096


def test_chain_with_every_worker_converged_sends_nothing(monkeypatch, tree):
    head = _model.manifest(tree, "sample")[0]
    calls = fake_chain(monkeypatch)
    failed, res = run_module(monkeypatch, model_files, chain_args(tree, [("spark-2", head)]))
    assert not failed and not res["changed"] and calls == [] and res["sent_bytes"] == 0


def test_chain_in_check_mode_reports_and_sends_nothing(monkeypatch, tree):
    calls = fake_chain(monkeypatch)
    args = dict(chain_args(tree, [("spark-2", None)]), _ansible_check_mode=True)
    failed, res = run_module(monkeypatch, model_files, args)
    assert not failed and res["changed"] and calls == [] and res["synced"][0]["files"] == len(os.listdir(tree))


def test_chain_failure_names_the_node_and_the_resume(monkeypatch, tree):
    fake_chain(monkeypatch, fail_host="spark-3")
    failed, res = run_module(monkeypatch, model_files, chain_args(tree, [("spark-2", None), ("spark-3", None)]))
    assert failed
    assert "this node -> spark-2 -> spark-3" in res["msg"] and "spark-3: the stream to spark-3 ended" in res["msg"]
    assert "sends only the files" in res["msg"] and "model_sync_topology" in res["msg"]


def test_drop_caches_reports_read_only_proc(monkeypatch, tree):
    real_open = open

    def refuse(path, *args, **kwargs):
        # Only the control file is refused, as in a container where /proc/sys is mounted read-only.
        if str(path) == "/proc/sys/vm/drop_caches":
            raise OSError(30, "Read-only file system")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(_model, "open", refuse, raising=False)
    failed, res = run_module(monkeypatch, model_files, dict(path=tree, drop_caches=True))
    assert not failed and not res["changed"]
    assert res["page_cache"]["requested"] and not res["page_cache"]["dropped"]
    assert "Read-only file system" in res["page_cache"]["reason"]


def test_drop_caches_writes_3(tmp_path):
    control = tmp_path / "drop_caches"
    assert _model.drop_page_cache(str(control)) == {"dropped": True, "reason": ""}
    assert control.read_text() == "3\n"
