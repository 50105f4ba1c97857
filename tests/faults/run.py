"""Fault cases on the lab: each one either makes the deploy fail within its bound, naming the node
and the stage, or is repaired by the next re-convergence (a real completion through the endpoint
afterwards); model files and the in-service image are checked by hash and image ID before and after.
A frozen engine core and an MTU drift, reported by drift and repaired by enforce, are Molecule's reconverge
scenario (each fault is run once, where its checks are).

    .venv/bin/python tests/faults/run.py [--keep-lab] [--only NAME] [--skip NAME]

Prints `case | expected | observed | seconds` per case and `N passed, N failed` at the end.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import labkit as lab

REPORTS = os.path.join(lab.ROOT, "build", "faults-reconverge")
# Bounds, in seconds: a deploy that must fail, and a repair by one re-convergence.
FAIL_BOUND = 150
REPAIR_BOUND = 240


def after_line(marker, delay, label):
    """An on_line hook: kill the run `delay` seconds after a line containing `marker` (checked per line)."""
    seen = {}

    def hook(line, _proc):
        if marker in line and "at" not in seen:
            seen["at"] = time.monotonic()
        if "at" in seen and time.monotonic() - seen["at"] >= delay:
            return label
        return None

    return hook


serving = lab.completion


RESTART_HISTORY = "/var/lib/dgx-spark/vllm-restarts.json"


def forget_restarts():
    """Each case starts with no watchdog restarts on record: the cases before it restarted the engine
    (a killed Ray container, a killed engine core) within the watchdog's window, and three of those are a
    crash loop (vllm_server_max_restarts) that a case of its own checks."""
    lab.node(lab.HEAD, "rm", "-f", RESTART_HISTORY)


def restarts_on_record():
    """The watchdog's restarts on record on the head (its history file; [] when there is none)."""
    try:
        return json.loads(lab.node(lab.HEAD, "cat", RESTART_HISTORY, check=False) or "{}").get("restarts", [])
    except ValueError:
        return []


def repaired_by_reconverge(inject, via="reconverge"):
    """Inject a fault while serving, then one re-convergence must restore a serving endpoint with
    model files and the in-service image intact."""
    before = lab.snapshots()
    ok, text = serving()
    if not ok:
        return False, "not serving before the fault: %s" % text
    forget_restarts()
    what = inject(before)
    if via == "reconverge":
        res = lab.reconverge(REPORTS, timeout=REPAIR_BOUND)
        ran = "reconverge exit %s in %ss" % (res.rc, res.seconds)
        good_rc = res.rc in (0, 11)
    else:
        res = lab.deploy(timeout=REPAIR_BOUND)
        ran = "deploy exit %s in %ss" % (res.rc, res.seconds)
        good_rc = res.rc == 0
    if res.timed_out:
        return False, "%s; %s: timed out at the %ss bound" % (what, ran, REPAIR_BOUND)
    ok, text = serving()
    after = lab.snapshots()
    damage = lab.intact(before, after)
    observed = "%s; %s; completion %s; %s" % (
        what,
        ran,
        "ok" if ok else "FAILED (%s)" % text,
        damage or "model+image intact",
    )
    if not good_rc:
        play, host, line = lab.first_failure(res)
        observed += "; first failure: %s in %s: %s" % (host, play, line[:200])
    return good_rc and ok and not damage, observed


def deploy_with_worker_cut_off(stage, *args):
    """A deploy that loses the worker (its management network) as `stage` starts; reconnected after."""
    net = lab.LAB_NAME + "-mgmt"

    def cut(line, _proc):
        if line.startswith(lab.STAGE_START % stage):
            lab.sh("docker", "network", "disconnect", net, lab.WORKER)

    try:
        return lab.deploy(*args, timeout=FAIL_BOUND + 30, on_line=cut)
    finally:
        lab.sh("docker", "network", "connect", "--ip", lab.MGMT[lab.WORKER], net, lab.WORKER, check=False)


def fails_naming(res, host, stage, bound, before):
    where, failed_host, line = lab.first_failure(res)
    after = lab.snapshots()
    damage = lab.intact(before, after)
    observed = "exit %s in %ss; first failure: %s in %s (%s)" % (
        res.rc,
        res.seconds,
        failed_host,
        where,
        line[len("fatal: [%s]: " % failed_host) :][:160],
    )
    ok = res.rc != 0 and not res.timed_out and res.seconds <= bound and failed_host == host and where == stage
    return ok and not damage, observed + "; " + (damage or "model+image intact")


