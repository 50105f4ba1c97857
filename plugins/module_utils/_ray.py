# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ray node containers and Ray cluster state (private; used by ray_node and ray_cluster_wait).

Every `ray start` flag emitted here was checked against Ray's own CLI
(python/ray/scripts/scripts.py, `start` command, Ray 2.60):

| flag                            | scripts.py `start` option                        |
| ------------------------------- | ------------------------------------------------ |
| --head                          | is_flag                                          |
| --address=HOST:PORT             | type=str, "the address to use for Ray" (workers) |
| --port=N                        | type=int, port of the head's GCS                 |
| --node-ip-address=IP            | type=str, "the IP address of this node"          |
| --num-gpus=N                    | type=int (a declaration; no device is needed)    |
| --num-cpus=N                    | type=int                                         |
| --include-dashboard=BOOL        | type=bool, default None                          |
| --dashboard-host=H              | default localhost                                |
| --dashboard-port=N              | type=int                                         |
| --metrics-export-port=N         | type=int, the metrics agent's Prometheus port    |
| --dashboard-agent-listen-port=N | type=int, the agent's HTTP port (ray[default])   |
| --dashboard-agent-grpc-port=N   | type=int, the agent's gRPC port (ray[default])   |
| --runtime-env-agent-port=N      | type=int, the runtime env agent's HTTP port      |
| --disable-usage-stats           | is_flag                                          |
| --block                         | is_flag; the container lives as long as Ray does |
"""

from __future__ import annotations

import calendar
import ipaddress
import json
import time

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _container

ROLE_LABEL = "dgx_spark.vllm.ray_role"
# `ray start` prints this line once the node's processes are up, head and worker alike.
READY_MARK = "Ray runtime started"
# A worker's `ray start --address` logs these while the head's GCS does not answer yet (it keeps
# retrying: 20 tries of about 40 s each in Ray 2.60).
GCS_UNREACHABLE_MARKS = ("Failed to connect to GCS", "Failed to get cluster ID from GCS")
# Options pinning the ports of Ray's per-node agents (ray[default] starts them; Ray picks when unset), each
# passed as the `ray start` flag of the same name: known ports are ports a firewall can name.
AGENT_PORTS = ("dashboard_agent_listen_port", "dashboard_agent_grpc_port", "runtime_env_agent_port")
# Every fixed port passed as the `ray start` flag of its name, in command-line order.
PORT_FLAGS = ("metrics_export_port", *AGENT_PORTS)


def check_params(p):
    """Return a list of 'parameter: problem; fix' strings (empty when the input is good)."""
    errors = []
    try:
        ipaddress.ip_address(p["node_ip"])
    except ValueError:
        errors.append(
            "node_ip: %r is not an IP address; pass this node's fabric address (fact fabric_ip)" % p["node_ip"]
        )
    if p["role"] == "worker":
        head = p.get("head_address") or ""
        host, _sep, port = head.rpartition(":") if head.count(":") == 1 else (head, "", "")
        if not host:
            errors.append("head_address: required for a worker; pass the head's fabric IP (optionally IP:PORT)")
        elif port and not port.isdigit():
            errors.append("head_address: %r has a port that is not a number; use HOST or HOST:PORT" % head)
    for key in ("ray_port", "dashboard_port", *PORT_FLAGS):
        if p.get(key) is not None and not 0 < p[key] < 65536:
            errors.append("%s: %s is not a TCP port; use 1..65535 (Ray's default is 6379)" % (key, p[key]))
    for key in ("declared_gpus", "num_cpus"):
        if p.get(key) is not None and p[key] < 0:
            errors.append("%s: must be 0 or more, got %s" % (key, p[key]))
    errors += _container.contract_problems(p)
    return errors


def head_address(p):
    head = p["head_address"]
    if head.count(":") == 1:
        return head
    if ":" in head:  # an IPv6 literal
        return "[%s]:%d" % (head, p["ray_port"])
    return "%s:%d" % (head, p["ray_port"])


def waiting_for_gcs(log):
    """True when a worker's log shows it has not reached the head's GCS yet."""
    return READY_MARK not in log and any(mark in log for mark in GCS_UNREACHABLE_MARKS)


def ray_start_argv(p):
    """The full `ray start` command line for this node."""
    gpus = p["declared_gpus"] if p.get("declared_gpus") is not None else p["gpus"]
    argv = ["ray", "start"]
    if p["role"] == "head":
        argv += ["--head", "--port=%d" % p["ray_port"]]
    else:
        argv += ["--address=%s" % head_address(p)]
    argv += ["--node-ip-address=%s" % p["node_ip"], "--num-gpus=%d" % gpus]
    if p.get("num_cpus") is not None:
        argv.append("--num-cpus=%d" % p["num_cpus"])
    for key in PORT_FLAGS:
        if p.get(key) is not None:
            argv.append("--%s=%d" % (key.replace("_", "-"), p[key]))
    if p["role"] == "head":
        if p["include_dashboard"]:
            argv += [
                "--include-dashboard=true",
                "--dashboard-host=%s" % p["dashboard_host"],
                "--dashboard-port=%d" % p["dashboard_port"],
            ]
        else:
            argv.append("--include-dashboard=false")
    argv += ["--disable-usage-stats", "--block"]
    return argv


def desired_config(p, image_id, file_env=None):
    """Everything that defines the Ray container, in a JSON-able form (hashed into a label). `file_env`:
    the entries of its env file (module option env_file); p['env'] wins over them."""
    env = dict(file_env or {}, **(p.get("env") or {}))
    # Matches --disable-usage-stats for any Ray process started inside (e.g. the vLLM driver).
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return _container.container_config(p, image_id, ray_start_argv(p), p["role"], env)


# Runs inside the head container: `python3 -c RAY_QUERY SECONDS [WATCH EXPECTED_IPS GPUS [NOT_BEFORE]]`. It
# asks the GCS for its node table directly (GcsClient, at the address `ray start --head` recorded, as
# ray.init(address='auto') finds it): no Ray driver is started, which costs seconds on a warm run.
# The alarm bounds one poll. With WATCH > 0 one exec re-reads the table every 0.1 s for up to WATCH
# seconds and stops as soon as exactly the expected IPs are alive with the expected GPUs, each node
# registered no earlier than NOT_BEFORE ({ip: ms}) gives it (only a hint to stop early: compare() below
# decides). Each node is printed with the keys of ray.nodes() (Alive, NodeManagerAddress,
# NodeManagerHostname, Resources) and StartTimeMs, the raylet's own wall clock at its start. It flushes stdout and
# leaves with os._exit: a normal exit took 0.17-0.27 s after the answer was printed (about 0.02 s with it).
RAY_QUERY = (
    "import json, os, signal, sys, time\n"
    "watch = float(sys.argv[2]) if len(sys.argv) > 4 else 0.0\n"
    "not_before = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}\n"
    "signal.alarm(int(sys.argv[1]) + int(watch))\n"
    "from ray._private.services import canonicalize_bootstrap_address_or_die\n"
    "from ray._raylet import GcsClient\n"
    "gcs = GcsClient(address=canonicalize_bootstrap_address_or_die('auto'))\n"
    "def read():\n"
    "    return [{'NodeID': i.node_id.hex(), 'Alive': i.state == 0, 'NodeManagerAddress': i.node_manager_address,\n"
    "             'NodeManagerHostname': i.node_manager_hostname, 'Resources': dict(i.resources_total),\n"
    "             'StartTimeMs': i.start_time_ms}\n"
    "            for i in gcs.get_all_node_info(timeout=int(sys.argv[1])).values()]\n"
    "end = time.monotonic() + watch\n"
    "while True:\n"
    "    nodes = read()\n"
    "    if watch <= 0 or time.monotonic() >= end:\n"
    "        break\n"
    "    alive = [n for n in nodes if n['Alive']]\n"
    "    ips = sorted(n['NodeManagerAddress'] for n in alive)\n"
    "    fresh = all(n['StartTimeMs'] >= not_before.get(n['NodeManagerAddress'], 0) for n in alive)\n"
    "    gpus = sum(float(n['Resources'].get('GPU', 0) or 0) for n in alive)\n"
    "    if ips == sorted(json.loads(sys.argv[3])) and gpus == float(sys.argv[4]) and fresh:\n"
    "        break\n"
    "    time.sleep(0.1)\n"
    "print(json.dumps({'nodes': nodes}))\n"
    "sys.stdout.flush()\n"
    "os._exit(0)\n"
)

# Runs inside the head container: `python3 -c STOP_WATCH RAY_QUERY` ends every watching RAY_QUERY there (a
# wait that stopped for another reason leaves none to run out its alarm).
STOP_WATCH = (
    "import os, signal, sys\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        with open('/proc/%s/cmdline' % pid, 'rb') as handle:\n"
    "            argv = handle.read().split(b'\\0')\n"
    "    except OSError:\n"
    "        continue\n"
    "    if argv[1:3] == [b'-c', sys.argv[1].encode()] and len(argv) > 5:\n"
    "        os.kill(int(pid), signal.SIGTERM)\n"
)


def docker_time_ms(text):
    """Milliseconds since the epoch of a time as Docker reports it (RFC 3339 in UTC, nanoseconds), or None
    for an empty or zero time."""
    if not text or text.startswith("0001-"):
        return None
    stamp, _dot, fraction = text.rstrip("Z").partition(".")
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) * 1000 + int((fraction + "000")[:3])
    except ValueError:
        return None


def not_before(expected_nodes):
    """{ip: ms} for the expected nodes whose Ray container's start time is known (option started_at): a node
    registered before it is a Ray node from before that container's last start, which Ray has not marked
    dead yet."""
    found = {}
    for node in expected_nodes:
        ms = docker_time_ms(node.get("started_at"))
        if ms is not None:
            found[node["ip"]] = ms
    return found


def parse_query_output(text):
    """The JSON document RAY_QUERY printed (the last line that parses), or None."""
    for raw in reversed((text or "").strip().splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def cluster_state(doc):
    """Alive nodes (ip, gpus, start time) and the total GPUs of the alive nodes."""
    alive = []
    for node in doc.get("nodes") or []:
        if node.get("Alive") or node.get("alive"):
            alive.append(
                {
                    "ip": node.get("NodeManagerAddress"),
                    "hostname": node.get("NodeManagerHostname"),
                    "gpus": float((node.get("Resources") or {}).get("GPU", 0) or 0),
                    "start_ms": node.get("StartTimeMs"),
                }
            )
    dead = [n.get("NodeManagerAddress") for n in doc.get("nodes") or [] if not (n.get("Alive") or n.get("alive"))]
    return {
        "alive_nodes": len(alive),
        "gpus": sum(n["gpus"] for n in alive),
        "alive": alive,
        "dead_ips": dead,
    }


def compare(state, expected_nodes, expected_gpus):
    """Return (done, summary): done when the alive set is exactly the expected one, GPUs match, and no alive
    node registered before its container's last start (a stale node: vLLM could place a worker on it)."""
    limits = not_before(expected_nodes)

    def stale(node):
        # A start time of 0 is one Ray did not set: unknown, not old.
        return bool(node["start_ms"]) and node["start_ms"] < limits.get(node["ip"], 0)

    alive_ips = [n["ip"] for n in state["alive"]]
    fresh_ips = {n["ip"] for n in state["alive"] if not stale(n)}
    stale_ips = {n["ip"] for n in state["alive"] if stale(n)}
    stale_nodes = [n for n in expected_nodes if n["ip"] in stale_ips]
    # A node only seen from before its container's start is stale, not missing; once it is gone and the new
    # one has not registered yet, it is missing.
    missing = [n for n in expected_nodes if n["ip"] not in fresh_ips | stale_ips]
    expected_ips = {n["ip"] for n in expected_nodes}
    unexpected = sorted({ip for ip in alive_ips if ip not in expected_ips})
    duplicated = sorted({ip for ip in alive_ips if alive_ips.count(ip) > 1})
    done = (
        not missing
        and not stale_nodes
        and not unexpected
        and state["alive_nodes"] == len(expected_nodes)
        and state["gpus"] == float(expected_gpus)
    )
    summary = {
        "alive_nodes": state["alive_nodes"],
        "expected_nodes": len(expected_nodes),
        "gpus": state["gpus"],
        "expected_gpus": float(expected_gpus),
        "missing": [{"host": n["host"], "ip": n["ip"]} for n in missing],
        "stale": [{"host": n["host"], "ip": n["ip"]} for n in stale_nodes],
        "unexpected_ips": unexpected,
        "duplicated_ips": duplicated,
    }
    return done, summary


def progress_line(summary):
    text = "%d/%d nodes alive, %g/%g GPUs" % (
        summary["alive_nodes"],
        summary["expected_nodes"],
        summary["gpus"],
        summary["expected_gpus"],
    )
    if summary["missing"]:
        text += "; missing %s" % ", ".join("%s (%s)" % (n["host"], n["ip"]) for n in summary["missing"])
    if summary.get("stale"):
        text += "; not yet dead in Ray: %s (registered before its Ray container last started)" % ", ".join(
            "%s (%s)" % (n["host"], n["ip"]) for n in summary["stale"]
        )
    return text


# A worker left on a head that went away exits once and its restart policy brings it back to the
# new head; restarting more often than this while waited for is a crash loop.
WORKER_RESTARTS_TOLERATED = 2
