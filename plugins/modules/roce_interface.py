#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: roce_interface
short_description: Configure one RoCE fabric interface and report its RDMA device, GID index and speed
description:
  - Brings one fabric interface (one ConnectX-7 twin on a DGX Spark) up with a static IPv4 address and an MTU,
    writes a netplan file for it (mode C(0600), DHCP off) validated with C(netplan generate), and applies the
    runtime state with C(netplan apply) where netplan can apply (systemd is PID 1), else with C(ip).
  - Reads the state back and fails when it differs from the plan; C(changed) compares before and after.
  - Returns the interface's RDMA device and port, the RoCE v2 GID index that carries its IPv4 address (read from
    sysfs), and its link speed, checked against O(expected_speed_mbps) when given.
  - Bad input fails naming the parameter before anything is changed.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
requirements:
  - netaddr (Python library) on the node
  - iproute2 (C(ip)) on the node; netplan where it is used
extends_documentation_fragment:
  - dgx_spark.vllm.attributes.STATEFUL
options:
  name:
    description: The interface, e.g. C(enp1s0f1np1). It must exist.
    type: str
    required: true
  address:
    description:
      - Static IPv4 address with its prefix length, e.g. C(192.168.100.11/24). It becomes the only IPv4 address
        of the interface. One /24 per twin on a Spark.
    type: str
    required: true
  mtu:
    description: MTU, from 1280 to 9216 (9000 on a Spark fabric).
    type: int
    default: 9000
  other_rail_addresses:
    description:
      - This host's other fabric addresses (CIDR). The module fails when O(address) shares a subnet with one of
        them, since two rails in one subnet make the kernel route both rails' traffic through one twin.
    type: list
    elements: str
    default: []
  expected_speed_mbps:
    description:
      - Link speed the interface must have, in Mb/s (200000 on a Spark). When given and not met the module fails.
    type: int
  apply_with:
    description:
      - How the runtime state is applied. V(auto) uses V(netplan) when netplan is installed and systemd is PID 1,
        else V(ip).
    type: str
    choices: [auto, netplan, ip]
    default: auto
  netplan_dir:
    description: Directory of the netplan file C(40-dgx-spark-<name>.yaml).
    type: path
    default: /etc/netplan
  sysfs_root:
    description: Root of sysfs, for RDMA discovery and link speed. Tests point it at a fixture tree.
    type: path
    default: /sys
  gid_timeout:
    description: Seconds to wait for the kernel to publish the RoCE v2 GID of a newly set address.
    type: int
    default: 10
"""

EXAMPLES = r"""
- name: Configure the first twin of the cabled port
  dgx_spark.vllm.roce_interface:
    name: enp1s0f1np1
    address: 192.168.100.11/24
    mtu: 9000
    other_rail_addresses: [192.168.101.11/24]
    expected_speed_mbps: 200000
  register: rail0

- name: Show what NCCL needs
  ansible.builtin.debug:
    msg: "{{ rail0.rdma_device }} GID {{ rail0.gid_index }} at {{ rail0.speed_mbps }} Mb/s"
"""

RETURN = r"""
name:
  description: The interface.
  returned: always
  type: str
  sample: enp1s0f1np1
ip:
  description: The interface's IPv4 address without prefix.
  returned: always
  type: str
  sample: 192.168.100.11
address:
  description: The address with its prefix length.
  returned: always
  type: str
  sample: 192.168.100.11/24
mtu:
  description: The MTU after the run (the planned one in check mode).
  returned: always
  type: int
  sample: 9000
rdma_device:
  description: The RDMA device behind the interface; null when it has none (no RDMA, as in the lab).
  returned: always
  type: str
  sample: rocep1s0f1
rdma_port:
  description: The RDMA device's port number; null when there is no RDMA device.
  returned: always
  type: int
  sample: 1
gid_index:
  description:
    - Index of the RoCE v2 GID that carries the address (for C(NCCL_IB_GID_INDEX)); null without an RDMA device,
      or in check mode before the address is set.
  returned: always
  type: int
  sample: 3
