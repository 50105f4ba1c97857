"""roce_interface on recorded `ip -j` outputs and Spark sysfs fixture trees."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from _fabric_fakes import FakeHost
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _netif
from ansible_collections.dgx_spark.vllm.plugins.modules import roce_interface
from module_runner import FIXTURES, run_module

SPARK = os.path.join(FIXTURES, "sysfs", "spark_cx7")
FRESH = os.path.join(FIXTURES, "sysfs", "spark_cx7_no_ipv4")
LAB = os.path.join(FIXTURES, "sysfs", "lab_node")


def args(tmp_path, **extra):
    base = dict(
        name="enp1s0f1np1",
        address="198.18.100.11/24",
        mtu=9000,
        sysfs_root=LAB,
        netplan_dir=str(tmp_path / "netplan"),
        apply_with="ip",
        gid_timeout=0,
    )
    base.update(extra)
    return base


def netplan_file(tmp_path):
    return tmp_path / "netplan" / "40-dgx-spark-enp1s0f1np1.yaml"


def test_fresh_interface_is_configured_with_ip(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path))
    assert not failed, result
    assert result["changed"] is True
    assert result["applied_with"] == "ip"
    assert host.link["mtu"] == 9000
    assert [a["local"] for a in host.link["addr_info"] if a["family"] == "inet"] == ["198.18.100.11"]
    assert result["diff"]["before"]["mtu"] == 1500
    assert result["diff"]["after"]["addresses"] == ["198.18.100.11/24"]
    assert result["rdma_device"] is None and result["gid_index"] is None
    path = netplan_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "dhcp4: false" in text and "mtu: 9000" in text and "- 198.18.100.11/24" in text


def test_second_run_changes_nothing(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none")
    run_module(monkeypatch, roce_interface, args(tmp_path))
    host.calls.clear()
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path))
    assert not failed
    assert result["changed"] is False
    assert host.changes() == []


def test_check_mode_changes_nothing_and_reports_the_plan(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none")
    before = host.snapshot()
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, _ansible_check_mode=True))
    assert not failed, result
    assert result["changed"] is True
    assert result["diff"]["after"]["mtu"] == 9000
    assert host.snapshot() == before
    assert host.changes() == []
    assert not netplan_file(tmp_path).exists()


def test_mtu_change_only(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_configured")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, mtu=4200))
    assert not failed, result
    assert result["changed"] is True
    assert [c[1:] for c in host.changes()] == [["link", "set", "dev", "enp1s0f1np1", "mtu", "4200"]]


def test_address_change_replaces_the_old_address(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_two")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, address="198.18.100.21/24"))
    assert not failed, result
    assert result["diff"]["before"]["addresses"] == ["198.18.100.11/24", "198.18.100.99/24"]
    assert [a["local"] for a in host.link["addr_info"] if a["family"] == "inet"] == ["198.18.100.21"]
    assert ["addr", "del", "198.18.100.99/24", "dev", "enp1s0f1np1"] in [c[1:] for c in host.changes()]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (dict(mtu=9217), "mtu:"),
        (dict(mtu=1279), "mtu:"),
        (dict(address="198.18.100.11"), "address:"),
        (dict(address="198.18.100/24"), "address:"),
        (dict(address="198.18.100.11/33"), "address:"),
        (dict(address="198.18.100.0/24"), "address:"),
        (dict(address="127.0.0.2/8"), "address:"),
        (dict(other_rail_addresses=["198.18.100.12/24"]), "one subnet"),
        (dict(other_rail_addresses=["198.18.0.1/16"]), "one subnet"),
        (dict(name="enP9p9s0f9np9"), "name:"),
    ],
)
def test_bad_input_fails_naming_the_parameter_and_changes_nothing(monkeypatch, tmp_path, extra, named):
    host = FakeHost(monkeypatch, "addr_none", missing=extra.get("name") == "enP9p9s0f9np9")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, **extra))
    assert failed
    assert named in result["msg"]
    assert host.changes() == []
    assert not netplan_file(tmp_path).exists()


def test_other_rail_in_its_own_subnet_is_fine(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, other_rail_addresses=["198.18.101.11/24"]))
    assert not failed, result


def spark_args(tmp_path, sysfs, **extra):
    return args(tmp_path, address="192.168.100.11/24", sysfs_root=sysfs, expected_speed_mbps=200000, **extra)


def test_spark_twin_returns_device_gid_and_speed(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, spark_args(tmp_path, SPARK))
    assert not failed, result
    assert (result["rdma_device"], result["rdma_port"], result["gid_index"]) == ("rocep1s0f1", 1, 3)
    assert (result["speed_mbps"], result["speed_ok"]) == (200000, True)


def test_no_v2_gid_for_the_address_fails(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, spark_args(tmp_path, FRESH))
    assert failed
    assert "no RoCE v2 GID carries 192.168.100.11 on rocep1s0f1" in result["msg"]


def test_no_v2_gid_is_no_failure_in_check_mode(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, spark_args(tmp_path, FRESH, _ansible_check_mode=True))
    assert not failed, result
    assert result["rdma_device"] == "rocep1s0f1" and result["gid_index"] is None


def spark_with_speed(tmp_path, speed):
    """A copy of the Spark tree whose first twin reports another speed."""
    tree = shutil.copytree(SPARK, str(tmp_path / "sys"))
    with open(os.path.join(tree, "class/net/enp1s0f1np1/speed"), "w") as handle:
        handle.write(speed + "\n")
    return tree


def test_slow_link_fails_before_any_change(monkeypatch, tmp_path):
    tree = spark_with_speed(tmp_path, "100000")
    host = FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, spark_args(tmp_path, tree))
    assert failed
    assert "expected_speed_mbps" in result["msg"] and "100000" in result["msg"]
    assert host.changes() == []


def test_unknown_speed_fails_after_applying(monkeypatch, tmp_path):
    tree = spark_with_speed(tmp_path, "-1")
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, spark_args(tmp_path, tree))
    assert failed
    assert "unknown" in result["msg"]


def test_without_expected_speed_speed_ok_is_null(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path))
    assert not failed
    assert result["speed_ok"] is None and result["speed_mbps"] == 10000


def test_netplan_applies_where_systemd_runs(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none", binaries=("ip", "netplan"))
    monkeypatch.setattr(roce_interface, "systemd_running", lambda: True)

    applied = []

    def netplan_apply(_netplan):  # what netplan would do with the file just written
        applied.append(netplan_file(tmp_path).read_text())
        host.ip(["link", "set", "dev", "enp1s0f1np1", "mtu", "9000"])
        host.ip(["link", "set", "dev", "enp1s0f1np1", "up"])
        host.ip(["addr", "replace", "198.18.100.11/24", "dev", "enp1s0f1np1"])

    monkeypatch.setattr(roce_interface.Netplan, "apply", netplan_apply)
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, apply_with="auto"))
    assert not failed, result
    assert result["applied_with"] == "netplan"
    assert applied and "mtu: 9000" in applied[0]
    generate = [c for c in host.calls if c[0] == "/usr/bin/netplan"]
    assert generate and generate[0][1:3] == ["generate", "--root-dir"]


def test_netplan_rejection_fails_before_writing(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none", binaries=("ip", "netplan"))
    host.netplan_generate = (1, "", "Error in network definition: invalid mtu")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path))
    assert failed
    assert "netplan generate rejected" in result["msg"]
    assert not netplan_file(tmp_path).exists()
    assert host.changes() == [c for c in host.changes() if c[0] == "/usr/bin/netplan"]


def test_apply_with_netplan_without_netplan_fails(monkeypatch, tmp_path):
    FakeHost(monkeypatch, "addr_none")
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path, apply_with="netplan"))
    assert failed
    assert "apply_with" in result["msg"]


def test_read_back_differs_fails(monkeypatch, tmp_path):
    host = FakeHost(monkeypatch, "addr_none")
    original = host.ip

    def stubborn(rest):  # a driver that refuses jumbo frames
        if rest[:2] == ["link", "set"] and "mtu" in rest:
            return 0, "", ""
        return original(rest)

    host.ip = stubborn
    failed, result = run_module(monkeypatch, roce_interface, args(tmp_path))
    assert failed
    assert "mtu differ" in result["msg"]


def test_systemd_detection(tmp_path):
    assert _netif.systemd_running(str(tmp_path)) is False
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    assert _netif.systemd_running(str(tmp_path)) is True
