"""The endpoint filters (api_url, peer_engine) on node variables as hostvars gives them."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.vllm.plugins.filter.endpoint import FilterModule

FILTERS = FilterModule().filters()
HEAD = {
    "inventory_hostname": "spark-1",
    "ansible_host": "192.168.100.11",
    "fabric_interfaces": [{"name": "enp1s0f1np1", "address": "198.18.100.11/24"}],
}


def test_api_url_is_the_first_rail_when_the_bind_is_unset_or_a_wildcard():
    assert FILTERS["api_url"](HEAD) == "http://198.18.100.11:8000"
    wildcard = dict(HEAD, vllm_server_host="0.0.0.0", vllm_server_port="9000")  # noqa: S104 - a bind address
    assert FILTERS["api_url"](wildcard) == "http://198.18.100.11:9000"
    # The fabric stage's fact wins over the inventory's rail list.
    assert FILTERS["api_url"](dict(HEAD, fabric_ip="198.18.101.11"), 8001) == "http://198.18.101.11:8001"


def test_api_url_keeps_a_named_bind_and_brackets_ipv6():
    assert FILTERS["api_url"](dict(HEAD, vllm_server_host="10.0.0.5")) == "http://10.0.0.5:8000"
    assert FILTERS["api_url"](dict(HEAD, vllm_server_host="fd00::11")) == "http://[fd00::11]:8000"


def test_peer_engine_is_ssh_to_the_fabric_address():
    assert FILTERS["peer_engine"](HEAD, "spark") == "ssh://spark@198.18.100.11"
    assert FILTERS["peer_engine"]({"ansible_host": "192.168.100.12"}, "root") == "ssh://root@192.168.100.12"
    with pytest.raises(AnsibleFilterError, match="hostvars"):
        FILTERS["peer_engine"]({}, "root")
