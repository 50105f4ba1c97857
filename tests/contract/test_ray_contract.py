"""Every `ray start` flag, Ray environment variable and Ray Python API the collection uses, against real Ray."""

from __future__ import annotations

import datetime
import json
import subprocess

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_env, _ray

BASE = dict(
    ray_port=6379,
    node_ip="198.18.100.11",
    gpus=1,
    declared_gpus=None,
    num_cpus=None,
    include_dashboard=False,
    dashboard_host="198.18.100.11",
    dashboard_port=8265,
    head_address="198.18.100.11",
)

# The lab's pinned agent ports (inventories/lab/group_vars/spark/monitoring.yml).
AGENT_PORTS = dict(dashboard_agent_listen_port=52365, dashboard_agent_grpc_port=52366, runtime_env_agent_port=52367)

# Click parses every option before it runs the eager --help: an option Ray does not have fails with
# "No such option" (exit 2) before help is printed.
CLICK_PARSE = r"""
import json, sys
from click.testing import CliRunner
from ray.scripts.scripts import start
runs = []
for argv in json.loads(sys.argv[1]):
    res = CliRunner().invoke(start, argv + ["--help"])
    runs.append({"argv": argv, "exit": res.exit_code, "out": res.output[-400:]})
print(json.dumps(runs))
"""


def _argvs():
    head = dict(BASE, role="head")
    head_dash = dict(head, include_dashboard=True, num_cpus=2, metrics_export_port=8080, **AGENT_PORTS)
    worker = dict(BASE, role="worker", node_ip="198.18.100.12", declared_gpus=1)
    return [_ray.ray_start_argv(p)[2:] for p in (head, head_dash, worker)]


def test_every_ray_start_flag_parses_in_real_ray(in_image_json):
    argvs = _argvs()
    assert [a for argv in argvs for a in argv if a.startswith("--metrics-export")] == ["--metrics-export-port=8080"]
    assert [a for argv in argvs for a in argv if "agent" in a] == [
        "--dashboard-agent-listen-port=52365",
        "--dashboard-agent-grpc-port=52366",
        "--runtime-env-agent-port=52367",
    ]
    runs = in_image_json(CLICK_PARSE, json.dumps(argvs))
    for run in runs:
        assert run["exit"] == 0, "ray start refused %s: %s" % (run["argv"], run["out"])
        assert "Show this message and exit." in run["out"]


def test_an_unknown_ray_start_flag_is_refused(in_image_json):
    # The check above can fail: real Ray refuses what it does not know.
    runs = in_image_json(CLICK_PARSE, json.dumps([["--head", "--num-gpu=1"]]))
    assert runs[0]["exit"] == 2
    assert "No such option" in runs[0]["out"]


# A real one-node Ray cluster in the image (loopback: the container has no network), then the wait's own
# query (_ray.RAY_QUERY) run against it, in watch mode, as ray_cluster_wait runs it in the head container.
LIVE_QUERY = r"""
import json, os, subprocess, sys, time
before_ms = int(time.time() * 1000)
ray = os.path.join(os.path.dirname(sys.executable), "ray")
start = [ray, "start", "--head", "--node-ip-address=127.0.0.1", "--num-gpus=1", "--disable-usage-stats",
         "--include-dashboard=false"]
started = subprocess.run(start, capture_output=True, text=True)
try:
    query = subprocess.run([sys.executable, "-c"] + sys.argv[1:], capture_output=True, text=True, timeout=120)
finally:
    subprocess.run([ray, "stop", "--force"], capture_output=True)
import ray as ray_pkg
print(json.dumps({"version": ray_pkg.__version__, "before_ms": before_ms,
                  "start": started.returncode, "start_err": started.stderr[-1500:],
                  "rc": query.returncode, "out": query.stdout, "err": query.stderr[-3000:]}))
"""