# --- cases -------------------------------------------------------------------------------------
def case_interrupted(suite, fresh):
    """The playbook killed mid-run at three points in a row; the next run converges."""
    points = [
        ("runtime_image", "Image | Obtain, verify, promote on the build host", 6 if fresh else 1),
        ("ray_cluster", "TASK [dgx_spark.vllm.ray_cluster : Start the Ray head and the workers at once]", 1),
        ("vllm_server", "TASK [dgx_spark.vllm.vllm_server : Serve the model and verify", 1),
    ]
    if not fresh:
        # A lab that serves already: take serving and Ray down first so the killed stages have work to do.
        res = lab.playbook(os.path.join(lab.ROOT, "playbooks", "teardown.yml"), timeout=120)
        print("# teardown before the interrupted deploy: exit %s in %ss" % (res.rc, res.seconds), flush=True)
    # The killed runs run every stage in full: on a lab whose records show the node stages converged (a
    # make lab), a recorded run would skip runtime_image and never reach the point it is to be killed at.
    full = ("-e", "deploy_stage_records=false")
    head_model = lab.model_hashes(lab.snapshot(lab.HEAD))
    previous = None
    for stage, marker, delay in points:

        def one(stage=stage, marker=marker, delay=delay, previous=previous):
            res = lab.deploy(*full, timeout=300, on_line=after_line(marker, delay, stage))
            stages = lab.stages_started(res)
            failure = lab.first_failure(res)
            # A killed run leaves no failure behind it: every earlier stage of it passed.
            got_there = res.killed_at == stage and failure[1] is None and stages and stages[-1] == stage
            observed = "killed in %s after %ss (stages started: %s; no failure before the kill)" % (
                res.killed_at,
                res.seconds,
                ", ".join(stages),
            )
            if not got_there:
                observed = "not killed where planned (killed_at=%s, exit %s, first failure %s in %s: %s)" % (
                    res.killed_at,
                    res.rc,
                    failure[1],
                    failure[0],
                    failure[2][:300],
                )
            if previous and got_there:
                observed += "; passed the stage the previous run was killed in (%s)" % previous
            return got_there, observed

        suite.case("interrupted-deploy@" + stage, "killed mid-stage; the next run gets past it", one)
        previous = stage

    def converge():
        res = lab.deploy(timeout=300)
        ok, text = serving()
        snap = lab.snapshots()
        images = {h: snap[h]["images"].get(lab.IN_SERVICE) for h in lab.NODES}
        models = {h: lab.model_hashes(snap[h]) for h in lab.NODES}
        same = len(set(images.values())) == 1 and None not in images.values()
        model_ok = all(m == head_model for m in models.values()) and bool(head_model)
        # The run that converged records the next run's plan on every node: one key, every stage in run order.
        plans = {h: lab.recorded_plan(h) for h in lab.NODES}
        keys = {key for key, _names in plans.values()}
        stages = lab.deploy_stages()
        plan_ok = len(keys) == 1 and None not in keys and all(names == stages for _key, names in plans.values())
        observed = "deploy exit %s in %ss; completion %s; in-service image %s on both nodes; model %s; plan %s" % (
            res.rc,
            res.seconds,
            "ok: %r" % text[:40] if ok else "FAILED (%s)" % text,
            "the same" if same else "DIFFERS %s" % images,
            "equal to the head's generated files" if model_ok else "DIFFERS",
            "recorded on every node with every stage in order"
            if plan_ok
            else "NOT as expected %s (stages %s)" % (plans, stages),
        )
        return res.rc == 0 and ok and same and model_ok and plan_ok, observed

    suite.case("interrupted-deploy/next-run", "converges, serves and records its plan", converge)


def case_worker_unreachable(suite):
    def body():
        before = lab.snapshots()
        # Every node stage is done (or found converged): cut the worker off as the Ray stage starts. A
        # converged Ray stage is not run again: a changed setting of it (one that leaves its containers as
        # they are) makes it run.
        res = deploy_with_worker_cut_off("ray_cluster", "-e", "ray_cluster_wait_timeout=301")
        return fails_naming(res, lab.WORKER, "ray_cluster", FAIL_BOUND, before)

    suite.case(
        "worker-unreachable-before-ray",
        "deploy fails <%ss naming %s in ray_cluster" % (FAIL_BOUND, lab.WORKER),
        body,
    )

    def repair():
        return repaired_by_reconverge(lambda _b: "worker reachable again", via="deploy")

    suite.case("worker-unreachable-before-ray/next-run", "next deploy serves; data intact", repair)


def case_worker_ray_dies_while_joining(suite):
    """The worker's Ray container dies while the head waits for it: the wait stops at once, naming the
    worker, instead of running out its timeout."""

    def body():
        res = lab.playbook(os.path.join(lab.ROOT, "playbooks", "teardown.yml"), timeout=120)
        if res.rc != 0:
            return False, "teardown before the deploy failed: exit %s" % res.rc
        before = lab.snapshots()

        def kill(line, _proc):
            # The worker's container was just created; its Ray has not joined yet.
            if "TASK [dgx_spark.vllm.ray_cluster : Wait for the expected Ray nodes and GPUs]" in line:
                lab.node(lab.WORKER, "docker", "kill", "ray-worker", check=False)

        res = lab.deploy(timeout=FAIL_BOUND + 30, on_line=kill)
        where, failed_host, line = lab.first_failure(res)
        # The head's wait names the worker; the worker, stopped by any_errors_fatal, points to it.
        named = [x for x in res.lines if x.startswith("fatal: [") and "ray-worker on %s" % lab.WORKER in x]
        observed = "exit %s in %ss; failed in %s (last: %s); named by: %s" % (
            res.rc,
            res.seconds,
            where,
            failed_host,
            named[0][: named[0].index("]") + 1] if named else "NO failure names it (%s)" % line[:200],
        )
        damage = lab.intact(before, lab.snapshots())
        # The last successful run's plan holds these settings: after the teardown only the cluster stages (and
        # monitoring, which follows them) run, and of those only monitoring's settings checks and record description
        # run (the cluster stages' check no settings; the plan holds them).
        described = lab.stages_described(res)
        checked = "(task not reached)" if described is None else ", ".join(described) or "none"
        observed += "; settings checked for: %s" % checked
        ok = res.rc != 0 and not res.timed_out and res.seconds <= FAIL_BOUND and where == "ray_cluster" and bool(named)
        ok = ok and described == (["monitoring"] if lab.MONITORING else [])
        return ok and not damage, observed + "; " + (damage or "model+image intact")

    suite.case(
        "worker-ray-dies-while-joining",
        "deploy fails <%ss in ray_cluster naming ray-worker on %s; no node or cluster stage's settings checked again"
        % (FAIL_BOUND, lab.WORKER),
        body,
    )

    def repair():
        before = lab.snapshots()
        res = lab.deploy(timeout=REPAIR_BOUND)
        ok, text = serving()
        damage = lab.intact(before, lab.snapshots())
        observed = "deploy exit %s in %ss; completion %s; %s" % (
            res.rc,
            res.seconds,
            "ok" if ok else "FAILED (%s)" % text,
            damage or "model+image intact",
        )
        return res.rc == 0 and ok and not damage, observed

    suite.case("worker-ray-dies-while-joining/next-run", "next deploy serves; data intact", repair)


