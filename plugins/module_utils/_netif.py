# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fabric interface's configuration: the netplan document and the runtime state through ip (private).

Every program runs through ``module.run_command`` with an argument list and the C locale, so the
messages parsed here are the ones recorded in tests/unit/fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import traceback

try:
    import netaddr

    HAS_NETADDR = True
    NETADDR_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - reported through fail_json
    HAS_NETADDR = False
    NETADDR_IMPORT_ERROR = traceback.format_exc()
    netaddr = None

C_LOCALE = {"LC_ALL": "C", "LANG": "C"}


def netplan_document(name, address, mtu):
    """The netplan YAML for one interface; rendered by hand so that it is byte-stable."""
    return (
        "# Managed by dgx_spark.vllm (roce_interface): fabric interface %s.\n"
        "network:\n"
        "  version: 2\n"
        "  ethernets:\n"
        "    %s:\n"
        "      dhcp4: false\n"
        "      dhcp6: false\n"
        "      mtu: %d\n"
        "      addresses:\n"
        "        - %s\n"
    ) % (name, name, mtu, address)


def systemd_running(root="/"):
    """True when systemd is PID 1 (its own sd_booted() test); netplan apply needs it."""
    return os.path.isdir(os.path.join(root, "run", "systemd", "system"))


class Netplan:
    """netplan generate (validation) and netplan apply, where netplan exists."""

    def __init__(self, module):
        self.module = module
        self.bin = module.get_bin_path("netplan")

    def validate(self, filename, text):
        """Error text when netplan rejects the document on its own, else None (or no netplan)."""
        if not self.bin:
            return None
        root = tempfile.mkdtemp(prefix="dgx-spark-netplan.")
        try:
            conf = os.path.join(root, "etc", "netplan")
            os.makedirs(conf)
            path = os.path.join(conf, filename)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(path, 0o600)
            rc, out, err = self.module.run_command([self.bin, "generate", "--root-dir", root], environ_update=C_LOCALE)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return None if rc == 0 else (err or out).strip()

    def apply(self):
        rc, out, err = self.module.run_command([self.bin, "apply"], environ_update=C_LOCALE)
        if rc != 0:
            self.module.fail_json(msg="netplan apply failed (rc %d): %s" % (rc, (err or out).strip()))


class IpRoute:
    """The runtime state of one interface through iproute2's JSON output."""

    def __init__(self, module):
        self.module = module
        self.bin = module.get_bin_path("ip", required=True)

    def _run(self, *args):
        return self.module.run_command([self.bin, *args], environ_update=C_LOCALE)

    def _change(self, *args):
        rc, out, err = self._run(*args)
        if rc != 0:
            self.module.fail_json(msg="ip %s failed (rc %d): %s" % (" ".join(args), rc, (err or out).strip()))

    def state(self, name):
        """mtu, admin up, carrier, operstate and IPv4 addresses (CIDR) of name; None when absent."""
        rc, out, err = self._run("-j", "addr", "show", "dev", name)
        if rc != 0:
            if "does not exist" in err:
                return None
            self.module.fail_json(msg="ip addr show dev %s failed (rc %d): %s" % (name, rc, err.strip()))
        try:
            link = json.loads(out)[0]
        except (ValueError, IndexError, KeyError):
            self.module.fail_json(msg="ip -j addr show dev %s printed no interface: %r" % (name, out[:200]))
        flags = link.get("flags", [])
        return dict(
            mtu=link.get("mtu"),
            up="UP" in flags,
            carrier="NO-CARRIER" not in flags and "LOWER_UP" in flags,
            operstate=link.get("operstate"),
            addresses=[
                "%s/%s" % (info["local"], info["prefixlen"])
                for info in link.get("addr_info", [])
                if info.get("family") == "inet"
            ],
        )

    def set_mtu(self, name, mtu):
        self._change("link", "set", "dev", name, "mtu", str(mtu))

    def set_up(self, name):
        self._change("link", "set", "dev", name, "up")

    def replace_address(self, name, address):
        self._change("addr", "replace", address, "dev", name)

    def delete_address(self, name, address):
        self._change("addr", "del", address, "dev", name)


def check_ipv4_interface(value):
    """Validate an IPv4 interface address in CIDR form; returns (netaddr.IPNetwork, None) or (None, why)."""
    text = str(value)
    if "/" not in text:
        return None, "%r has no prefix length; write it as ADDRESS/PREFIX, e.g. 192.168.100.11/24" % text
    ip_text, prefix = text.split("/", 1)
    if not netaddr.valid_ipv4(ip_text, flags=netaddr.INET_PTON):
        return None, "%r is not a dotted IPv4 address; write it as ADDRESS/PREFIX, e.g. 192.168.100.11/24" % ip_text
    if not prefix.isdigit() or not 1 <= int(prefix) <= 32:
        return None, "prefix /%s is not a number from 1 to 32" % prefix
    net = netaddr.IPNetwork(text)
    ip = net.ip
    if ip.is_loopback() or ip.is_multicast() or ip.is_link_local() or int(ip) == 0:
        return None, "%s is a loopback, multicast, link-local or unspecified address" % ip
    if net.prefixlen <= 30 and ip in (net.network, net.broadcast):
        return None, "%s is the network or broadcast address of %s" % (ip, net.cidr)
    return net, None
