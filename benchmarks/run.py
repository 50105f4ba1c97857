# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deploy and re-converge cost of the collection against a plain-shell baseline, on the bench lab.

    .venv/bin/python benchmarks/run.py [--runs N] [--only cold,warm,image,baseline]

The bench lab (benchmarks/inventory, lab_name dgx-spark-bench) must be up and deployed once:
    .venv/bin/ansible-playbook -i benchmarks/inventory playbooks/lab.yml
    .venv/bin/ansible-playbook -i benchmarks/inventory deploy-qwen35.yml

Prints a table (median, min, max over N runs) and writes the same, with every raw run, as JSON
under benchmarks/results/. Timings are measured, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
INVENTORY = os.path.join(BENCH, "inventory")
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
STATE = os.path.join(ROOT, ".lab-bench", "ssh")
# The collection under test: this tree, or --tree (e.g. an earlier commit, for a before/after).
TREE = {"root": ROOT}
HEAD, WORKER = "bench-1", "bench-2"
HEAD_MGMT, WORKER_MGMT = "198.18.30.11", "198.18.30.12"
HEAD_FABRIC, WORKER_FABRIC = "198.18.130.11", "198.18.130.12"
IMAGE = "dgx-spark/vllm-runtime:in-service"
PORT = 8000
TARGETS = {
    "warm_wall_s": "< 15 s, 0 changed",
    "cold_ratio": "<= 1.3x baseline",
    "lag_s": "< 1 s median",
    "copy_ratio": ">= 0.9x raw pipe",
    "rerun_bytes": "0",
}


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# ---------------------------------------------------------------- controller memory
def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _tree_rss(root):
    """Sum of RSS (bytes) of root and its descendants; the largest single process."""
    total, largest, todo = 0, 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/statm" % pid, encoding="ascii") as handle:
                rss = int(handle.read().split()[1]) * page
        except OSError:
            continue
        total += rss
        largest = max(largest, rss)
        todo.extend(_children(pid))
    return total, largest


class MemorySampler(threading.Thread):
    def __init__(self, pid, interval=0.2):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_total = self.peak_single = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            total, largest = _tree_rss(self.pid)
            self.peak_total = max(self.peak_total, total)
            self.peak_single = max(self.peak_single, largest)
            self.done.wait(self.interval)


# ---------------------------------------------------------------- health poller
# Runs on the head node (vllm serve binds the fabric address, which only the nodes reach) from the
# management address, so its requests are told apart from the collection's in the server's log.
POLL_SCRIPT = """
import http.client, sys, time
url_host, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = None
end = time.time() + 600
while time.time() < end and (first is None or time.time() < first + 3):
    sent = time.time()
    try:
        conn = http.client.HTTPConnection(url_host, port, timeout=1, source_address=(source, 0))
        conn.request("GET", "/health")
        code = conn.getresponse().status
        conn.close()
    except Exception:
        code = 0
    print(sent, time.time(), code, flush=True)
    if code == 200 and first is None:
        first = time.time()
    time.sleep(0.02)
"""