def case_ray_killed(suite, case, host, container):
    def inject(_before):
        lab.node(host, "docker", "kill", container)
        ok, _text = serving()
        return "killed %s %s; completion right after: %s" % (host, container, "ok" if ok else "failed")

    suite.case(
        case, "reconverge restores serving <%ss; data intact" % REPAIR_BOUND, lambda: repaired_by_reconverge(inject)
    )


def kill_engine_core():
    """SIGKILL the engine core: the API server lives on and answers /health 503."""
    core = lab.engine_core("KILL")
    if not core:
        raise RuntimeError("no engine core process (VLLM::EngineCore) in ray-head to kill")
    deadline = time.monotonic() + 30
    code = lab.health()
    while code != "503" and time.monotonic() < deadline:
        time.sleep(0.5)
        code = lab.health()
    return "SIGKILL engine core %s; /health %s" % (sorted(core), code)


# When engine-core-killed started (epoch seconds; the lab's nodes share this clock): crash-loop takes the one
# watchdog restart recorded since then as its first death.
ENGINE_CORE_KILLED = {}


def case_engine_core_killed(suite):
    alert = {}

    def body():
        ENGINE_CORE_KILLED["since"] = time.time()
        return repaired_by_reconverge(lambda _before: alert_fires_after(kill_engine_core, alert))

    suite.case("engine-core-killed", "reconverge restores serving <%ss; data intact" % REPAIR_BOUND, body)
    suite.case(
        "engine-core-killed/alert",
        "%s fires <%ss after the kill; clears <%ss after the repair" % (ENGINE_ALERT, ALERT_BOUND, ALERT_BOUND),
        lambda: alert_cleared(alert),
    )


# Prometheus on the lab (inventories/lab monitoring.yml: 2 s scrapes and evaluations, for: 4s). The case
# runs the monitoring stage first, so Prometheus is there whatever the inventory enables.
ALERTS = r"""
import json, sys, urllib.request
url = "http://%s:9090/api/v1/alerts" % sys.argv[1]
alerts = json.load(urllib.request.urlopen(url, timeout=5))["data"]["alerts"]
print(json.dumps({a["labels"]["alertname"]: a["activeAt"] for a in alerts if a["state"] == "firing"}))
"""
ENGINE_ALERT = "VllmEngineDown"
ALERT_BOUND = 60


def wait_for_alert(name, firing, start=None):
    """Seconds from `start` (now) until Prometheus on the head has `name` firing (or not), and the firing
    alerts ({name: activeAt}); None past the bound."""
    start = start or time.monotonic()
    while True:
        alerts = json.loads(lab.node(lab.HEAD, "python3", "-", lab.FABRIC[lab.HEAD], stdin=ALERTS))
        if (name in alerts) == firing:
            return round(time.monotonic() - start, 1), alerts
        if time.monotonic() - start > ALERT_BOUND:
            return None, alerts
        time.sleep(1)


