"""fabric_check on recorded ping runs (iputils, network namespaces on 198.18.0.0/15)."""

from __future__ import annotations

import pytest
from _fabric_fakes import FakeHost, recorded
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _ping
from ansible_collections.dgx_spark.vllm.plugins.modules import fabric_check
from module_runner import run_module

IF0, IF1 = "enp1s0f1np1", "enP2p1s0f1np1"
PEER0, PEER1 = "198.18.100.12", "198.18.101.12"


def one_rail(**extra):
    base = dict(rails=[dict(interface=IF0, peers=[PEER0])], mtu=9000, count=3, timeout=1)
    base.update(extra)
    return base


def host_with(monkeypatch, fixture, big, small=None, *, peer=PEER0):
    host = FakeHost(monkeypatch, fixture)
    host.ping_results[(IF0, peer, True)] = recorded("ping", big)
    if small:
        host.ping_results[(IF0, peer, False)] = recorded("ping", small)
    return host


@pytest.mark.parametrize(("euid", "interval"), [(0, "0.01"), (1000, "0.2")])
def test_all_rails_answer(monkeypatch, euid, interval):
    # Root sends the pings 10 ms apart; any other user at ping's shortest, 0.2 s.
    monkeypatch.setattr("os.geteuid", lambda: euid)
    host = host_with(monkeypatch, "addr_configured", "ping_ok")
    host.ping_results[(IF1, PEER1, True)] = recorded("ping", "ping_ok")
    rails = [dict(interface=IF0, peers=[PEER0]), dict(interface=IF1, peers=[PEER1], name="twin-b")]
    failed, result = run_module(monkeypatch, fabric_check, one_rail(rails=rails))
    assert not failed, result
    assert result["changed"] is False
    assert result["payload_bytes"] == 8972
    assert [(r["rail"], r["ok"], r["rtt_avg_ms"]) for r in result["results"]] == [
        (IF0, True, 0.123),
        ("twin-b", True, 0.123),
    ]
    pings = [c for c in host.calls if c[0].endswith("ping")]
    assert pings[0][1:] == ["-M", "do", "-s", "8972", "-c", "3", "-i", interval, "-W", "1", "-w", "2", "-I", IF0, PEER0]


@pytest.mark.parametrize(
    ("fixture", "pings", "peer", "cause"),
    [
        ("addr_configured", ("ping_local_mtu", None), PEER0, "mtu_mismatch"),
        ("addr_configured", ("ping_frag_needed", None), PEER0, "mtu_mismatch"),
        ("addr_configured", ("ping_peer_mtu_silent", "ping_small_ok"), PEER0, "mtu_mismatch"),
        ("addr_configured", ("ping_net_unreachable_unbound", None), PEER0, "no_route"),
        ("addr_configured", ("ping_net_unreachable", None), "198.18.77.12", "no_route"),
        ("link_no_carrier", ("ping_link_down", None), PEER0, "link_down"),
        ("addr_configured", ("ping_host_unreachable", "ping_host_unreachable"), "198.18.100.50", "peer_unreachable"),
        (
            "addr_configured",
            ("ping_destination_host_unreachable", "ping_destination_host_unreachable"),
            "198.18.100.99",
            "peer_unreachable",
        ),
    ],
)
def test_failure_names_rail_peer_and_cause(monkeypatch, fixture, pings, peer, cause):
    host = host_with(monkeypatch, fixture, *pings, peer=peer)
    if fixture == "link_no_carrier":
        host.link["addr_info"] = []
    failed, result = run_module(monkeypatch, fabric_check, one_rail(rails=[dict(interface=IF0, peers=[peer])]))
    assert failed
    assert result["results"][0]["cause"] == cause
    assert "rail %s (%s) -> %s" % (IF0, IF0, peer) in result["msg"]
    assert _ping.CAUSES[cause] in result["msg"]


