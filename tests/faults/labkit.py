"""The lab the suites drive (inventories/lab by default: the lab Molecule leaves up): bring it up and down,
run playbooks with a time bound, read the nodes' state, and report cases as `case | expected | observed |
seconds`. Node names and addresses come from the inventory.

Shared by tests/faults/run.py and tests/bad_inputs/run.py. Everything here drives the real Docker
engine, real SSH and the real playbooks; nothing is mocked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The collection's own filters (build/collections links this tree), so the suites reach the endpoint where
# the deploy summary, status.yml and the Molecule verifies do.
sys.path.insert(0, os.path.join(ROOT, "build", "collections"))
from ansible_collections.dgx_spark.vllm.plugins.filter.endpoint import api_url  # noqa: E402

BIN = os.path.dirname(sys.executable)
ANSIBLE_PLAYBOOK = os.path.join(BIN, "ansible-playbook")
ANSIBLE = os.path.join(BIN, "ansible")
ANSIBLE_INVENTORY = os.path.join(BIN, "ansible-inventory")
DEPLOY = os.path.join(ROOT, "deploy-qwen35.yml")
RECONVERGE = os.path.join(ROOT, "roles", "reconverge", "files", "dgx_spark_reconverge.py")
# The suites drive the lab this inventory describes: the Molecule lab by default (make test runs them on
# the lab Molecule leaves up), another with DGX_SPARK_LAB_INVENTORY.
INVENTORY = os.path.abspath(os.environ.get("DGX_SPARK_LAB_INVENTORY") or os.path.join(ROOT, "inventories", "lab"))

ENV = dict(
    os.environ,
    ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
    ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build", "collections"),
    ANSIBLE_NOCOLOR="1",
    ANSIBLE_FORCE_COLOR="0",
    PYTHONUNBUFFERED="1",
)


def read_inventory(path):
    """Names and addresses of the lab's nodes, as the inventory gives them (ansible-inventory --list;
    templated values are not rendered, so only literal ones are read)."""
    proc = subprocess.run(
        [ANSIBLE_INVENTORY, "-i", path, "--list"], capture_output=True, text=True, check=False, cwd=ROOT, env=ENV
    )
    if proc.returncode != 0:
        raise SystemExit("ansible-inventory -i %s --list failed: %s" % (path, proc.stderr.strip()))
    doc = json.loads(proc.stdout)
    hostvars = doc["_meta"]["hostvars"]
    heads = doc.get("spark_head", {}).get("hosts", [])
    workers = doc.get("spark_workers", {}).get("hosts", [])
    if len(heads) != 1 or not workers:
        raise SystemExit("%s: the suites need one host in spark_head and at least one in spark_workers" % path)
    nodes = tuple(heads + workers)
    head_vars = hostvars[heads[0]]
    with open(os.path.join(ROOT, "roles", "lab", "defaults", "main.yml"), encoding="utf-8") as fh:
        lab_name = head_vars.get("lab_name") or yaml.safe_load(fh)["lab_name"]
    fabric = {h: hostvars[h]["fabric_interfaces"][0]["address"] for h in nodes}
    return dict(
        nodes=nodes,
        mgmt={h: hostvars[h]["ansible_host"] for h in nodes},
        fabric={h: cidr.split("/")[0] for h, cidr in fabric.items()},
        fabric_cidr=fabric,
        head_rail=head_vars["fabric_interfaces"][0]["name"],
        model_path=head_vars["model_path"],
        model_name=head_vars["vllm_server_served_model_name"],
        api_port=int(head_vars["vllm_server_port"]),
        # The Ray agents' ports the lab pins (inventories/lab/group_vars/spark/monitoring.yml).
        ray_metrics_port=head_vars.get("ray_cluster_metrics_export_port"),
        ray_agent_ports=head_vars.get("ray_cluster_agent_ports") or {},
        api_url=api_url(head_vars),
        lab_name=lab_name,
        # The opt-in monitoring stage (inventories/lab/group_vars/spark/monitoring.yml), a literal boolean there.
        monitoring=bool(head_vars.get("monitoring_enabled", False)),
    )


_LAB = read_inventory(INVENTORY)
LAB_NAME = _LAB["lab_name"]
NODES = _LAB["nodes"]
HEAD, WORKER = NODES[0], NODES[1]
MGMT = _LAB["mgmt"]
FABRIC = _LAB["fabric"]
FABRIC_CIDR = _LAB["fabric_cidr"]
HEAD_RAIL = _LAB["head_rail"]
MODEL_PATH = _LAB["model_path"]
MODEL_NAME = _LAB["model_name"]
API_PORT = _LAB["api_port"]
RAY_METRICS_PORT = _LAB["ray_metrics_port"]
RAY_AGENT_PORTS = _LAB["ray_agent_ports"]
# The head's API as the collection's api_url filter gives it (http://FABRIC_IP:PORT).
API_URL = _LAB["api_url"]
MONITORING = _LAB["monitoring"]
IN_SERVICE = "dgx-spark/vllm-runtime:in-service"
# The collection's paths on a node: what a bad input must leave alone.
STATE_PATHS = ("/etc/dgx-spark", "/var/lib/dgx-spark", "/etc/netplan")
# Each node's stage record (module stage_state): the stages' records and the next run's plan.
STAGE_RECORD = "/var/lib/dgx-spark/stages.json"


class Result:
    def __init__(self, rc, out, seconds, timed_out, killed_at=None):
        self.rc, self.out, self.seconds, self.timed_out, self.killed_at = rc, out, seconds, timed_out, killed_at

    @property
    def lines(self):
        return self.out.splitlines()


# How many runs were made and the last one's Result: a failed case prints the tail of its last run.
RUNS = {"made": 0, "last": None}
TAIL_LINES = 25


def run(argv, timeout, on_line=None, env=None, on_start=None):
    """Run argv in its own process group, at most `timeout` seconds; `on_line(line, proc)` sees each output line
    and may return a string to kill the whole group at that point (the string is recorded as killed_at).
    `on_start(proc)` is called once the process runs (the benchmarks' memory sampler)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    if on_start:
        on_start(proc)
    out, buf, killed_at, timed_out = [], b"", None, False
    fd = proc.stdout.fileno()
    while True:
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            timed_out = True
            break
        ready = select.select([fd], [], [], min(left, 1.0))[0]
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        *complete, buf = buf.split(b"\n")
        for raw in complete:
            line = raw.decode("utf-8", "replace")
            out.append(line)
            if on_line and killed_at is None:
                why = on_line(line, proc)
                if why:
                    killed_at = why
                    kill_group(proc)
    if buf:
        out.append(buf.decode("utf-8", "replace"))
    if timed_out or killed_at:
        kill_group(proc)
    rc = proc.wait()
    RUNS["made"] += 1
    RUNS["last"] = Result(rc, "\n".join(out), round(time.monotonic() - started, 1), timed_out, killed_at)
    return RUNS["last"]


def kill_group(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def playbook(path, *args, timeout=600, on_line=None, inventory=INVENTORY, extra_env=None):
    return run([ANSIBLE_PLAYBOOK, "-i", inventory, path, *args], timeout, on_line, dict(ENV, **(extra_env or {})))


def deploy(*args, timeout=600, on_line=None):
    return playbook(DEPLOY, *args, timeout=timeout, on_line=on_line)


def reconverge(state_dir, *extra, mode="enforce", timeout=300):
    """The reconverge runner (exit 0 in sync, 10 drift found, 11 repaired, 20 failed); `extra` goes to
    ansible-playbook."""
    return run(
        [
            sys.executable,
            RECONVERGE,
            "--mode=" + mode,
            "--inventory=" + INVENTORY,
            "--playbook=" + DEPLOY,
            "--state-dir=" + state_dir,
            "--ansible-playbook=" + ANSIBLE_PLAYBOOK,
            *(["--", *extra] if extra else []),
        ],
        timeout,
    )


def newest_report(state_dir):
    names = sorted(n for n in os.listdir(state_dir) if n.startswith("report-") and n.endswith(".json"))
    with open(os.path.join(state_dir, names[-1]), encoding="utf-8") as handle:
        return json.load(handle)


def sh(*argv, check=True, timeout=60, stdin=None):
    """A command on the controller (the outer Docker engine, the lab's node containers through it)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), proc.returncode, (proc.stderr or proc.stdout).strip()))
    return proc.stdout


def node(host, *argv, check=True, timeout=60, stdin=None):
    return sh("docker", "exec", "-i", host, *argv, check=check, timeout=timeout, stdin=stdin)


# --- the lab ---------------------------------------------------------------------------------
def lab_running():
    out = sh("docker", "ps", "--filter", "label=dgx_spark.lab", "--format", "{{.Names}}", check=False)
    return set(NODES) <= set(out.split())


def lab_up():
    res = playbook(os.path.join(ROOT, "playbooks", "lab.yml"), timeout=600)
    if res.rc != 0:
        raise RuntimeError("the lab did not come up (exit %d):\n%s" % (res.rc, tail(res.out)))
    return res.seconds


def lab_down():
    res = playbook(os.path.join(ROOT, "playbooks", "lab.yml"), "-e", "lab_state=absent", timeout=300)
    if res.rc != 0:
        raise RuntimeError("the lab did not go down (exit %d):\n%s" % (res.rc, tail(res.out)))
    return res.seconds


def tail(text, lines=40):
    return "\n".join(text.splitlines()[-lines:])


# --- state of a node -------------------------------------------------------------------------
# Runs inside a node (python3 there): its nested engine's containers and images, its interfaces,
# every file under the collection's paths (mode and hash), and the serve state in the Ray head.
SNAPSHOT = r"""
import hashlib, json, os, subprocess, sys
paths = sys.argv[1:]
def out(*a):
    p = subprocess.run(a, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None
snap = {"containers": {}, "images": {}, "interfaces": {}, "files": {}, "serve": None}
ids = (out("docker", "ps", "-aq") or "").split()
if ids:
    for c in json.loads(out("docker", "inspect", *ids) or "[]"):
        snap["containers"][c["Name"].lstrip("/")] = {
            "id": c["Id"][:12], "image": c["Image"][7:19], "status": c["State"]["Status"],
            "started": c["State"]["StartedAt"], "restarts": c["RestartCount"],
            "privileged": c["HostConfig"]["Privileged"], "network": c["HostConfig"]["NetworkMode"]}
engine = out("docker", "images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
snap["engine"] = engine is not None
for line in (engine or "").splitlines():
    ref, iid = line.split()
    snap["images"][ref] = iid
for link in json.loads(out("ip", "-j", "addr") or "[]"):
    if link["ifname"] == "lo" or link["ifname"].startswith(("veth", "docker")):
        continue
    snap["interfaces"][link["ifname"]] = {
        "mtu": link["mtu"], "up": "UP" in link.get("flags", []),
        "addr": sorted("%s/%s" % (a["local"], a["prefixlen"]) for a in link.get("addr_info", [])
                       if a.get("family") == "inet")}
for top in paths:
    for base, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files) + [""]:
            path = os.path.join(base, name) if name else base
            st = os.lstat(path)
            entry = {"mode": oct(st.st_mode & 0o7777)}
            if name and os.path.isfile(path) and not os.path.islink(path):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                entry["sha256"] = h.hexdigest()
            snap["files"][path] = entry
if snap["containers"].get("ray-head", {}).get("status") == "running":
    state = out("docker", "exec", "ray-head", "cat", "/tmp/dgx-spark-vllm-serve.json")
    snap["serve"] = json.loads(state) if state else None
print(json.dumps(snap, sort_keys=True))
"""


def snapshot(host):
    return json.loads(node(host, "python3", "-", *STATE_PATHS, stdin=SNAPSHOT))


def snapshots():
    return {h: snapshot(h) for h in NODES}


def diff(before, after, prefix=""):
    """Paths of what differs between two snapshots (for a one-line observation)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            found += diff(before.get(key), after.get(key), "%s/%s" % (prefix, key) if prefix else str(key))
        return found
    return [] if before == after else [prefix]


def model_hashes(snap):
    return {p: f.get("sha256") for p, f in snap["files"].items() if p.startswith(MODEL_PATH + "/")}


def intact(before, after):
    """Model files (hash per file) and the in-service image ID unchanged on every node; '' when intact."""
    problems = []
    for h in NODES:
        if model_hashes(before[h]) != model_hashes(after[h]) or not model_hashes(after[h]):
            problems.append("%s model files changed" % h)
        if before[h]["images"].get(IN_SERVICE) != after[h]["images"].get(IN_SERVICE):
            problems.append("%s in-service image changed" % h)
    return "; ".join(problems)


# A real completion through the endpoint, sent from the worker node to the head's fabric address.
COMPLETION = r"""
import json, sys, urllib.request
url, model = sys.argv[1:3]
req = urllib.request.Request(url, data=json.dumps({"model": model, "prompt": "The capital of France is",
                             "max_tokens": 8, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as resp:
        print(json.dumps({"ok": True, "text": json.loads(resp.read())["choices"][0]["text"]}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}))
"""


# Lists a container's processes by title (and signals them): the script, run in the container.
PROCESSES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "processes.py")


def processes(host, container, prefix, signal_name=None):
    """{pid: state} of a container's processes named `prefix` (after sending them `signal_name`)."""
    argv = ["docker", "exec", "-i", container, "python3", "-", prefix, *([signal_name] if signal_name else [])]
    with open(PROCESSES, encoding="utf-8") as handle:
        out = node(host, *argv, stdin=handle.read())
    return {pid: state for pid, _start, state in (item.split(":") for item in out.split())}


def engine_core(signal_name=None):
    """The head's engine core processes (vLLM names them VLLM::EngineCore) in the Ray head container."""
    return processes(HEAD, "ray-head", "VLLM::EngineCore", signal_name)


HEALTH = r"""
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).getcode())
except urllib.error.HTTPError as exc:
    print(exc.code)
except Exception as exc:
    print("no answer (%s)" % type(exc).__name__)
"""


def health(client=WORKER, url=API_URL):
    """/health's status code as the worker sees it, or `no answer (...)`."""
    return node(client, "python3", "-", url + "/health", stdin=HEALTH).strip()


def completion(client=WORKER, url=API_URL):
    """(ok, text or error) for one completion through the head's /v1/completions."""
    url += "/v1/completions"
    try:
        res = json.loads(node(client, "python3", "-", url, MODEL_NAME, stdin=COMPLETION, timeout=60).strip())
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)[:120]
    return res["ok"], res.get("text") or res.get("error", "")


# deploy.yml runs its stages in one play; each stage starts with this task.
STAGES_PLAY = "Deploy stages"
STAGE_START = "TASK [Mark the start of stage %s]"


def deploy_stages():
    """Every stage deploy.yml runs on this lab, in order: its literal groups, then monitoring where enabled."""
    with open(os.path.join(ROOT, "playbooks", "deploy.yml"), encoding="utf-8") as fh:
        groups = yaml.safe_load(fh)[0]["vars"]["_deploy_stage_groups"]
    return [name for group in groups if isinstance(group, list) for name in group] + (
        ["monitoring"] if MONITORING else []
    )


def recorded_plan(host):
    """(key, stage names) of the plan in the node's stage record; (None, []) when it holds none."""
    text = node(host, "cat", STAGE_RECORD, check=False)
    plan = (json.loads(text) if text.strip() else {}).get("plan") or {}
    return plan.get("key"), [stage["name"] for stage in plan.get("stages", [])]


def stages_started(res):
    """The deploy stages a run started, in order."""
    head, tail = STAGE_START.split("%s")
    return [ln[len(head) : ln.index(tail)] for ln in res.lines if ln.startswith(head) and tail in ln]


# The deploy's first play describes (checks the settings of) these stages, one include per stage.
DESCRIBE_TASK = "TASK [Check the settings of each node stage that runs and describe its record"
WORK_OUT_TASK = "TASK [Work out which stages run]"


def stages_described(res):
    """The stages whose settings the deploy's first play checked (deploy_checks.yml), in order, each once; None
    when the run did not reach that task or the one after it (a planned run that describes none skips it)."""
    out, inside, reached = [], False, False
    for line in res.lines:
        if line.startswith("TASK ["):
            inside = line.startswith(DESCRIBE_TASK)
            reached = reached or inside or line.startswith(WORK_OUT_TASK)
        elif inside and line.startswith("included: ") and "(item=" in line:
            name = line[line.index("(item=") + 6 : line.rindex(")")]
            if name not in out:
                out.append(name)
    return out if reached else None


def first_failure(res):
    """(where, host, line) of the failure that stopped an ansible-playbook run: the last `fatal:` line (a
    failure a block rescues prints one too, before the rescue's own; any_errors_fatal stops at the first
    one not rescued). `where` is the stage (its role's name) in deploy.yml's stages play, else the play."""
    play, stage, found = None, None, (None, None, "")
    for line in res.lines:
        if line.startswith("PLAY [") and not line.startswith("PLAY RECAP"):
            play, stage = line[6 : line.index("]")], None
        elif play == STAGES_PLAY and line.startswith("TASK [dgx_spark.vllm."):
            stage = line[len("TASK [dgx_spark.vllm.") :].split(" ", 1)[0]
        if line.startswith("fatal: [") and "...ignoring" not in line:
            found = (stage or play, line[8 : line.index("]")], line)
    return found


# --- reporting ----------------------------------------------------------------------------------
class Suite:
    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def case(self, name, expected, fn):
        """fn() returns (ok, observed). Any exception is a failed case with its message as observed."""
        started, runs_before = time.monotonic(), RUNS["made"]
        try:
            ok, observed = fn()
        except Exception as exc:
            ok, observed = False, "error: %s" % str(exc).replace("\n", " ")[:300]
        seconds = time.monotonic() - started
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        observed = " ".join(str(observed).split())
        print("%s | %s | %s%s | %.1f" % (name, expected, "" if ok else "FAILED: ", observed, seconds), flush=True)
        # Where the case's last playbook was when it failed or was cut off (never for the secrets cases).
        if not ok and RUNS["made"] > runs_before and not name.startswith("secrets"):
            for line in RUNS["last"].lines[-TAIL_LINES:]:
                print("  %s | %s" % (name, line[:300]), flush=True)
        return ok

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def selected(args, name):
    """Whether --only and --skip leave the case called name in."""
    return (not args.only or any(o in name for o in args.only)) and not any(s in name for s in args.skip)


def main_wrapper(suite_name, body, argv=None):
    """Create the lab when absent, run `body(suite, args)`, take the lab down unless --keep-lab."""

    parser = argparse.ArgumentParser(description="%s on the lab of %s" % (suite_name, INVENTORY))
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up at the end")
    parser.add_argument("--only", action="append", default=[], help="run only cases whose name contains this")
    parser.add_argument("--skip", action="append", default=[], help="leave out cases whose name contains this")
    args = parser.parse_args(argv)
    suite = Suite(suite_name)
    started = time.monotonic()
    made = False
    try:
        if not lab_running():
            print("# %s: creating the lab (%s)" % (suite_name, LAB_NAME), flush=True)
            print("# lab up in %.0fs" % lab_up(), flush=True)
            made = True
        body(suite, args, made)
    finally:
        if not args.keep_lab:
            print("# lab down in %.0fs" % lab_down(), flush=True)
        print("# %s: %.0fs in all" % (suite_name, time.monotonic() - started), flush=True)
    return suite.finish()