def since(rfc3339, wall):
    """Seconds from `wall` (time.time()) to Prometheus' RFC 3339 time (nanoseconds cut to microseconds)."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return round(datetime.datetime.fromisoformat(stamp).timestamp() - wall, 1)


def alert_fires_after(inject, seen):
    """Install monitoring, inject a fault that kills the engine, then wait for ENGINE_ALERT (the repair follows
    in the caller)."""
    res = lab.deploy("--tags", "monitoring", "-e", "monitoring_enabled=true", timeout=REPAIR_BOUND)
    seen["install"] = "monitoring stage exit %s in %ss" % (res.rc, res.seconds)
    if res.rc != 0:
        raise RuntimeError("%s: %s" % (seen["install"], lab.first_failure(res)))
    quiet, seen["before"] = wait_for_alert(ENGINE_ALERT, firing=False)
    seen["quiet"] = quiet is not None
    start, wall = time.monotonic(), time.time()
    what = inject()
    seen["fired"], alerts = wait_for_alert(ENGINE_ALERT, firing=True, start=start)
    # The alert is pending from activeAt and fires monitoring_alert_for later.
    seen["pending"] = since(alerts[ENGINE_ALERT], wall) if ENGINE_ALERT in alerts else None
    return what


def alert_cleared(seen):
    """After the repair: ENGINE_ALERT fired after the fault (alert_fires_after) and clears now."""
    if "fired" not in seen:
        return False, "the fault was not injected"
    cleared, after = wait_for_alert(ENGINE_ALERT, firing=False)
    late = "NOT within %ss" % ALERT_BOUND
    ok = seen["quiet"] and seen["fired"] is not None and cleared is not None
    return ok, "%s; %s before the fault: %s; firing %s; cleared %s" % (
        seen["install"],
        ENGINE_ALERT,
        "not firing" if seen["quiet"] else "FIRING (%s)" % sorted(seen["before"]),
        "(pending %ss after the kill, seen firing at %ss)" % (seen["pending"], seen["fired"])
        if seen["fired"] is not None
        else late,
        "%ss after the repair" % cleared if cleared is not None else "%s (%s)" % (late, sorted(after)),
    )


def case_crash_loop(suite):
    """With vllm_server_max_restarts=1: the engine dies, is restarted; dies again in the window: a crash
    loop, reported with the engine's log and not restarted; a deploy with the defaults repairs it."""
    loop = ("-e", "vllm_server_max_restarts=1")

    def body():
        # engine-core-killed, run just before, leaves its one watchdog restart on record: that is the first
        # death and restart (an engine start saved). Without it, the case makes its own.
        recorded = restarts_on_record()
        since = ENGINE_CORE_KILLED.get("since")
        if since is not None and len(recorded) == 1 and recorded[0].get("at", 0) >= since:
            first, res1 = "first death: engine-core-killed's restart on record (%s)" % recorded[0].get("why"), None
        else:
            forget_restarts()
            first = kill_engine_core()
            res1 = lab.reconverge(REPORTS, *loop, timeout=REPAIR_BOUND)
        second = kill_engine_core()
        pid = lab.snapshot(lab.HEAD)["serve"] or {}
        res2 = lab.reconverge(REPORTS, *loop, timeout=FAIL_BOUND)
        report = lab.newest_report(REPORTS)
        failures = report["hosts"].get(lab.HEAD, {}).get("failures", [])
        msg = failures[0]["msg"] if failures else ""
        still = lab.health()
        same = (lab.snapshot(lab.HEAD)["serve"] or {}).get("pid") == pid.get("pid")
        # Which lines the tail holds depends on timing (Ray's worker output can push the engine's
        # traceback out), so require a non-empty tail of the engine log rather than one word in it.
        tail = [line for line in msg.partition("Log tail (")[2].splitlines()[1:] if line.strip()]
        restarted = res1 is None or res1.rc == 11
        ok = restarted and res2.rc == 20 and "crash loop" in msg and bool(tail) and still != "200" and same
        return (
            ok,
            "%s; %s; %s; enforce exit %s in %ss: %s; log tail %d line(s), last %r; /health %s, serve process %s"
            % (
                first,
                "enforce exit %s in %ss" % (res1.rc, res1.seconds) if res1 else "no enforce run of its own",
                second,
                res2.rc,
                res2.seconds,
                msg.split(". Read the log")[0][:240] or "NO failure message",
                len(tail),
                tail[-1][:160] if tail else "",
                still,
                "not restarted" if same else "RESTARTED",
            ),
        )

    suite.case(
        "crash-loop", "second death in the window: exit 20 naming the crash loop with the log; not restarted", body
    )

    def repaired():
        res = lab.deploy(timeout=REPAIR_BOUND)
        ok, text = serving()
        return res.rc == 0 and ok, "deploy exit %s in %ss; completion %s" % (
            res.rc,
            res.seconds,
            "ok" if ok else "FAILED (%s)" % text,
        )

    suite.case("crash-loop/next-run", "a deploy with the default vllm_server_max_restarts serves", repaired)


def case_node_restarted(suite):
    def inject(_before):
        lab.sh("docker", "restart", "--time", "5", lab.HEAD)
        # sshd answers again before re-convergence starts (the node's own start-up, not the fault).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if lab.sh("docker", "exec", lab.HEAD, "docker", "info", "-f", "{{.ID}}", check=False).strip():
                break
            time.sleep(1)
        mtu = lab.snapshot(lab.HEAD)["interfaces"].get("enp1s0f1np1", {})
        return "restarted node %s (fabric after restart: mtu %s, %s)" % (lab.HEAD, mtu.get("mtu"), mtu.get("addr"))

    suite.case(
        "node-restarted-while-serving",
        "reconverge restores serving <%ss; data intact" % REPAIR_BOUND,
        lambda: repaired_by_reconverge(inject),
    )


def case_engine_stopped(suite):
    sock, aside = "/var/run/docker.sock", "/var/run/docker.sock.faults-stopped"

    def body():
        before = lab.snapshots()
        # The lab's nested dockerd is the node container's main process (stopping it restarts the node,
        # the case above), so the engine is taken away from its clients the way a stopped engine is:
        # its socket is gone and every client gets "Cannot connect to the Docker daemon".
        lab.node(lab.WORKER, "mv", sock, aside)
        try:
            refused = lab.node(lab.WORKER, "docker", "version", "-f", "{{.Server.Version}}", check=False).strip() == ""
            res = lab.deploy(timeout=FAIL_BOUND + 30)
        finally:
            lab.node(lab.WORKER, "mv", aside, sock, check=False)
        ok, observed = fails_naming(res, lab.WORKER, "preflight", 60, before)
        named = "does not answer" in lab.first_failure(res)[2]
        return ok and refused and named, observed + ("" if refused else "; the engine still answered")

    suite.case("worker-docker-engine-stopped", "deploy fails <60s naming %s in preflight" % lab.WORKER, body)

    def still():
        ok, text = serving()
        return ok, "engine back; completion %s" % ("ok" if ok else "FAILED (%s)" % text)

    suite.case("worker-docker-engine-stopped/after", "serving untouched", still)


