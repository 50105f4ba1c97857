# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading iputils ping output into a verdict with a likely cause (private).

The phrases matched here are those of the recorded runs in tests/unit/fixtures/ping (iputils 20221126,
C locale).
"""

from __future__ import annotations

import re

_STATS = re.compile(r"(\d+) packets transmitted, (\d+) received(?:, \+(\d+) errors)?, ([\d.]+)% packet loss")
_RTT = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")

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
        result["cause"] = "packet_loss" if result["loss_percent"] else None
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
