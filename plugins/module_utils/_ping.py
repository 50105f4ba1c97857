# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading iputils ping output into a verdict with a likely cause (private).

The phrases matched here are those of the recorded runs in tests/unit/fixtures/ping (iputils 20221126,
C locale).
"""

from __future__ import annotations

import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.dgx_spark.vllm.plugins.module_utils._netif import C_LOCALE, HAS_NETADDR, netaddr

_STATS = re.compile(r"(\d+) packets transmitted, (\d+) received(?:, \+(\d+) errors)?, ([\d.]+)% packet loss")
_RTT = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")
# A reply line; ping does not count one with a bad checksum as received.
_REPLY_SEQ = re.compile(r"^\d+ bytes from .*: icmp_seq=(\d+) (?!.*BAD CHECKSUM)", re.MULTILINE)

# Causes, with the sentence the module reports for each.
CAUSES = {
    "mtu_mismatch": "MTU mismatch on the path: a jumbo frame with don't-fragment set does not fit somewhere "
    "(this interface, a switch, or the peer); set the same MTU on every hop of the rail",
    "no_route": "no route to the peer from this interface: the peer's address is not in this rail's subnet, "
    "or the rails' addresses are swapped",
    "link_down": "link down: the interface has no carrier (cable, peer port down, or the twin not up)",
    "peer_unreachable": "the peer does not answer even small pings on this rail: peer interface down, wrong "
    "address, or the cable goes to another port",
    "packet_loss": "some packets were lost: a flapping link or a congested/faulty path",
    "error": "ping itself failed",
}


# Late or lost replies a passing check may have (each re-sent within the deadline).
LOSS_TOLERATED = 1
# Seconds between pings: ping's shortest for any user, and for root (iputils allows down to 0.002 s).
USER_INTERVAL_S = 0.2
ROOT_INTERVAL_S = 0.01


def parse(rc, out, err):
    """Counts, average RTT and the cause ping's own words point to (None when they point nowhere)."""
    text = "%s\n%s" % (out, err)
    result = dict(transmitted=None, received=None, loss_percent=None, rtt_avg_ms=None, cause=None)
    stats = _STATS.search(text)
    if stats:
        result.update(transmitted=int(stats.group(1)), received=int(stats.group(2)), loss_percent=float(stats.group(4)))
    rtt = _RTT.search(text)
    if rtt:
        result["rtt_avg_ms"] = float(rtt.group(1))
    lowered = text.lower()
    if rc == 0 and result["received"]:
        # rc 0 under -w: count replies came. ping kept sending every interval until then, so requests still in
        # flight (a slow peer: a 31 ms round trip at 10 ms apart leaves two) count in its "packet loss". Lost are
        # only those unanswered below the highest answered icmp_seq. One is a peer just brought up; more is loss.
        seqs = {int(seq) for seq in _REPLY_SEQ.findall(out)}
        if seqs and max(seqs) > 0:
            lost = max(seqs) - len(seqs)
            result["loss_percent"] = round(100.0 * lost / max(seqs), 4)
        else:
            lost = result["transmitted"] - result["received"]
        result["cause"] = "packet_loss" if lost > LOSS_TOLERATED else None
    elif "message too long" in lowered or "frag needed" in lowered:
        result["cause"] = "mtu_mismatch"
    elif "network is unreachable" in lowered or "no route to host" in lowered:
        result["cause"] = "no_route"
    elif stats is None:
        result["cause"] = "error"
    elif result["received"]:
        result["cause"] = "packet_loss"
    return result


def evidence(out, err):
    """The lines of ping's output that say what went wrong (errors, ICMP replies from routers)."""
    lines = [line.strip() for line in ("%s\n%s" % (out, err)).splitlines()]
    picked = [line for line in lines if line.startswith(("ping:", "From "))]
    return "; ".join(dict.fromkeys(picked))


HEADERS = 28  # IPv4 header 20 + ICMP header 8: a DF ping of (MTU - 28) bytes fills one frame


class RailPinger:
    """Don't-fragment pings from one interface to one peer, with the likely cause of a failure.

    ip is an _netif.IpRoute, read for the link state when the pings are lost silently.
    """

    def __init__(self, module, count, timeout, ip):
        self.module = module
        self.count = count
        self.timeout = timeout
        self.ip = ip
        self.ping_bin = module.get_bin_path("ping", required=True)

    def ping(self, interface, peer, payload=None):
        argv = [self.ping_bin]
        if payload is not None:
            argv += ["-M", "do", "-s", str(payload)]
        # 0.2 s between pings, the shortest ping allows any user; as root (the deploy's modules) 0.01 s, so
        # the check costs the round trips, not 0.4 s. With -c alone a reply later than ping's short linger
        # after the last send counts as lost; with -w ping sends until it has count replies or the deadline
        # passes (parse() tolerates LOSS_TOLERATED re-sends).
        interval = ROOT_INTERVAL_S if os.geteuid() == 0 else USER_INTERVAL_S
        deadline = self.timeout + math.ceil(interval * self.count)
        argv += [
            "-c",
            str(self.count),
            "-i",
            str(interval),
            "-W",
            str(self.timeout),
            "-w",
            str(deadline),
            "-I",
            interface,
            peer,
        ]
        return self.module.run_command(argv, environ_update=C_LOCALE)

    @staticmethod
    def in_subnet(state, peer):
        if not HAS_NETADDR:
            return True  # cannot tell; the small ping decides
        return any(netaddr.IPAddress(peer) in netaddr.IPNetwork(address) for address in state["addresses"])

    def diagnose(self, interface, peer, state):
        """The cause of a silent total loss, from the link, the subnet and a small ping."""
        if state is None or not state["carrier"] or not state["up"]:
            return "link_down"
        if not self.in_subnet(state, peer):
            return "no_route"
        rc, _out, _err = self.ping(interface, peer)
        return "mtu_mismatch" if rc == 0 else "peer_unreachable"

    def check(self, rail, peer, payload):
        """One rail's DF ping to one peer: {rail, interface, peer, ok, cause, message, loss_percent, rtt_avg_ms}."""
        interface = rail["interface"]
        name = rail.get("name") or interface
        rc, out, err = self.ping(interface, peer, payload)
        verdict = parse(rc, out, err)
        if rc != 0 and verdict["cause"] is None:
            verdict["cause"] = self.diagnose(interface, peer, self.ip.state(interface))
        ok = rc == 0 and verdict["cause"] is None
        message = ""
        if not ok:
            seen = evidence(out, err)
            message = "rail %s (%s) -> %s: %s%s" % (
                name,
                interface,
                peer,
                CAUSES[verdict["cause"]],
                " [ping: %s]" % seen if seen else "",
            )
        return dict(
            rail=name,
            interface=interface,
            peer=peer,
            ok=ok,
            cause=None if ok else verdict["cause"],
            message=message,
            loss_percent=verdict["loss_percent"],
            rtt_avg_ms=verdict["rtt_avg_ms"],
        )

    def check_all(self, rails, payload):
        """Every rail's DF ping to each of its peers at once (each ping waits on the wire, not the CPU)."""
        pairs = [(rail, peer) for rail in rails for peer in rail["peers"]]
        if len(pairs) < 2:
            return [self.check(rail, peer, payload) for rail, peer in pairs]
        with ThreadPoolExecutor(max_workers=min(len(pairs), 16)) as pool:
            return list(pool.map(lambda pair: self.check(pair[0], pair[1], payload), pairs))