# The copy case: the deploy reaches the copy (the head's engine stages the whole image for docker save first:
# about a minute for the lab's 4.5 GB here, over two in CI), then must fail this soon after the worker's engine stops.
COPY_DEPLOY_BOUND = 480
COPY_FAIL_BOUND = 30

# A load in progress on a node's engine: dockerd spools the incoming tar under its own tmp directory.
LOADING = "du -sm /var/lib/docker/tmp/docker-import-* 2>/dev/null | awk '{s+=$1} END {print s+0}'"


def engine_back(host, bound=120):
    """Wait until a node's engine answers again (the node's own restart, not the fault)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if lab.node(host, "docker", "info", "-f", "{{.ID}}", check=False).strip():
            return
        time.sleep(1)


def case_engine_dies_during_copy(suite):
    """The worker's Docker engine stops while the head streams the runtime image into it: the deploy fails
    at once, naming the worker, the cause, the bytes sent and what to run; the next deploy copies again."""
    keep = "faults/keep-in-service:1"

    def body():
        # The worker keeps the image under another name (its Ray container uses it); without the in-service
        # tag the runtime image stage has a copy to make.
        lab.node(lab.WORKER, "docker", "tag", lab.IN_SERVICE, keep)
        lab.node(lab.WORKER, "docker", "rmi", lab.IN_SERVICE)
        before = lab.snapshots()
        stopped = {}

        def stop_when_loading():
            deadline = time.monotonic() + COPY_DEPLOY_BOUND
            while time.monotonic() < deadline:
                mib = lab.node(lab.WORKER, "sh", "-c", LOADING, check=False).strip()
                if mib.isdigit() and int(mib) >= 50:
                    # dockerd is the node's PID 1: SIGTERM stops the engine (the node's restart policy
                    # brings it back, as systemd would restart a crashed docker.service).
                    lab.node(lab.WORKER, "kill", "-TERM", "1", check=False)
                    stopped["mib"], stopped["at"] = int(mib), time.monotonic()
                    return
                time.sleep(0.5)

        def hook(line, _proc):
            if "Image | Obtain, verify, promote on the build host" in line and "thread" not in stopped:
                stopped["thread"] = threading.Thread(target=stop_when_loading, daemon=True)
                stopped["thread"].start()

        started = time.monotonic()
        res = lab.deploy(timeout=COPY_DEPLOY_BOUND + 30, on_line=hook)
        if "thread" in stopped:
            stopped["thread"].join(10)
        _play, _host, line = lab.first_failure(res)
        engine_back(lab.WORKER)
        # Bounded from the stop: how soon the head's engine stages the image for docker save is the disk's.
        after_stop, later = None, "never"
        if "at" in stopped:
            after_stop = started + res.seconds - stopped["at"]
            later = "the deploy failed %.1fs later" % after_stop
        ok, observed = fails_naming(res, lab.HEAD, "runtime_image", COPY_DEPLOY_BOUND, before)
        named = all(w in line for w in ("to %s" % lab.WORKER, "stopped answering", "bytes", "run the deploy again"))
        observed += "; engine stopped at %s MiB spooled, %s" % (stopped.get("mib", "NEVER"), later)
        ok = ok and named and after_stop is not None and after_stop <= COPY_FAIL_BOUND
        return ok, observed + ("" if named else "; the message does not name it")

    suite.case(
        "worker-engine-dies-during-image-copy",
        "deploy fails <%ss after the stop naming %s, its engine, bytes sent and the fix"
        % (COPY_FAIL_BOUND, lab.WORKER),
        body,
    )

    def repair():
        engine_back(lab.WORKER)
        before = lab.snapshots()
        res = lab.deploy(timeout=600)
        ok, text = serving()
        after = lab.snapshots()
        same = after[lab.WORKER]["images"].get(lab.IN_SERVICE) == after[lab.HEAD]["images"].get(lab.IN_SERVICE)
        lab.node(lab.WORKER, "docker", "rmi", keep, check=False)
        observed = "deploy exit %s in %ss; completion %s; worker's in-service image %s the head's" % (
            res.rc,
            res.seconds,
            "ok" if ok else "FAILED (%s)" % text,
            "equals" if same else "DIFFERS from",
        )
        models = lab.model_hashes(before[lab.HEAD]) == lab.model_hashes(after[lab.WORKER])
        return res.rc == 0 and ok and same and models, observed + ("" if models else "; model files differ")

    suite.case("worker-engine-dies-during-image-copy/next-run", "next deploy copies again and serves", repair)


def case_check_mode_summary(suite):
    """--check --diff on a serving cluster: the summary shows the endpoint its probe (a read) found serving."""

    def body():
        before = lab.snapshots()
        res = lab.deploy("--check", "--diff", timeout=300)
        changed = lab.diff(before, lab.snapshots())
        live = "endpoint: %s/v1" % lab.API_URL
        said = [ln.strip() for ln in res.lines if "endpoint:" in ln or "completion:" in ln or "probe:" in ln]
        ok = res.rc == 0 and any(live in ln for ln in said) and any("probe: passed" in ln for ln in said)
        return ok and not changed, "exit %s in %ss; summary: %s; state %s" % (
            res.rc,
            res.seconds,
            " | ".join(said) or "NO summary lines",
            "unchanged" if not changed else "CHANGED: %s" % ", ".join(changed[:5]),
        )

    suite.case("check-mode-summary", "summary names the endpoint and its passed probe; state unchanged", body)


def case_tags_model(suite):
    """A worker's model file removed while serving: `--tags model` alone copies it back (the other stages' facts
    from their records); a worker without stage records makes `--tags model` stop before anything runs, naming it."""

    def repaired():
        before = lab.snapshots()
        lab.node(lab.WORKER, "rm", "-f", lab.MODEL_PATH + "/config.json")
        res = lab.deploy("--tags", "model", timeout=REPAIR_BOUND)
        after = lab.snapshots()
        problems = lab.intact(before, after)
        ok, text = serving()
        return res.rc == 0 and not problems and ok, "exit %s in %ss; %s; completion: %s" % (
            res.rc,
            res.seconds,
            problems or "model files and image as before on every node",
            text[:60] if ok else "FAILED %s" % text,
        )

    suite.case("tags-model-repairs-a-worker-file", "--tags model copies it back; data intact; serves", repaired)

    def refused():
        lab.node(lab.WORKER, "mv", lab.STAGE_RECORD, lab.STAGE_RECORD + ".faults")
        try:
            before = lab.snapshots()
            res = lab.deploy("--tags", "model", timeout=FAIL_BOUND)
            changed = lab.diff(before, lab.snapshots())
        finally:
            lab.node(lab.WORKER, "mv", lab.STAGE_RECORD + ".faults", lab.STAGE_RECORD)
        text = " ".join(res.lines)
        said = "%s holds no record of preflight" % lab.WORKER in text and "Run the deploy once without --tags" in text
        started = lab.stages_started(res)
        ok = res.rc != 0 and said and not started and not changed
        return ok, "exit %s in %ss; %s; stages started: %s; state %s" % (
            res.rc,
            res.seconds,
            "names %s and the fix" % lab.WORKER if said else "NOT named: %s" % lab.first_failure(res)[2][:200],
            started or "none",
            "unchanged" if not changed else "CHANGED: %s" % ", ".join(changed[:5]),
        )

    suite.case("tags-model-without-records", "stops before any stage, naming %s and the fix" % lab.WORKER, refused)


HF_TOKEN = "hf_faultsSuiteToken7Qx2"  # noqa: S105 - a made-up value the output is grepped for
API_KEY = "sk-faults-suite-key-9Zr4"


def case_secrets(suite, restore):
    """A deploy with both secrets set, at -vvv, and one that fails: neither secret printed, files 0600. With
    `restore` false, the mp case that follows takes the key away (its switch removes the keyed Ray server;
    its next-run serves without a key)."""
    secrets = {"model_hf_token": HF_TOKEN, "vllm_server_api_key": API_KEY}

    def leaks(res):
        return [s for s in (HF_TOKEN, API_KEY) if s in res.out]

    def files_holding():
        found = []
        for h in lab.NODES:
            out = lab.node(
                h, "sh", "-c", "grep -rlsF -e %s -e %s /etc /var/lib/dgx-spark /root || true" % (HF_TOKEN, API_KEY)
            )
            for path in out.split():
                mode = lab.node(h, "stat", "-c", "%a", path).strip()
                found.append("%s:%s mode %s" % (h, path, mode))
        return found

    def ok_run():
        res = lab.deploy("-vvv", "-e", json.dumps(secrets), timeout=300)
        files = files_holding()
        bad_files = [f for f in files if not f.endswith("mode 600")]
        leaked = leaks(res)
        observed = "deploy -vvv exit %s in %ss, %d lines; secrets printed: %s; files holding them: %s" % (
            res.rc,
            res.seconds,
            len(res.lines),
            leaked or "none",
            files or "none",
        )
        return res.rc == 0 and not leaked and not bad_files, observed

    suite.case("secrets/deploy-vvv", "rc 0, neither secret printed, files 0600", ok_run)

    def failing_run():
        bad = dict(secrets, vllm_server_extra_args=["--no-such-flag"])
        res = lab.deploy("-vvv", "-e", json.dumps(bad), timeout=300)
        leaked = leaks(res)
        play, host, _line = lab.first_failure(res)
        observed = "deploy -vvv exit %s in %ss (failed: %s in %s); secrets printed: %s" % (
            res.rc,
            res.seconds,
            host,
            play,
            leaked or "none",
        )
        return res.rc != 0 and host == lab.HEAD and not leaked, observed

    suite.case("secrets/failing-deploy-vvv", "fails on the head, neither secret printed", failing_run)

    def restore_run():
        res = lab.deploy(timeout=300)
        ok, text = serving()
        return res.rc == 0 and ok, "deploy without the key exit %s in %ss; completion %s" % (
            res.rc,
            res.seconds,
            "ok" if ok else text,
        )

    if restore:
        suite.case("secrets/restore", "serving again without the key", restore_run)


LISTENERS = r"""
import json, subprocess
out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
rows = []
for line in out.splitlines():
    f = line.split()
    addr, port = f[3].rsplit(":", 1)
    proc = f[5].split('"')[1] if len(f) > 5 and '"' in f[5] else ""
    rows.append([addr, int(port), proc])
