"""_ssh: the one node-to-node ssh command line."""

from __future__ import annotations

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