def docker_time(ms):
    """Milliseconds since the epoch written as Docker writes State.StartedAt (RFC 3339, UTC, nanoseconds)."""
    at = datetime.datetime.fromtimestamp(ms // 1000, datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + "%03d000000Z" % (ms % 1000)


def test_the_wait_query_reads_a_real_ray_cluster(in_image_json):
    # As the module asks while it watches: the expected IPs, GPUs and each node's earliest start ({} here).
    got = in_image_json(LIVE_QUERY, _ray.RAY_QUERY, "30", "10", json.dumps(["127.0.0.1"]), "1.0", "{}", timeout=300)
    assert got["version"] == "2.60.0"
    assert got["start"] == 0, got["start_err"]
    assert got["rc"] == 0, got["err"]
    doc = _ray.parse_query_output(got["out"])
    state = _ray.cluster_state(doc)
    assert [(n["ip"], n["gpus"]) for n in state["alive"]] == [("127.0.0.1", 1.0)]
    done, summary = _ray.compare(state, [{"host": "spark-1", "ip": "127.0.0.1"}], 1)
    assert done, summary
    # The raylet's start time is on the node's wall clock, after its container (here: this script) started:
    # a node restarted at `before` is fresh; one whose container started after the raylet is stale.
    node_ms = state["alive"][0]["start_ms"]
    assert got["before_ms"] <= node_ms <= got["before_ms"] + 120000
    started = docker_time(got["before_ms"])
    assert _ray.docker_time_ms(started) == got["before_ms"]
    done, summary = _ray.compare(state, [{"host": "spark-1", "ip": "127.0.0.1", "started_at": started}], 1)
    assert done and summary["stale"] == [], summary
    later = docker_time(node_ms + 1000)
    done, summary = _ray.compare(state, [{"host": "spark-1", "ip": "127.0.0.1", "started_at": later}], 1)
    assert not done and summary["stale"] == [{"host": "spark-1", "ip": "127.0.0.1"}], summary


# A head and a worker node in one container; the worker's raylet SIGKILLed (its container killed) and a new
# worker started at the same address (the container started again), each node table read with the wait's own
# query. Prints the tables with the time of the restart.
RESTARTED_WORKER = r"""
import json, os, signal, socket, subprocess, sys, time
ray = os.path.join(os.path.dirname(sys.executable), "ray")
def run(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True).returncode
def table():
    out = subprocess.run([sys.executable, "-c", sys.argv[1], "10"], capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
def raylets():
    found = []
    for pid in os.listdir("/proc"):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"/raylet"):
            found.append(int(pid))
    return sorted(found)
ip = socket.gethostbyname(socket.gethostname())
worker = [ray, "start", "--address=%s:6379" % ip, "--node-ip-address=" + ip, "--num-gpus=1", "--disable-usage-stats"]
got = {"ip": ip, "head": run(ray, "start", "--head", "--node-ip-address=" + ip, "--port=6379", "--num-gpus=1",
                             "--disable-usage-stats", "--include-dashboard=false")}
head_raylet = raylets()
got["worker"] = run(*worker)
deadline = time.time() + 60
while len([n for n in table()["nodes"] if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.2)
for pid in set(raylets()) - set(head_raylet):
    os.kill(pid, signal.SIGKILL)
got["restart_ms"] = int(time.time() * 1000)
got["right_after"] = table()
got["again"] = run(*worker)
got["tables"] = []
while time.time() < deadline + 60:
    doc = table()
    got["tables"].append([int(time.time() * 1000), doc])
    workers = [n for n in doc["nodes"] if "node:__internal_head__" not in n["Resources"]]
    if [n["StartTimeMs"] >= got["restart_ms"] for n in workers if n["Alive"]] == [True] and len(workers) == 2:
        break
    time.sleep(0.5)
run(ray, "stop", "--force")
print(json.dumps(got))
"""


def bridged_json(image, script, *args):
    """Run a script in a container of the image on Docker's bridge network (its own address, as a Spark's fabric
    IP); return the JSON document of its last line."""
    res = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint=python3", image, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_restarted_workers_old_node_is_seen_as_stale_until_ray_drops_it(engine_image):
    # Bridge networking: each node registers with the container's own address, as a Spark's with its fabric IP.
    got = bridged_json(engine_image, RESTARTED_WORKER, _ray.RAY_QUERY)
    assert got["head"] == 0 and got["worker"] == 0 and got["again"] == 0, got
    restarted = docker_time(got["restart_ms"])

    def worker_state(doc):
        workers = [n for n in doc["nodes"] if "node:__internal_head__" not in n["Resources"]]
        return _ray.cluster_state({"nodes": workers})

    plain = [{"host": "spark-2", "ip": got["ip"]}]
    timed = [{"host": "spark-2", "ip": got["ip"], "started_at": restarted}]
    # Right after the kill, Ray still lists the killed worker alive: by address alone the wait would be done.
    first = worker_state(got["right_after"])
    assert first["alive_nodes"] == 1 and first["alive"][0]["start_ms"] < got["restart_ms"], got["right_after"]
    assert _ray.compare(first, plain, 1)[0]
    done, summary = _ray.compare(first, timed, 1)
    assert not done and summary["stale"] == [{"host": "spark-2", "ip": got["ip"]}], summary
    # With its container's start time, the wait is done only once Ray dropped the old node and the new one
    # registered: the last table read.
    verdicts = [_ray.compare(worker_state(doc), timed, 1)[0] for _ms, doc in got["tables"]]
    assert verdicts[-1] and not any(verdicts[:-1]), [(ms - got["restart_ms"], d) for (ms, d) in got["tables"]]
    dropped_after_s = (got["tables"][-1][0] - got["restart_ms"]) / 1000
    print("Ray listed the killed worker alive for about %.1f s after its restart" % dropped_after_s)


# A watch that never completes (a second node expected) against a real one-node Ray, then the wait's stop
# (_ray.STOP_WATCH) run beside it, as ray_cluster_wait runs both in the head container when a worker fails.
STOPPED_WATCH = r"""
import json, os, subprocess, sys, time
query, stop = sys.argv[1], sys.argv[2]
ray = os.path.join(os.path.dirname(sys.executable), "ray")
started = subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", "--num-gpus=1",
                          "--disable-usage-stats", "--include-dashboard=false"], capture_output=True, text=True)
try:
    watch = subprocess.Popen([sys.executable, "-c", query, "10", "60", json.dumps(["127.0.0.1", "127.0.0.2"]),
                              "2.0", "{}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    running = watch.poll() is None
    began = time.monotonic()
    stopper = subprocess.run([sys.executable, "-c", stop, query], capture_output=True, text=True, timeout=60)
    rc = watch.wait(60)
    ended_s = time.monotonic() - began
finally:
    subprocess.run([ray, "stop", "--force"], capture_output=True)
print(json.dumps({"start": started.returncode, "start_err": started.stderr[-1500:], "running": running,
                  "stopper": stopper.returncode, "stopper_err": stopper.stderr[-1500:], "rc": rc,
                  "ended_s": ended_s, "err": watch.stderr.read()[-1500:]}))
"""


def test_a_watch_on_a_real_ray_is_ended_by_the_waits_stop(in_image_json):
    got = in_image_json(STOPPED_WATCH, _ray.RAY_QUERY, _ray.STOP_WATCH, timeout=300)
    assert got["start"] == 0, got["start_err"]
    assert got["running"], got["err"]
    assert got["stopper"] == 0, got["stopper_err"]
    assert got["rc"] == -15 and got["ended_s"] < 5, got


def test_the_one_read_before_a_watchdog_restart_counts_the_alive_gpus(in_image_json):
    # As vllm_serve asks before it restarts a failed engine over Ray (check_ray_gpus_alive): one read, no watch.
    got = in_image_json(LIVE_QUERY, _ray.RAY_QUERY, "10", timeout=300)
    assert got["start"] == 0, got["start_err"]
    assert got["rc"] == 0, got["err"]
    state = _ray.cluster_state(_ray.parse_query_output(got["out"]))
    assert state["gpus"] == 1.0 and [n["ip"] for n in state["alive"]] == ["127.0.0.1"]


def test_the_wait_query_names_a_missing_ray(in_image):
    # Without a running Ray, the query fails with Ray's own message, which the wait reports as its last error.
    rc, _out, err = in_image(_ray.RAY_QUERY, "10")
    assert rc != 0
    assert "Could not find any running Ray instance" in err


RAY_CONFIG = r"""
import glob, json, os, ray
lib = glob.glob(os.path.join(os.path.dirname(ray.__file__), "_raylet*.so"))[0]
data = open(lib, "rb").read()
print(json.dumps({name: name.encode() in data for name in __import__("sys").argv[1:]}))
"""


@pytest.mark.parametrize(
    "variable",
    sorted(
        k
        for k in _nccl_env.build_env(
            [{"name": "enp1s0f1np1", "address": "198.18.100.11/24"}], "198.18.100.11", allow_socket_fallback=True
        )[0]
        if k.startswith("RAY_")
    ),
)
def test_ray_config_variables_exist_in_real_ray(in_image_json, variable):
    # RAY_<name> overrides the raylet's compiled-in config entry <name> (ray_config_def.h).
    found = in_image_json(RAY_CONFIG, variable[len("RAY_") :])
    assert found[variable[len("RAY_") :]], "%s: Ray %s has no config entry of that name" % (variable, "2.60.0")


# A head started with the collection's own `ray start` line (ray_start_argv, without --block) at the container's
# address, as a Spark's at its fabric IP; then what listens (/proc/net/tcp) and the metrics agent's Prometheus
# text at --metrics-export-port, read until the node's own metrics are in it.
METRICS_AGENT = r"""
import json, os, socket, subprocess, sys, time, urllib.request
ip = socket.gethostbyname(socket.gethostname())
argv = [a.replace("NODE_IP", ip) for a in json.loads(sys.argv[1]) if a != "--block"]
argv[0] = os.path.join(os.path.dirname(sys.executable), "ray")
started = subprocess.run(argv, capture_output=True, text=True)
def listening():
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(name).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                addr, port = f[1].split(":")
                found.append([addr, int(port, 16)])
    return found
body, deadline = "", time.time() + 90
while "ray_node_" not in body and time.time() < deadline:
    try:
        body = urllib.request.urlopen("http://%s:%s/metrics" % (ip, sys.argv[2]), timeout=5).read().decode()
    except OSError:
        time.sleep(1)
got = {"start": started.returncode, "err": started.stderr[-1500:], "ip": ip, "listening": listening(),
       "metrics": sorted({l.split("{")[0].split(" ")[0] for l in body.splitlines() if l.startswith("ray_")})}
subprocess.run([argv[0], "stop", "--force"], capture_output=True)
print(json.dumps(got))
"""


def test_the_metrics_agent_serves_every_nodes_ray_metrics_on_the_pinned_ports(engine_image):
    head = dict(BASE, role="head", node_ip="NODE_IP", metrics_export_port=8080, **AGENT_PORTS)
    got = bridged_json(engine_image, METRICS_AGENT, json.dumps(_ray.ray_start_argv(head)), "8080")
    assert got["start"] == 0, got["err"]
    # Only ray[default]'s agent serves these: plain ray has no metrics agent (the monitoring role's `ray` job).
    assert {"ray_node_cpu_utilization", "ray_node_mem_used"} <= set(got["metrics"]), got["metrics"]
    ports = {port for _addr, port in got["listening"]}
    assert {8080, *AGENT_PORTS.values()} <= ports, got["listening"]
    assert 8265 not in ports, "the dashboard listens with --include-dashboard=false: %s" % got["listening"]