print(json.dumps(rows))
"""


WILDCARD = ("0.0.0.0", "*", "[::]")  # noqa: S104 - addresses looked for, not bound
LOOPBACK = ("127.0.0.1", "[::1]", "[::ffff:127.0.0.1]")
# ray/autoscaler/_private/constants.py and ray/dashboard/consts.py, Ray 2.60
RAY_AUTOSCALER_METRIC_PORT = 44217
RAY_DASHBOARD_METRIC_PORT = 44227
RAY_DASHBOARD_PORT = 8265
# ray[default]'s per-node agents as ss names them (process titles cut to 15 characters).
RAY_AGENTS = ("ray::DashboardA", "ray::RuntimeEnv")


def listener_problems(host, rows, fabric_ip, head):
    """What a node listens on that the collection's defaults do not account for."""
    problems = []
    # Where each of the agents' pinned ports may listen (Ray 2.60, dashboard/agent.py): the metrics agent and the
    # agent's gRPC server on every address (no option narrows them), its HTTP server on the node's address and
    # loopback, the runtime environment agent on the node's address.
    ports = dict(lab.RAY_AGENT_PORTS, metrics_export_port=lab.RAY_METRICS_PORT)
    allowed = {
        ports.get("metrics_export_port"): WILDCARD,
        ports.get("dashboard_agent_grpc_port"): WILDCARD,
        ports.get("dashboard_agent_listen_port"): (fabric_ip, *LOOPBACK),
        ports.get("runtime_env_agent_port"): (fabric_ip,),
    }
    allowed.pop(None, None)
    for addr, port, proc in rows:
        where = "%s %s on %s:%s" % (host, proc or "?", addr, port)
        if port == lab.API_PORT and addr != fabric_ip:
            problems.append("%s: API off the fabric address" % where)
        if "dashboard" in proc or port == RAY_DASHBOARD_PORT:
            problems.append("%s: dashboard listening" % where)
        if proc in RAY_AGENTS:
            if port not in allowed:
                problems.append("%s: a Ray agent port the inventory does not pin" % where)
            elif addr not in allowed[port]:
                problems.append("%s: a Ray agent port on an address it should not bind" % where)
            continue
        # Ray 2.60's core gRPC servers (GCS, raylet, each worker's and the driver's) listen on every
        # interface and have no option to narrow it (ray-project/ray#59852 later binds them to the node
        # IP); anything else on a wildcard address is a finding. vLLM's Ray driver is its engine core
        # process (ss shows its title cut to 15 characters).
        ray_core = proc in ("gcs_server", "raylet", "vllm", "VLLM::EngineCor") or proc.startswith("ray::")
        # On the head, Ray's autoscaler monitor and the dashboard process (which --include-dashboard=false
        # leaves running without its UI) serve Prometheus metrics on every interface whenever prometheus_client
        # is importable (vLLM requires it), with no option to narrow them: read-only metrics, named here.
        ray_metrics = host == head and port in (RAY_AUTOSCALER_METRIC_PORT, RAY_DASHBOARD_METRIC_PORT)
        if addr in WILDCARD and port != 22 and not ray_core and not ray_metrics:
            problems.append("%s: on every address" % where)
    return problems


