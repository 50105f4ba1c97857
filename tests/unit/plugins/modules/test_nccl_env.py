"""nccl_env: the environment from the fabric facts, and its env file."""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_env
from ansible_collections.dgx_spark.vllm.plugins.modules import nccl_env
from module_runner import run_module

SPARK_RAILS = [
    dict(name="enp1s0f1np1", address="192.168.100.12/24", rdma_device="rocep1s0f1", gid_index=3),
    dict(name="enP2p1s0f1np1", address="192.168.101.12/24", rdma_device="roceP2p1s0f1", gid_index=3),
]
LAB_RAILS = [
    dict(name="enp1s0f1np1", address="198.18.100.12/24"),
    dict(name="enP2p1s0f1np1", address="198.18.101.12/24"),
]


def args(tmp_path=None, **extra):
    base = dict(interfaces=SPARK_RAILS, master_addr="192.168.100.11/24")
    if tmp_path is not None:
        base["path"] = str(tmp_path / "etc" / "dgx-spark" / "nccl.env")
    base.update(extra)
    return base


def test_spark_env_names_both_twins(monkeypatch):
    failed, result = run_module(monkeypatch, nccl_env, args())
    assert not failed, result
    env = result["env"]
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_IB_DISABLE"] == "0"
    for key in (
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "OMPI_MCA_btl_tcp_if_include",
    ):
        assert env[key] == "enp1s0f1np1"
    assert (env["VLLM_HOST_IP"], env["MASTER_ADDR"]) == ("192.168.100.12", "192.168.100.11")
    assert (env["NCCL_IGNORE_CPU_AFFINITY"], env["RAY_memory_monitor_refresh_ms"]) == ("1", "0")
    assert result["changed"] is False and result["path"] is None


def test_only_twins_with_rdma_are_hcas(monkeypatch):
    rails = [SPARK_RAILS[0], dict(LAB_RAILS[1])]
    failed, result = run_module(monkeypatch, nccl_env, args(interfaces=rails))
    assert not failed
    assert result["env"]["NCCL_IB_HCA"] == "rocep1s0f1"


def test_socket_fallback_only_when_allowed(monkeypatch):
    failed, result = run_module(monkeypatch, nccl_env, args(interfaces=LAB_RAILS))
    assert failed
    assert "allow_socket_fallback" in result["msg"] and "enp1s0f1np1, enP2p1s0f1np1" in result["msg"]
    failed, result = run_module(monkeypatch, nccl_env, args(interfaces=LAB_RAILS, allow_socket_fallback=True))
    assert not failed
    assert result["env"]["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in result["env"] and "NCCL_IB_GID_INDEX" not in result["env"]


def test_rdma_without_gid_fails(monkeypatch):
    rails = [dict(SPARK_RAILS[0], gid_index=None), SPARK_RAILS[1]]
    failed, result = run_module(monkeypatch, nccl_env, args(interfaces=rails))
    assert failed
    assert "enp1s0f1np1 has an RDMA device but no RoCE v2 GID index" in result["msg"]


def test_twins_with_different_gid_indexes_fail(monkeypatch):
    rails = [SPARK_RAILS[0], dict(SPARK_RAILS[1], gid_index=5)]
    failed, result = run_module(monkeypatch, nccl_env, args(interfaces=rails))
    assert failed
    assert "rocep1s0f1=3, roceP2p1s0f1=5" in result["msg"]


def test_extras_are_added(monkeypatch):
    failed, result = run_module(monkeypatch, nccl_env, args(extra_env={"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": 1}))
    assert not failed
    assert (result["env"]["NCCL_DEBUG"], result["env"]["HF_HUB_OFFLINE"]) == ("WARN", "1")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"1BAD": "x"}, "not a valid environment variable name"),
        ({"BAD-NAME": "x"}, "not a valid environment variable name"),
        ({"NCCL_IB_HCA": "mlx5_0"}, "set from the fabric facts"),
        ({"TOKEN": "a\nb"}, "spans lines"),
    ],
)
def test_bad_extras(monkeypatch, tmp_path, extra, says):
    failed, result = run_module(monkeypatch, nccl_env, args(tmp_path, extra_env=extra))
    assert failed
    assert result["msg"].startswith("extra_env:") and says in result["msg"]
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize("key", ["NCCL_IB_GID_INDEX", "NCCL_IB_HCA"])
def test_rdma_keys_refused_without_rdma_too(monkeypatch, key):
    # The lab (no RDMA device) refuses what a Spark refuses.
    args_ = args(interfaces=LAB_RAILS, allow_socket_fallback=True, extra_env={key: "3"})
    failed, result = run_module(monkeypatch, nccl_env, args_)
    assert failed
    assert result["msg"].startswith("extra_env: %s is set from the fabric facts" % key)


def test_role_lists_the_managed_keys():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    with open(os.path.join(root, "roles", "fabric", "vars", "main.yml"), encoding="utf-8") as fh:
        listed = yaml.safe_load(fh)["_fabric_managed_env"]
    built, error = _nccl_env.build_env(LAB_RAILS, "198.18.120.11", allow_socket_fallback=True)
    assert error is None
    assert set(listed) == set(built) | set(_nccl_env.RDMA_KEYS)


def test_env_file_written_0600_then_unchanged(monkeypatch, tmp_path):
    failed, result = run_module(monkeypatch, nccl_env, args(tmp_path))
    assert not failed and result["changed"] is True
    path = tmp_path / "etc" / "dgx-spark" / "nccl.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#")
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in lines
    assert lines[1:] == sorted(lines[1:])
    assert result["diff"]["before"]["content"] is None
    failed, result = run_module(monkeypatch, nccl_env, args(tmp_path))
    assert not failed and result["changed"] is False


def test_mode_drift_is_a_change(monkeypatch, tmp_path):
    run_module(monkeypatch, nccl_env, args(tmp_path))
    path = tmp_path / "etc" / "dgx-spark" / "nccl.env"
    path.chmod(0o644)
    failed, result = run_module(monkeypatch, nccl_env, args(tmp_path))
    assert not failed and result["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_content_change_and_check_mode(monkeypatch, tmp_path):
    run_module(monkeypatch, nccl_env, args(tmp_path))
    path = tmp_path / "etc" / "dgx-spark" / "nccl.env"
    before = path.read_text()
    failed, result = run_module(
        monkeypatch, nccl_env, args(tmp_path, master_addr="192.168.100.13", _ansible_check_mode=True)
    )
    assert not failed and result["changed"] is True
    assert "MASTER_ADDR=192.168.100.13" in result["diff"]["after"]["content"]
    assert path.read_text() == before


def test_bad_mode(monkeypatch, tmp_path):
    failed, result = run_module(monkeypatch, nccl_env, args(tmp_path, mode="rw"))
    assert failed and result["msg"].startswith("mode:")
