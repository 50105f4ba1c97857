# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a node is reached over the fabric: its API URL and its Docker engine for node-to-node copies.

The documentation is in api_url.yml and peer_engine.yml beside this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

# vllm_serve's own default port (the vllm_server role's vllm_server_port says 8000 too).
DEFAULT_PORT = 8000
_WILDCARDS = ("", "0.0.0.0", "::")  # noqa: S104 - a bind address, matched, never bound here


def fabric_address(node):
    """The node's fabric address: the fabric stage's fact, else the first rail in the inventory, else ansible_host."""
    if node.get("fabric_ip"):
        return str(node["fabric_ip"])
    rails = node.get("fabric_interfaces") or []
    if rails and rails[0].get("address"):
        return str(rails[0]["address"]).split("/", 1)[0]
    if node.get("ansible_host") or node.get("inventory_hostname"):
        return str(node.get("ansible_host") or node["inventory_hostname"])
    raise AnsibleFilterError("no fabric_ip, fabric_interfaces or ansible_host for this node: pass hostvars[<node>]")


def _bracket(host):
    return "[%s]" % host if ":" in host else host


def api_url(node, port=None):
    """http://HOST:PORT of the API the node serves, reachable over the fabric from any node."""
    host = str(node.get("vllm_server_host") or "")
    if host in _WILDCARDS:
        host = fabric_address(node)
    return "http://%s:%d" % (_bracket(host), int(port or node.get("vllm_server_port") or DEFAULT_PORT))


def peer_engine(node, user):
    """ssh://USER@ADDRESS: the node's Docker engine, reached from the head over the fabric."""
    return "ssh://%s@%s" % (user, fabric_address(node))


class FilterModule:
    def filters(self):
        return {"api_url": api_url, "peer_engine": peer_engine}