def case_security(suite):
    def body():
        problems, notes = [], []
        for h in lab.NODES:
            snap = lab.snapshot(h)
            for name, c in snap["containers"].items():
                if c["privileged"]:
                    problems.append("%s %s privileged" % (h, name))
            rows = json.loads(lab.node(h, "python3", "-", stdin=LISTENERS))
            problems += listener_problems(h, rows, lab.FABRIC[h], lab.HEAD)
            agents = sorted({port for _a, port, p in rows if p in RAY_AGENTS})
            notes.append("%s Ray agent ports: %s" % (h, ",".join(map(str, agents)) or "none"))
            wild = sorted({p for a, _port, p in rows if a in WILDCARD and p not in ("sshd", "")})
            notes.append("%s wildcard: %s" % (h, ",".join(wild) or "none"))
            api = [a for a, port, _p in rows if port == lab.API_PORT]
            if h == lab.HEAD and api != [lab.FABRIC[h]]:
                problems.append("%s API listeners %s" % (h, api))
        nodes = lab.node(
            lab.HEAD,
            "docker",
            "exec",
            "ray-head",
            "python3",
            "-c",
            "import ray, json; ray.init(address='auto', logging_level='ERROR');"
            "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))",
        )
        ray_ips = json.loads(nodes.strip().splitlines()[-1])
        if ray_ips != sorted(lab.FABRIC.values()):
            problems.append("Ray node addresses %s" % ray_ips)
        observed = "API on %s:%s only; Ray nodes %s; no privileged container, no dashboard; %s" % (
            lab.FABRIC[lab.HEAD],
            lab.API_PORT,
            ray_ips,
            "; ".join(notes),
        )
        return not problems, ("PROBLEMS: %s; " % "; ".join(problems) if problems else "") + observed

    suite.case("security-defaults", "API and Ray on the fabric address, no --privileged, no dashboard", body)


MP = ("-e", "vllm_server_backend=mp")
# A killed mp rank must fail the deploy this soon after the kill (issue: a head that waits forever).
MP_KILL_BOUND = 30


def rank_containers():
    """{node: status of its vllm-mp container or None} and {node: its Ray containers}."""
    ranks, rays = {}, {}
    for host in lab.NODES:
        names = lab.node(host, "docker", "ps", "-a", "--format", "{{.Names}} {{.State}}").split("\n")
        pairs = dict(line.split(" ", 1) for line in names if line.strip())
        ranks[host] = pairs.get("vllm-mp")
        rays[host] = sorted(n for n in pairs if n.startswith("ray-"))
    return ranks, rays


