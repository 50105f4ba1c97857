#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_check
short_description: Don't-fragment ping at full MTU to every peer on every fabric rail
description:
  - For each rail (one fabric interface of this host) pings every peer address with
    C(ping -M do -s <mtu - 28> -c <count> -W <timeout> -w <deadline> -I <interface> <peer>), so that a frame
    of the full MTU must cross the path unfragmented.
  - With the deadline (O(timeout) plus the pings' spacing, 0.2 s each as a user and 0.01 s as root, rounded up
    to whole seconds) ping sends until O(count) replies came. A request is lost when a later one was answered
    and it was not; those still in flight when the last reply came are not (a slow or busy peer). One lost
    request passes (a peer just brought up) and is shown in RV(results) as C(loss_percent); more than one, or
    fewer than O(count) replies by the deadline, is packet loss.
  - On failure names the rail, the peer and the likely cause, read from ping's output and the link state
    (MTU mismatch on the path, no route, link down, peer unreachable, packet loss). When big pings are lost
    silently, a small ping tells an MTU drop on the path from an unreachable peer.
  - Changes nothing; runs the same in check mode.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
requirements:
  - iputils ping and iproute2 (C(ip)) on the node
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.attributes.facts
options:
  rails:
    description: The rails to check, one per fabric interface of this host.
    type: list
    elements: dict
    required: true
    suboptions:
      interface:
        description: This host's interface on the rail.
        type: str
        required: true
      peers:
        description: IPv4 addresses of the other hosts on this rail (no prefix).
        type: list
        elements: str
        required: true
      name:
        description: Name of the rail in messages; the interface when omitted.
        type: str
  mtu:
    description: The fabric MTU (1280..9216). The ICMP payload is O(mtu) - 28 (20 IPv4 + 8 ICMP header bytes).
    type: int
    default: 9000
  count:
    description: Pings per peer.
    type: int
    default: 3
  timeout:
    description: >-
      Seconds to wait for a reply when none came (C(ping -W)); the deadline adds the pings' spacing to it (0.2 s
      each as a user, 0.01 s as root).
    type: int
    default: 2
"""

EXAMPLES = r"""
- name: Check both twins against the other node
  dgx_spark.vllm.fabric_check:
    mtu: 9000
    rails:
      - interface: enp1s0f1np1
        peers: [192.168.100.12]
      - interface: enP2p1s0f1np1
        peers: [192.168.101.12]
"""

RETURN = r"""
results:
  description: One entry per rail and peer.
  returned: always
  type: list
  elements: dict
  contains:
    rail:
      description: Rail name.
      type: str
      sample: enp1s0f1np1
    interface:
      description: This host's interface on the rail.
      type: str
      sample: enp1s0f1np1
    peer:
      description: The peer address.
      type: str
      sample: 192.168.100.12
    ok:
      description: Whether every ping came back.
      type: bool
      sample: true
    cause:
      description: >-
        Null when ok, else one of V(mtu_mismatch), V(no_route), V(link_down), V(peer_unreachable),
        V(packet_loss), V(error).
      type: str
      sample: mtu_mismatch
    message:
      description: What failed and why, in words; empty when ok.
      type: str
    loss_percent:
      description: >-
        Lost requests in percent of those up to the last answered one; with fewer than O(count) replies by the
        deadline, ping's own figure.
      type: float
      sample: 0.0
    rtt_avg_ms:
      description: Average round trip in milliseconds, when any reply came.
      type: float
      sample: 0.123
payload_bytes:
  description: The ICMP payload size used (mtu - 28).
  returned: always
  type: int
  sample: 8972
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils._netif import HAS_NETADDR, IpRoute, netaddr
from ansible_collections.dgx_spark.vllm.plugins.module_utils._ping import HEADERS, RailPinger

MTU_MIN = 1280
MTU_MAX = 9216


class FabricCheck:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.ip = IpRoute(module)
        self.pinger = RailPinger(module, self.p["count"], self.p["timeout"], self.ip)

    def run(self):
        mtu = self.p["mtu"]
        if not MTU_MIN <= mtu <= MTU_MAX:
            self.module.fail_json(msg="mtu: %d is outside %d..%d." % (mtu, MTU_MIN, MTU_MAX))
        for rail in self.p["rails"]:
            if self.ip.state(rail["interface"]) is None:
                self.module.fail_json(msg="rails: interface %s does not exist on this host." % rail["interface"])
            bad = [
                peer for peer in rail["peers"] if HAS_NETADDR and not netaddr.valid_ipv4(peer, flags=netaddr.INET_PTON)
            ]
            if bad:
                self.module.fail_json(
                    msg="rails: peers of %s must be IPv4 addresses without prefix, not %s."
                    % (rail["interface"], ", ".join(bad))
                )
        payload = mtu - HEADERS
        results = self.pinger.check_all(self.p["rails"], payload)
        failed = [result for result in results if not result["ok"]]
        if failed:
            self.module.fail_json(
                msg="fabric check failed at MTU %d (%d-byte DF ping): %s"
                % (mtu, payload, "; ".join(result["message"] for result in failed)),
                results=results,
                payload_bytes=payload,
            )
        self.module.exit_json(changed=False, results=results, payload_bytes=payload)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rails=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    interface=dict(type="str", required=True),
                    peers=dict(type="list", elements="str", required=True),
                    name=dict(type="str"),
                ),
            ),
            mtu=dict(type="int", default=9000),
            count=dict(type="int", default=3),
            timeout=dict(type="int", default=2),
        ),
        supports_check_mode=True,
    )
    FabricCheck(module).run()


if __name__ == "__main__":
    main()
