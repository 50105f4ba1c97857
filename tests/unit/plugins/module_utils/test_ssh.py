"""_ssh: the one node-to-node ssh command line."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _ssh


def test_client_argv_uses_the_key_alone_and_never_prompts():
    argv = _ssh.client_argv("/usr/bin/ssh", "/root/.ssh/k")
    assert argv[:3] == ["/usr/bin/ssh", "-i", "/root/.ssh/k"]
    assert {"BatchMode=yes", "IdentitiesOnly=yes", "ConnectTimeout=5"} <= set(argv)
    assert not any(a.startswith(("StrictHostKeyChecking", "UserKnownHostsFile")) for a in argv)


def test_client_argv_first_contact_options():
    argv = _ssh.client_argv("ssh", "k", known_hosts="/root/.ssh/known_hosts", accept_new=True, connect_timeout=10)
    assert {
        "StrictHostKeyChecking=accept-new",
        "UserKnownHostsFile=/root/.ssh/known_hosts",
        "ConnectTimeout=10",
    } <= set(argv)


def test_destination_brackets_ipv6_for_rsync():
    assert _ssh.destination("root", "198.18.100.12") == "root@198.18.100.12"
    assert _ssh.destination("spark", "fd00::12") == "spark@[fd00::12]"


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs the ssh client")
def test_the_checks_key_exchange_leads_the_defaults_and_keeps_them():
    # The real client's resolved settings (ssh -G connects nowhere).
    def kex(*options):
        out = subprocess.run(["ssh", "-G", *options, "root@198.18.130.12"], capture_output=True, text=True, check=True)
        return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("kexalgorithms "))

    default, check = kex().split(","), kex(*_ssh.CHECK_OPTIONS).split(",")
    assert check[0] == "curve25519-sha256"
    assert sorted(check) == sorted(default)
