# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RDMA discovery for one network interface, read from sysfs (private).

Everything is read below a configurable root (``sysfs_root``, ``/sys`` on a host) so that unit
tests run against fixture trees built from a DGX Spark's ConnectX-7 layout:

    class/net/<netdev>/{speed,mtu,operstate}
    class/net/<netdev>/device/infiniband/<rdma device>/
    class/infiniband/<rdma device>/ports/<port>/gids/<index>
    class/infiniband/<rdma device>/ports/<port>/gid_attrs/types/<index>   "IB/RoCE v1" | "RoCE v2"
    class/infiniband/<rdma device>/ports/<port>/gid_attrs/ndevs/<index>   the netdev of the entry

Unused GID entries read as all zeros and their attribute files fail with EINVAL; both are skipped.
"""

from __future__ import annotations

import os

ROCE_V2 = "RoCE v2"
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def read_sysfs(path):
    """Return the stripped text of a sysfs file, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _numbered(directory):
    """Names of the entries of directory that are numbers, in numeric order."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((name for name in names if name.isdigit()), key=int)


def ipv4_gid(address):
    """The IPv4-mapped IPv6 GID for a dotted IPv4 address, spelled as sysfs spells it."""
    octets = [int(part) for part in address.split(".")]
    return "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % tuple(octets)


def netdev_info(sysfs_root, netdev):
    """Link facts of a netdev: exists, speed (Mb/s or None when unknown), mtu, operstate."""
    base = os.path.join(sysfs_root, "class", "net", netdev)
    if not os.path.isdir(base):
        return dict(exists=False, speed_mbps=None, mtu=None, operstate=None)
    # speed reads EINVAL (or -1) while the link has no carrier: unknown, not zero.
    speed = read_sysfs(os.path.join(base, "speed"))
    mtu = read_sysfs(os.path.join(base, "mtu"))
    return dict(
        exists=True,
        speed_mbps=int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
        mtu=int(mtu) if mtu and mtu.isdigit() else None,
        operstate=read_sysfs(os.path.join(base, "operstate")),
    )


def gid_table(sysfs_root, device, port):
    """Every populated GID entry of one RDMA port: index, gid, type, netdev."""
    port_dir = os.path.join(sysfs_root, "class", "infiniband", device, "ports", str(port))
    entries = []
    for index in _numbered(os.path.join(port_dir, "gids")):
        gid = read_sysfs(os.path.join(port_dir, "gids", index))
        if not gid or gid == _ZERO_GID:
            continue
        entries.append(
            dict(
                index=int(index),
                gid=gid,
                type=read_sysfs(os.path.join(port_dir, "gid_attrs", "types", index)),
                netdev=read_sysfs(os.path.join(port_dir, "gid_attrs", "ndevs", index)),
            )
        )
    return entries


def _ports(sysfs_root, device):
    return _numbered(os.path.join(sysfs_root, "class", "infiniband", device, "ports"))


def rdma_port(sysfs_root, netdev):
    """(device, port) of the RDMA port behind netdev, or (None, None) when it has none.

    The GID attributes name the netdev directly; the PCI device link is the fallback for a port
    whose GID table is still empty (no address yet, link down).
    """
    ib_root = os.path.join(sysfs_root, "class", "infiniband")
    devices = sorted(os.listdir(ib_root)) if os.path.isdir(ib_root) else []
    for device in devices:
        for port in _ports(sysfs_root, device):
            if any(entry["netdev"] == netdev for entry in gid_table(sysfs_root, device, port)):
                return device, int(port)
    linked = os.path.join(sysfs_root, "class", "net", netdev, "device", "infiniband")
    if os.path.isdir(linked):
        for device in sorted(os.listdir(linked)):
            ports = _ports(sysfs_root, device)
            if ports:
                return device, int(ports[0])
    return None, None


def roce_v2_gid_index(entries, netdev, address):
    """Index of the RoCE v2 GID that carries address on netdev, or None."""
    wanted = ipv4_gid(address)
    for entry in entries:
        if entry["gid"] == wanted and entry["type"] == ROCE_V2 and entry["netdev"] == netdev:
            return entry["index"]
    return None


def discover(sysfs_root, netdev, address=None):
    """Everything the fabric needs to know about netdev, for the IPv4 address when given."""
    facts = netdev_info(sysfs_root, netdev)
    device, port = rdma_port(sysfs_root, netdev)
    entries = gid_table(sysfs_root, device, port) if device else []
    facts.update(
        rdma_device=device,
        rdma_port=port,
        gid_index=roce_v2_gid_index(entries, netdev, address) if device and address else None,
        gids=[entry for entry in entries if entry["netdev"] == netdev],
    )
    return facts