speed_mbps:
  description: Link speed in Mb/s from sysfs; null when unknown (no carrier).
  returned: always
  type: int
  sample: 200000
speed_ok:
  description: Whether the speed equals O(expected_speed_mbps); null when none was given or the speed is unknown.
  returned: always
  type: bool
  sample: true
applied_with:
  description: What applied the runtime state, V(netplan) or V(ip); null when the runtime state needed no change.
  returned: always
  type: str
  sample: ip
netplan_file:
  description: Path of the interface's netplan file.
  returned: always
  type: str
  sample: /etc/netplan/40-dgx-spark-enp1s0f1np1.yaml
diff:
  description: State before and after (mtu, up, addresses, netplan).
  returned: always
  type: dict
"""


from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.dgx_spark.vllm.plugins.module_utils._netif import (
    HAS_NETADDR,
    NETADDR_IMPORT_ERROR,
    IpRoute,
    Netplan,
    check_ipv4_interface,
    netplan_document,
    systemd_running,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._rdma import discover
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import (
    file_mode,
    read_text,
    write_text,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._wait import wait_for

MTU_MIN = 1280
MTU_MAX = 9216
NETPLAN_MODE = "0600"
RUNTIME_KEYS = ("mtu", "up", "addresses")


class RoceInterface:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.name = self.p["name"]
        self.ip = IpRoute(module)
        self.netplan = Netplan(module)
        self.netplan_file = "%s/40-dgx-spark-%s.yaml" % (self.p["netplan_dir"].rstrip("/"), self.name)

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, name=self.name, **extra)

    def validate(self):
        """Every input check, before anything changes."""
        mtu = self.p["mtu"]
        if not MTU_MIN <= mtu <= MTU_MAX:
            self.fail("mtu: %d is outside %d..%d; use 9000 on a Spark fabric." % (mtu, MTU_MIN, MTU_MAX))
        net, why = check_ipv4_interface(self.p["address"])
        if why:
            self.fail("address: %s." % why)
        for other in self.p["other_rail_addresses"]:
            other_net, other_why = check_ipv4_interface(other)
            if other_why:
                self.fail("other_rail_addresses: %s." % other_why)
            if net.cidr in other_net.cidr or other_net.cidr in net.cidr:
                self.fail(
                    "address: %s and the other rail's %s are in one subnet (%s); give each rail (twin) "
                    "its own subnet, e.g. one /24 per twin." % (net, other_net, net.cidr)
                )
        state = self.ip.state(self.name)
        if state is None:
            self.fail(
                "name: interface %s does not exist on this host; check the fabric_interfaces names "
                "against `ip link`." % self.name
            )
        return net, state

    def read_state(self, runtime=None):
        state = runtime if runtime is not None else self.ip.state(self.name)
        current = {key: state[key] for key in RUNTIME_KEYS}
        current["netplan"] = read_text(self.netplan_file)
        current["netplan_mode"] = file_mode(self.netplan_file)
        return current

    def use_netplan(self):
        choice = self.p["apply_with"]
        if choice == "auto":
            return bool(self.netplan.bin) and systemd_running()
        if choice == "netplan" and not self.netplan.bin:
            self.fail("apply_with: netplan is not installed on this host; use apply_with=ip or auto.")
        return choice == "netplan"

    def apply_runtime(self, before, planned):
        if self.use_netplan():
            self.netplan.apply()
            return "netplan"
        if before["mtu"] != planned["mtu"]:
            self.ip.set_mtu(self.name, planned["mtu"])
        if not before["up"]:
            self.ip.set_up(self.name)
        wanted = planned["addresses"][0]
        if wanted not in before["addresses"]:
            self.ip.replace_address(self.name, wanted)
        for address in before["addresses"]:
            if address != wanted:
                self.ip.delete_address(self.name, address)
        return "ip"

    def rdma_facts(self, ip, wait):
        """sysfs discovery; waits for the GID the kernel publishes once the address is set."""

        def gid_published():
            facts = discover(self.p["sysfs_root"], self.name, ip)
            return not facts["rdma_device"] or facts["gid_index"] is not None, facts

        return wait_for(gid_published, self.p["gid_timeout"] if wait else 0, interval=0.2).last

    def check_speed(self, speed, final):
        """speed_ok; fails when an expected speed is given and a known speed misses it."""
        expected = self.p["expected_speed_mbps"]
        if expected is None:
            return None
        if speed is None:
            if final:
                self.fail(
                    "expected_speed_mbps: the link speed of %s is unknown (no carrier?); expected %d Mb/s. "
                    "Check the cable and the peer." % (self.name, expected)
                )
            return None
        if speed != expected:
            self.fail(
                "expected_speed_mbps: %s runs at %d Mb/s, expected %d Mb/s. Check the cable (QSFP112 for "
                "200G) and that both twins are up." % (self.name, speed, expected),
                speed_mbps=speed,
            )
        return True

    def run(self):
        net, runtime = self.validate()
        address = "%s/%d" % (net.ip, net.prefixlen)
        self.check_speed(discover(self.p["sysfs_root"], self.name)["speed_mbps"], final=False)

        before = self.read_state(runtime)
        document = netplan_document(self.name, address, self.p["mtu"])
        planned = dict(mtu=self.p["mtu"], up=True, addresses=[address], netplan=document, netplan_mode=NETPLAN_MODE)
        changed = before != planned
        applied_with = None
        after = before
        if changed and self.module.check_mode:
            after = planned
        elif changed:
            if before["netplan"] != document or before["netplan_mode"] != NETPLAN_MODE:
                error = self.netplan.validate("40-dgx-spark-%s.yaml" % self.name, document)
                if error:
                    self.fail("netplan generate rejected the document for %s: %s" % (self.name, error))
                write_text(self.module, self.netplan_file, document, NETPLAN_MODE)
            if any(before[key] != planned[key] for key in RUNTIME_KEYS):
                applied_with = self.apply_runtime(before, planned)
            after = self.read_state()
            if after != planned:
                differs = sorted(key for key in planned if after[key] != planned[key])
                self.fail(
                    "%s did not take the planned state (%s differ) after applying with %s."
                    % (self.name, ", ".join(differs), applied_with or "a netplan file write"),
                    diff=dict(before=before, after=after),
                    planned=planned,
                )

        # In check mode a planned address is not set yet: no GID to find, no speed to insist on.
        applied = not (self.module.check_mode and changed)
        facts = self.rdma_facts(str(net.ip), wait=not self.module.check_mode)
        if facts["rdma_device"] and facts["gid_index"] is None and applied:
            types = ", ".join("%d:%s %s" % (g["index"], g["type"], g["gid"]) for g in facts["gids"]) or "none"
            self.fail(
                "no RoCE v2 GID carries %s on %s port %s (GIDs of %s: %s). Check that the address is "
                "set and RoCE v2 is enabled on the device."
                % (net.ip, facts["rdma_device"], facts["rdma_port"], self.name, types)
            )
        speed_ok = self.check_speed(facts["speed_mbps"], final=applied)
        self.module.exit_json(
            changed=changed,
            name=self.name,
            ip=str(net.ip),
            address=address,
            mtu=after["mtu"],
            rdma_device=facts["rdma_device"],
            rdma_port=facts["rdma_port"],
            gid_index=facts["gid_index"],
            speed_mbps=facts["speed_mbps"],
            speed_ok=speed_ok,
            applied_with=applied_with,
            netplan_file=self.netplan_file,
            diff=dict(before=before, after=after),
        )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            address=dict(type="str", required=True),
            mtu=dict(type="int", default=9000),
            other_rail_addresses=dict(type="list", elements="str", default=[]),
            expected_speed_mbps=dict(type="int"),
            apply_with=dict(type="str", choices=["auto", "netplan", "ip"], default="auto"),
            netplan_dir=dict(type="path", default="/etc/netplan"),
            sysfs_root=dict(type="path", default="/sys"),
            gid_timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    if not HAS_NETADDR:
        module.fail_json(msg=missing_required_lib("netaddr"), exception=NETADDR_IMPORT_ERROR)
    RoceInterface(module).run()


if __name__ == "__main__":
    main()