class HealthPoller:
    """Polls the head's /health every 20 ms from the head itself; each request's times and code."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(
            ["docker", "exec", HEAD, "python3", "-u", "-c", POLL_SCRIPT, HEAD_FABRIC, str(PORT), HEAD_MGMT],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def stop(self):
        try:
            out = self.proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out = self.proc.communicate()[0]
        for line in out.splitlines():
            sent, recv, code = line.split()
            self.samples.append((float(sent), float(recv), int(code)))

    def first_200(self):
        return next((s for s in self.samples if s[2] == 200), None)


# ---------------------------------------------------------------- running things
def env():
    out = dict(os.environ)
    out.update(
        ANSIBLE_COLLECTIONS_PATH=os.path.join(TREE["root"], "build", "collections"),
        ANSIBLE_CALLBACK_PLUGINS=os.path.join(BENCH, "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="bench_timer",
        ANSIBLE_SSH_EXECUTABLE=os.path.join(BENCH, "ssh-count"),
        ANSIBLE_NOCOLOR="1",
    )
    return out


def playbook(path, *args, label=""):
    """Run ansible-playbook against the bench lab; wall time, recap, SSH round trips, peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        e = env()
        e["BENCH_TIMER_OUT"] = os.path.join(tmp, "timer.json")
        e["BENCH_SSH_LOG"] = os.path.join(tmp, "ssh.log")
        argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, os.path.join(TREE["root"], path), *args]
        start = time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = MemorySampler(proc.pid)
        sampler.start()
        output = proc.communicate()[0]
        wall = time.time() - start
        sampler.done.set()
        sampler.join()
        if proc.returncode != 0:
            log("%s %s failed (rc %s):\n%s" % (path, label, proc.returncode, output[-4000:]))
            raise SystemExit(1)
        with open(e["BENCH_TIMER_OUT"], encoding="utf-8") as handle:
            timer = json.load(handle)
        ssh_calls = 0
        if os.path.exists(e["BENCH_SSH_LOG"]):
            with open(e["BENCH_SSH_LOG"], encoding="utf-8") as handle:
                ssh_calls = len(handle.readlines())
    tasks = timer["tasks"]
    return dict(
        wall=round(wall, 2),
        changed=sum(r["changed"] for r in timer["recap"].values()),
        recap=timer["recap"],
        tasks_x_hosts=sum(t["executions"] for t in tasks if t["remote"]),
        ssh_processes=ssh_calls,
        peak_rss_mb=round(sampler.peak_total / 2**20, 1),
        peak_single_rss_mb=round(sampler.peak_single / 2**20, 1),
        timer=tasks,
        started=start,
    )


