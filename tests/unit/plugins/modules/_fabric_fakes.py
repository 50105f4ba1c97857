"""Recorded ip/ping outputs served in place of run_command, for the fabric module tests."""

from __future__ import annotations

import copy
import json

from ansible.module_utils import basic
from module_runner import fixture_text


def recorded(kind, name):
    """(rc, stdout, stderr) of one recorded run under tests/unit/fixtures/<kind>/."""
    return (
        int(fixture_text(kind, name + ".rc")),
        fixture_text(kind, name + ".stdout"),
        fixture_text(kind, name + ".stderr"),
    )


class FakeHost:
    """An interface whose `ip -j addr show` starts as a recorded output and follows the ip changes made."""

    def __init__(self, monkeypatch, fixture="addr_none", binaries=("ip", "ping"), missing=False):
        self.link = None if missing else json.loads(fixture_text("ip", fixture + ".stdout"))[0]
        self.calls = []
        self.ping_results = {}
        self.netplan_generate = (0, "", "")
        monkeypatch.setattr(basic.AnsibleModule, "run_command", self.run_command)
        monkeypatch.setattr(
            basic.AnsibleModule,
            "get_bin_path",
            lambda _self, name, required=False, opt_dirs=None: "/usr/bin/" + name if name in binaries else None,
        )

    def changes(self):
        return [call for call in self.calls if "show" not in call and call[0] != "/usr/bin/ping"]

    def run_command(self, args, environ_update=None, **_kwargs):
        # Patched onto AnsibleModule as a bound method of this fake: no module argument.
        assert isinstance(args, list), "commands are argument lists, never shell strings"
        assert environ_update["LC_ALL"] == "C"
        self.calls.append(args)
        tool, rest = args[0].rsplit("/", 1)[1], args[1:]
        if tool == "ping":
            return self.ping_results[(args[-2], args[-1], "-M" in args)]
        if tool == "netplan":
            return self.netplan_generate if rest[0] == "generate" else (0, "", "")
        return self.ip(rest)

    def ip(self, rest):
        if rest[:3] == ["-j", "addr", "show"]:
            if self.link is None:
                return recorded("ip", "addr_missing")
            return 0, json.dumps([self.link]), ""
        if rest[:2] == ["link", "set"] and rest[4] == "mtu":
            self.link["mtu"] = int(rest[5])
        elif rest[:2] == ["link", "set"] and rest[4] == "up":
            self.link["flags"] = ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]
        elif rest[:2] == ["addr", "replace"]:
            local, prefix = rest[2].split("/")
            entry = {"family": "inet", "local": local, "prefixlen": int(prefix), "scope": "global"}
            self.link["addr_info"] = [a for a in self.link["addr_info"] if a.get("local") != local] + [entry]
        elif rest[:2] == ["addr", "del"]:
            local = rest[2].split("/")[0]
            self.link["addr_info"] = [a for a in self.link["addr_info"] if a.get("local") != local]
        else:
            raise AssertionError("unexpected ip call %r" % rest)
        return 0, "", ""

    def snapshot(self):
        return copy.deepcopy(self.link)