def case_mp(suite):
    """vllm_server_backend=mp: a worker rank killed while the head waits, a worker unreachable before the
    ranks start, each repaired by the next deploy; then the switch back to Ray leaves no rank container."""

    def killed():
        forget_restarts()
        before = lab.snapshots()
        killed_at = {}

        def kill_worker_rank():
            lab.node(lab.WORKER, "docker", "kill", "vllm-mp", check=False)
            killed_at["done"] = time.monotonic()

        def kill(line, _proc):
            # The worker rank was just (re)created with the switch from Ray; the head now waits for it
            # (and prints nothing while it does): kill the worker's rank 5 s into the wait.
            if "TASK [dgx_spark.vllm.vllm_server : Start the head rank" in line and "timer" not in killed_at:
                killed_at["timer"] = threading.Timer(5, kill_worker_rank)
                killed_at["timer"].start()

        started = time.monotonic()
        res = lab.deploy(*MP, timeout=FAIL_BOUND + 60, on_line=kill)
        if "timer" in killed_at:
            killed_at["timer"].join()
        after_kill = started + res.seconds - killed_at["done"] if "done" in killed_at else None
        play, failed_host, line = lab.first_failure(res)
        named = "rank 1 container vllm-mp on %s" % lab.WORKER in line
        damage = lab.intact(before, lab.snapshots())
        observed = "exit %s; failed %.1fs after the kill in %s on %s, %s; %s" % (
            res.rc,
            after_kill if after_kill is not None else -1,
            play,
            failed_host,
            "names the worker" if named else "does NOT name the worker (%s)" % line[:200],
            damage or "model+image intact",
        )
        ok = res.rc != 0 and after_kill is not None and after_kill <= MP_KILL_BOUND and named
        return ok and play == "vllm_server" and not damage, observed

    suite.case(
        "mp-worker-killed-while-head-waits",
        "deploy fails <%ss after the kill naming vllm-mp on %s" % (MP_KILL_BOUND, lab.WORKER),
        killed,
    )

    def serves_mp():
        before = lab.snapshots()
        res = lab.deploy(*MP, timeout=REPAIR_BOUND)
        ok, text = serving()
        ranks, rays = rank_containers()
        damage = lab.intact(before, lab.snapshots())
        observed = "deploy exit %s in %ss; completion %s; ranks %s; Ray containers %s; %s" % (
            res.rc,
            res.seconds,
            "ok" if ok else "FAILED (%s)" % text,
            ranks,
            rays,
            damage or "model+image intact",
        )
        good = all(state == "running" for state in ranks.values()) and not any(rays.values())
        return res.rc == 0 and ok and good and not damage, observed

    suite.case("mp-worker-killed-while-head-waits/next-run", "next deploy serves with mp; no Ray container", serves_mp)

    def unreachable():
        forget_restarts()
        before = lab.snapshots()
        # A changed setting that would start every rank again: nothing may start without the worker, and
        # the engine keeps serving the settings it has.
        res = deploy_with_worker_cut_off("vllm_server", *MP, "-e", "vllm_server_max_model_len=384")
        return fails_naming(res, lab.WORKER, "vllm_server", FAIL_BOUND, before)

    suite.case(
        "mp-worker-unreachable-before-start",
        "deploy fails <%ss naming %s in vllm_server" % (FAIL_BOUND, lab.WORKER),
        unreachable,
    )
    suite.case("mp-worker-unreachable-before-start/next-run", "next deploy serves with mp", serves_mp)

    def back_to_ray():
        res = lab.deploy(timeout=REPAIR_BOUND)
        ok, text = serving()
        ranks, rays = rank_containers()
        observed = "deploy exit %s in %ss; completion %s; ranks %s; Ray containers %s" % (
            res.rc,
            res.seconds,
            "ok" if ok else "FAILED (%s)" % text,
            ranks,
            rays,
        )
        good = not any(ranks.values()) and all(len(names) == 1 for names in rays.values())
        return res.rc == 0 and ok and good, observed

    suite.case("mp-switch-back-to-ray", "serves over Ray; no vllm-mp container left", back_to_ray)


def body(suite, args, fresh):
    def selected(name):
        return lab.selected(args, name)

    cases = [
        ("interrupted", lambda: case_interrupted(suite, fresh)),
        ("unreachable", lambda: case_worker_unreachable(suite)),
        ("joining", lambda: case_worker_ray_dies_while_joining(suite)),
        ("worker-ray", lambda: case_ray_killed(suite, "worker-ray-container-killed", lab.WORKER, "ray-worker")),
        ("head-ray", lambda: case_ray_killed(suite, "head-ray-container-killed", lab.HEAD, "ray-head")),
        ("engine-core-killed", lambda: case_engine_core_killed(suite)),
        ("crash-loop", lambda: case_crash_loop(suite)),
        ("node-restart", lambda: case_node_restarted(suite)),
        ("engine", lambda: case_engine_stopped(suite)),
        ("image-copy", lambda: case_engine_dies_during_copy(suite)),
        ("check-mode", lambda: case_check_mode_summary(suite)),
        ("tags-model", lambda: case_tags_model(suite)),
        ("security", lambda: case_security(suite)),
        ("secrets", lambda: case_secrets(suite, restore=not selected("mp"))),
        ("mp", lambda: case_mp(suite)),
    ]
    os.makedirs(REPORTS, exist_ok=True)
    # A subset without the interrupted deploy (which tears down first) starts from a lab that serves over Ray,
    # as the whole suite leaves it between cases (the lab Molecule leaves up serves over mp): one deploy, which
    # changes nothing on a converged lab.
    if not selected("interrupted"):
        res = lab.deploy(timeout=400)
        print("# initial deploy: exit %s in %ss" % (res.rc, res.seconds), flush=True)
    for name, run_case in cases:
        if selected(name):
            run_case()


if __name__ == "__main__":
    sys.exit(lab.main_wrapper("faults", body))