def node_sh(node, script, check=True):
    """A command inside one of this lab's node containers (the outer engine's exec: no SSH, untimed)."""
    res = subprocess.run(["docker", "exec", node, "sh", "-c", script], capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise RuntimeError("%s: %s failed: %s" % (node, script, res.stderr.strip()))
    return res.stdout


def teardown():
    playbook("playbooks/teardown.yml", label="teardown")


def baseline_env():
    e = dict(os.environ)
    e.update(
        HEAD=HEAD_MGMT,
        WORKER=WORKER_MGMT,
        HEAD_IP=HEAD_FABRIC,
        WORKER_IP=WORKER_FABRIC,
        SSH_KEY=os.path.join(STATE, "id_ed25519"),
        KNOWN_HOSTS=os.path.join(STATE, "known_hosts"),
        IMAGE=IMAGE,
    )
    return e


def task(run, name, host):
    return next((t for t in run["timer"] if t["task"].endswith(name) and t["host"] == host), None)


GCS_REGISTER = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Registering new node\..*node_address=(\S+)")


def last_join():
    """Wall-clock time the GCS registered the last node (the head's gcs_server.out)."""
    text = node_sh(HEAD, "docker exec ray-head sh -c 'cat /tmp/ray/session_latest/logs/gcs_server.out'")
    times = [m.group(1) for m in map(GCS_REGISTER.match, text.splitlines()) if m]
    stamp = datetime.strptime(times[-1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
    return stamp.timestamp(), len(times)


def health_notice(poller):
    """When the collection's own first 200 from /health reached the server, bracketed by the poller.

    The stand-in logs every request in order, without times; the poller asks from the head's
    management address, the collection from elsewhere. The collection's first 200 lies between the
    poller requests logged just before and just after it: the one before bounds it from below.
    """
    text = node_sh(HEAD, "docker exec ray-head cat /tmp/dgx-spark-vllm-serve.log")
    mine = 0
    for line in text.splitlines():
        if '"GET /health' not in line:
            continue
        client = line.split(" - ")[0].split()[-1]
        if client == HEAD_MGMT:
            mine += 1
        elif '" 200 ' in line:
            break
    served = [s for s in poller.samples if s[2] != 0]  # requests that reached the server
    if mine == 0 or mine > len(served):
        return None
    return served[mine - 1][1]


# ---------------------------------------------------------------- scenarios
def run_cold():
    teardown()
    poller = HealthPoller()
    run = playbook("deploy-qwen35.yml", label="cold")
    poller.stop()
    joined, nodes = last_join()
    wait = task(run, "the expected Ray nodes and GPUs", HEAD)
    first = poller.first_200()
    notice = health_notice(poller)
    run.update(
        ray_lag=round(wait["end"] - joined, 2) if wait else None,
        ray_nodes_registered=nodes,
        health_lag=round(notice - first[1], 2) if first and notice else None,
    )
    return run


def run_baseline():
    teardown()
    e = baseline_env()
    start = time.time()
    res = subprocess.run([os.path.join(BENCH, "baseline.sh")], env=e, capture_output=True, text=True, check=False)
    wall = time.time() - start
    if res.returncode != 0:
        log("baseline failed: %s %s" % (res.stdout, res.stderr))
        raise SystemExit(1)
    subprocess.run([os.path.join(BENCH, "baseline.sh"), "down"], env=e, check=True)
    return dict(wall=round(wall, 2), output=res.stdout.strip())


def image_id(node):
    return node_sh(node, "docker image inspect --format '{{.Id}}' %s" % IMAGE, check=False).strip()


def run_image():
    teardown()  # the containers hold the image on the worker
    node_sh(WORKER, "docker rmi -f %s >/dev/null" % image_id(WORKER), check=False)
    copy = playbook("deploy-qwen35.yml", "--tags", "fabric,runtime_image", label="image copy")
    step = task(copy, "stream to the other nodes", HEAD)
    peer = step["result"]["peers"][0]
    size = peer["bytes_moved"]
    rerun = playbook("deploy-qwen35.yml", "--tags", "fabric,runtime_image", label="image rerun")
    rerun_step = task(rerun, "stream to the other nodes", HEAD)
    # The raw pipe between the same engines, over the same path (head -> worker's fabric address).
    node_sh(WORKER, "docker rmi -f %s >/dev/null" % image_id(WORKER), check=False)
    start = time.time()
    node_sh(HEAD, "docker save %s | ssh root@%s docker load >/dev/null" % (IMAGE, WORKER_FABRIC))
    raw = time.time() - start
    return dict(
        bytes=size,
        copy_s=peer["seconds"],
        copy_task_s=round(step["end"] - step["start"], 2),
        copy_mb_s=round(size / 2**20 / peer["seconds"], 1) if peer["seconds"] else None,
        raw_s=round(raw, 2),
        raw_mb_s=round(size / 2**20 / raw, 1),
        rerun_bytes=rerun_step["result"]["bytes_moved"],
        rerun_changed=rerun["changed"],
        same_id=image_id(HEAD) == image_id(WORKER),
    )


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return dict(median=None, min=None, max=None, n=0)
    return dict(median=round(statistics.median(values), 2), min=min(values), max=max(values), n=len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument("--only", default="cold,warm,image,baseline", help="comma-separated scenarios")
    parser.add_argument("--out", default=os.path.join(BENCH, "results"), help="directory for the JSON")
    parser.add_argument(
        "--tree",
        default=ROOT,
        help="collection tree to measure, with its build/collections/ansible_collections/dgx_spark/vllm link "
        "(default: this repository); e.g. `git archive` of an earlier commit, for a before/after",
    )
    args = parser.parse_args()
    TREE["root"] = os.path.abspath(args.tree)
    only = set(args.only.split(","))
    raw = {"cold": [], "warm": [], "image": [], "baseline": []}
    for i in range(args.runs):
        if "baseline" in only:
            log("baseline run %d" % (i + 1))
            raw["baseline"].append(run_baseline())
        if "cold" in only:
            log("cold deploy run %d" % (i + 1))
            raw["cold"].append(run_cold())
        if "warm" in only:
            if i == 0 and "cold" not in only:
                playbook("deploy-qwen35.yml", label="bring up")
            log("warm re-converge run %d" % (i + 1))
            raw["warm"].append(playbook("deploy-qwen35.yml", label="warm"))
        if "image" in only:
            log("image distribution run %d" % (i + 1))
            raw["image"].append(run_image())
    # Leave the lab serving, as a deploy would.
    if "image" in only or ("baseline" in only and "cold" not in only and "warm" not in only):
        playbook("deploy-qwen35.yml", label="restore")

    rows = []

    def row(name, values, unit, target=""):
        rows.append(dict(measure=name, unit=unit, target=target, **stats(values)))

    cold_w = [r["wall"] for r in raw["cold"]]
    base_w = [r["wall"] for r in raw["baseline"]]
    if raw["cold"]:
        row("cold deploy: wall", cold_w, "s")
    if raw["baseline"]:
        row("baseline.sh: wall", base_w, "s")
    if raw["cold"] and raw["baseline"]:
        ratios = [c / b for c, b in zip(cold_w, base_w, strict=False)]
        row("cold / baseline", ratios, "x", TARGETS["cold_ratio"])

    def playbook_rows(label, runs, changed_target=""):
        row("%s: changed" % label, [r["changed"] for r in runs], "tasks", changed_target)
        row("%s: SSH round trips (tasks x hosts)" % label, [r["tasks_x_hosts"] for r in runs], "count")
        row("%s: ssh processes spawned" % label, [r["ssh_processes"] for r in runs], "count")
        row("%s: controller peak RSS (process tree)" % label, [r["peak_rss_mb"] for r in runs], "MiB")

    if raw["cold"]:
        playbook_rows("cold deploy", raw["cold"])
        row(
            "readiness lag: last Ray node joins -> wait done",
            [r["ray_lag"] for r in raw["cold"]],
            "s",
            TARGETS["lag_s"],
        )
        row(
            "readiness lag: /health 200 -> collection's 200",
            [r["health_lag"] for r in raw["cold"]],
            "s",
            TARGETS["lag_s"],
        )
    if raw["warm"]:
        row("warm re-converge: wall", [r["wall"] for r in raw["warm"]], "s", TARGETS["warm_wall_s"])
        playbook_rows("warm re-converge", raw["warm"], "0")
    if raw["image"]:
        row("image copy: collection stream", [r["copy_s"] for r in raw["image"]], "s")
        row("image copy: raw docker save, ssh, docker load", [r["raw_s"] for r in raw["image"]], "s")
        row(
            "image copy: collection / raw throughput",
            [r["raw_s"] / r["copy_s"] for r in raw["image"]],
            "x",
            TARGETS["copy_ratio"],
        )
        row("image copy: bytes", [r["bytes"] for r in raw["image"]], "B")
        row(
            "image re-run (IDs match): bytes moved",
            [r["rerun_bytes"] for r in raw["image"]],
            "B",
            TARGETS["rerun_bytes"],
        )

    load = os.getloadavg()
    print("tree: %s" % TREE["root"])
    print(
        "\n%d run(s); load average at the end %.1f %.1f %.1f (shared machine: other labs run here)\n"
        % (args.runs, *load)
    )
    header = "| measure | unit | median | min | max | target |"
    print(header)
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        cells = [_fmt(r[k], r["unit"]) for k in ("median", "min", "max")]
        print("| %s | %s | %s | %s | %s | %s |" % (r["measure"], r["unit"], *cells, r["target"]))
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for r in raw["cold"] + raw["warm"]:
        r["slowest_tasks"] = _slowest(r.pop("timer"))
    path = os.path.join(args.out, "bench-%s.json" % stamp)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(dict(runs=args.runs, tree=TREE["root"], loadavg=load, table=rows, raw=raw), handle, indent=1)
    print("\nwritten: %s" % os.path.relpath(path, ROOT))


def _slowest(tasks, n=12):
    spans = {}
    for t in tasks:
        spans[t["task"]] = max(spans.get(t["task"], 0), t["end"] - t["start"])
    return [dict(task=k, seconds=round(v, 2)) for k, v in sorted(spans.items(), key=lambda kv: -kv[1])[:n]]


def _fmt(value, unit=""):
    if value is None:
        return "-"
    if unit in ("B", "count", "tasks"):
        return str(int(value))
    if isinstance(value, float):
        return "%.2f" % value
    return str(value)


if __name__ == "__main__":
    main()
