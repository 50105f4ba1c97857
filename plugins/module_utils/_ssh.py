# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The head's node-to-node SSH (private): one client command line and one reachability check.

Preflight (its fast path and its final check), the stage probe and the model sync all go through
here, so the options a node-to-node connection uses are written once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ansible_collections.dgx_spark.vllm.plugins.module_utils._netif import C_LOCALE


def client_argv(ssh, key, known_hosts=None, accept_new=False, connect_timeout=5):
    """ssh's argv up to the destination: the key only, never a prompt."""
    argv = [ssh, "-i", key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
    argv += ["-o", "ConnectTimeout=%d" % connect_timeout]
    if accept_new:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    if known_hosts:
        argv += ["-o", "UserKnownHostsFile=%s" % known_hosts]
    return argv


def destination(user, address):
    """user@address for an rsync remote path: an IPv6 address in brackets, as rsync wants it."""
    return "%s@%s" % (user, "[%s]" % address if ":" in address else address)


# The reachability check carries no data: it puts the classical key exchange first (half the handshake's
# time on a loaded node). `^` only reorders the defaults, so a server that allows only others still agrees.
CHECK_OPTIONS = ("-o", "KexAlgorithms=^curve25519-sha256")


def unreachable(module, key, user, addresses):
    """One line per address that `ssh user@address true` with this key alone does not reach."""
    ssh = module.get_bin_path("ssh")
    if not ssh:
        return ["ssh is missing on this node"]

    def attempt(address):
        argv = [*client_argv(ssh, key), *CHECK_OPTIONS, "%s@%s" % (user, address), "true"]
        rc, _out, err = module.run_command(argv, environ_update=C_LOCALE)
        if rc == 0:
            return None
        return "ssh %s@%s with %s fails (%s)" % (user, address, key, err.strip()[-160:] or "rc %d" % rc)

    if not addresses:
        return []
    with ThreadPoolExecutor(max_workers=min(len(addresses), 16)) as pool:
        return [problem for problem in pool.map(attempt, addresses) if problem]