def test_ping_evidence_is_quoted(monkeypatch):
    host_with(monkeypatch, "addr_configured", "ping_frag_needed")
    failed, result = run_module(monkeypatch, fabric_check, one_rail())
    assert failed
    assert "Frag needed and DF set (mtu = 1500)" in result["msg"]


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        # Recorded with -w 3: the peer dropped the first echo request (4 sent, 3 replies): a peer just up.
        ("ping_deadline_one_lost", (True, 25.0)),
        # Every second dropped (6 sent), and three of every four (9 sent): loss, although 3 replies came.
        ("ping_deadline_late_replies", (False, 50.0)),
        ("ping_deadline_lossy", (False, 66.6667)),
        # A peer answering every request after 31 ms, pings 10 ms apart: 5 sent, 3 answered, none lost (ping's
        # summary says 40% loss: two requests were still in flight).
        ("ping_deadline_slow_replies", (True, 0.0)),
    ],
)
def test_one_late_or_lost_reply_passes_more_is_loss(monkeypatch, fixture, expected):
    ok, loss = expected
    host_with(monkeypatch, "addr_configured", fixture)
    failed, result = run_module(monkeypatch, fabric_check, one_rail())
    assert failed is not ok and result["results"][0]["ok"] is ok
    assert result["results"][0]["loss_percent"] == pytest.approx(loss)
    assert result["results"][0]["cause"] == (None if ok else "packet_loss")


def test_fewer_replies_than_count_by_the_deadline_is_loss(monkeypatch):
    _rc, out, err = recorded("ping", "ping_ok")
    out = out.replace("3 received, 0% packet loss", "2 received, 33.3333% packet loss")
    host = FakeHost(monkeypatch, "addr_configured")
    # ping -w exits 1 when fewer than count replies came by the deadline.
    host.ping_results[(IF0, PEER0, True)] = (1, out, err)
    failed, result = run_module(monkeypatch, fabric_check, one_rail())
    assert failed
    assert result["results"][0]["cause"] == "packet_loss"
    assert result["results"][0]["loss_percent"] == pytest.approx(33.3333)


def test_silence_until_the_deadline_is_diagnosed_with_a_small_ping(monkeypatch):
    host_with(monkeypatch, "addr_configured", "ping_deadline_silent", "ping_small_ok")
    failed, result = run_module(monkeypatch, fabric_check, one_rail())
    assert failed and result["results"][0]["cause"] == "mtu_mismatch"


def test_check_mode_pings_too(monkeypatch):
    host_with(monkeypatch, "addr_configured", "ping_ok")
    failed, result = run_module(monkeypatch, fabric_check, one_rail(_ansible_check_mode=True))
    assert not failed
    assert result["results"][0]["ok"] is True


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (dict(mtu=9300), "mtu:"),
        (dict(rails=[dict(interface=IF0, peers=["198.18.100.12/24"])]), "rails:"),
    ],
)
def test_bad_input(monkeypatch, extra, named):
    host = host_with(monkeypatch, "addr_configured", "ping_ok")
    failed, result = run_module(monkeypatch, fabric_check, one_rail(**extra))
    assert failed
    assert named in result["msg"]
    assert not [c for c in host.calls if c[0].endswith("ping")]


def test_missing_interface(monkeypatch):
    FakeHost(monkeypatch, missing=True)
    failed, result = run_module(monkeypatch, fabric_check, one_rail())
    assert failed
    assert "does not exist" in result["msg"]


def test_parse_reads_counts():
    verdict = _ping.parse(*recorded("ping", "ping_local_mtu"))
    assert (verdict["transmitted"], verdict["received"], verdict["loss_percent"]) == (3, 0, 100.0)
    assert verdict["cause"] == "mtu_mismatch"
    assert _ping.parse(*recorded("ping", "ping_link_down"))["cause"] is None


def test_frag_needed_alone_is_an_mtu_mismatch():
    # A router's ICMP answer, before the kernel has learned the path MTU (no local error yet).
    rc, out, _err = recorded("ping", "ping_frag_needed")
    assert _ping.parse(rc, out, "")["cause"] == "mtu_mismatch"


def test_a_reply_with_a_bad_checksum_is_not_an_answer():
    # ping prints such a reply but does not count it as received. The recorded one-lost run (seq 1 dropped)
    # edited: seq 3's reply corrupted, so ping sent seq 5 for it.
    rc, out, err = recorded("ping", "ping_deadline_one_lost")
    seq3 = "icmp_seq=3 ttl=64 time=0.068 ms"
    seq4 = "8980 bytes from 198.18.100.11: icmp_seq=4 ttl=64 time=0.084 ms"
    out = out.replace(seq3, seq3 + " (BAD CHECKSUM!)")
    out = out.replace(seq4, seq4 + "\n8980 bytes from 198.18.100.11: icmp_seq=5 ttl=64 time=0.071 ms")
    out = out.replace("4 packets transmitted, 3 received, 25%", "5 packets transmitted, 3 received, 40%")
    verdict = _ping.parse(rc, out, err)
    assert verdict["cause"] == "packet_loss"
    assert verdict["loss_percent"] == pytest.approx(40.0)
