"""RDMA discovery against sysfs trees built from a DGX Spark's ConnectX-7 layout."""

from __future__ import annotations

import os
import shutil

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _rdma
from module_runner import FIXTURES

SPARK = os.path.join(FIXTURES, "sysfs", "spark_cx7")
FRESH = os.path.join(FIXTURES, "sysfs", "spark_cx7_no_ipv4")
LAB = os.path.join(FIXTURES, "sysfs", "lab_node")


def test_ipv4_gid_spelling():
    assert _rdma.ipv4_gid("192.168.100.11") == "0000:0000:0000:0000:0000:ffff:c0a8:640b"


@pytest.mark.parametrize(
    ("netdev", "address", "device"),
    [("enp1s0f1np1", "192.168.100.11", "rocep1s0f1"), ("enP2p1s0f1np1", "192.168.101.11", "roceP2p1s0f1")],
)
def test_both_twins_found_with_their_v2_gid(netdev, address, device):
    facts = _rdma.discover(SPARK, netdev, address)
    assert (facts["rdma_device"], facts["rdma_port"], facts["gid_index"]) == (device, 1, 3)
    assert facts["speed_mbps"] == 200000
    assert facts["mtu"] == 9000
    assert facts["operstate"] == "up"


def test_v1_entry_of_the_same_address_is_not_taken(tmp_path):
    tree = shutil.copytree(SPARK, str(tmp_path / "sys"))
    types = os.path.join(tree, "class/infiniband/rocep1s0f1/ports/1/gid_attrs/types")
    with open(os.path.join(types, "3"), "w") as handle:
        handle.write("IB/RoCE v1\n")
    assert _rdma.discover(tree, "enp1s0f1np1", "192.168.100.11")["gid_index"] is None


def test_gid_of_another_address_is_not_taken():
    assert _rdma.discover(SPARK, "enp1s0f1np1", "192.168.100.99")["gid_index"] is None


def test_no_ipv4_gid_yet_still_finds_the_device():
    facts = _rdma.discover(FRESH, "enp1s0f1np1", "192.168.100.11")
    assert facts["rdma_device"] == "rocep1s0f1"
    assert facts["gid_index"] is None
    assert [g["type"] for g in facts["gids"]] == ["IB/RoCE v1", "RoCE v2"]


def test_device_link_fallback_when_gid_table_is_empty(tmp_path):
    tree = shutil.copytree(FRESH, str(tmp_path / "sys"))
    shutil.rmtree(os.path.join(tree, "class/infiniband/rocep1s0f1/ports/1/gid_attrs"))
    assert _rdma.rdma_port(tree, "enp1s0f1np1") == ("rocep1s0f1", 1)


def test_down_twin_has_unknown_speed():
    facts = _rdma.discover(SPARK, "enp1s0f0np0")
    assert facts["rdma_device"] == "rocep1s0f0"
    assert facts["speed_mbps"] is None
    assert facts["operstate"] == "down"


def test_no_rdma_in_the_lab():
    facts = _rdma.discover(LAB, "enp1s0f1np1", "198.18.100.11")
    assert (facts["rdma_device"], facts["rdma_port"], facts["gid_index"]) == (None, None, None)
    assert facts["speed_mbps"] == 10000


def test_missing_interface():
    facts = _rdma.discover(LAB, "eth9")
    assert facts["exists"] is False
    assert facts["rdma_device"] is None
