#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until the Ray cluster has every expected node alive and every expected GPU."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ray_cluster_wait
short_description: Wait for the expected Ray nodes and GPUs, naming what is missing
description:
  - Runs on the head node. Polls the Ray cluster from inside the head container
    (C(docker exec HEAD python3 -c SCRIPT), which reads the GCS node table with Ray's C(GcsClient), the
    table C(ray.nodes()) reads, without starting a Ray driver) at most every second until the alive nodes
    are exactly the expected ones (matched by fabric IP) and their GPUs add up to the expected total.
  - The node table is used rather than parsing C(ray status). It names each node by its IP (so a
    missing node can be named by inventory host), says alive or dead, and is current, while
    C(ray status) prints the autoscaler's periodic snapshot in a human format that lags behind.
  - Fails at once when the head container is not running, or restarts while waited for (Ray exited in it).
    On timeout, names each missing node by inventory host and IP, and includes the end of the head's Ray
    log; the logs of the missing workers live on their own engines, so the role collects those
    (RV(missing) lists them).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.docker
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.attributes.FACTS
options:
  container:
    description: Name of the Ray head container on this node.
    type: str
    default: ray-head
  expected_nodes:
    description: Every node that must be alive, head included, as inventory host and fabric IP.
    type: list
    elements: dict
    required: true
    suboptions:
      host:
        description: Inventory hostname (used in messages).
        type: str
        required: true
      ip:
        description: The node's fabric IP (its C(--node-ip-address)).
        type: str
        required: true
      started_at:
        description:
          - When the node's Ray container last started, as Docker reports it (C(State.StartedAt), RFC 3339;
            RV(dgx_spark.vllm.ray_node#module:container.started_at)).
          - A node at this IP that registered with the head earlier (its raylet's own start time, on the same
            node's clock) is a Ray node from before that start, which Ray has not marked dead yet; the wait
            goes on until it is gone, since vLLM could place a worker on it.
        type: str
  expected_gpus:
    description: Total GPUs the alive nodes must declare.
    type: int
    required: true
  timeout:
    description: Seconds to wait in all.
    type: int
    default: 300
  interval:
    description: Seconds between polls (at most 1).
    type: float
    default: 1.0
  poll_timeout:
    description: Seconds one poll may take inside the container (it blocks while the GCS is unreachable).
    type: int
    default: 10
  watch:
    description:
      - Seconds one poll keeps watching inside the container, re-reading the nodes every 0.1 s, before it
        answers; it answers at once when the expected nodes and GPUs are there. A join is then noticed
        within about 0.1 s instead of one Python start later. C(0) asks once per poll.
      - While it watches, the head's container is checked every 0.5 s beside it and the workers' every 2.5 s
        (each check opens a connection to the worker's engine); a failure found there ends it at once. No watch
        runs past O(timeout).
      - The first poll always asks once, so a cluster already complete (a re-converge) costs one read.
    type: float
    default: 60.0
  workers:
    description:
      - The workers' Ray containers, watched from here through each worker's Docker engine (C(ssh://) goes through
        the ssh binary and the head's node-to-node key). A worker container that exits, or restarts more than
        twice while waited for (Ray keeps exiting in it), stops the wait at once, naming the worker, with its log.
        One or two restarts are let be; a worker left on a head that went away exits once and its restart
        policy brings it back to the new head.
      - An engine that cannot be reached is reported in RV(worker_engines) and only the join is waited for.
      - Watched only once a poll has not found the cluster complete, so a complete cluster opens no worker engine.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: Inventory hostname (used in messages).
        type: str
        required: true
      docker_host:
        description: The worker's Docker engine, e.g. C(ssh://root@198.18.100.12).
        type: str
        required: true
      container:
        description: The worker's Ray container.
        type: str
        default: ray-worker
  python:
    description: Python interpreter inside the head container.
    type: str
    default: python3
  log_lines:
    description: Lines of the head container's log included in a failure.
    type: int
    default: 40
"""

EXAMPLES = r"""
- name: Wait for both Sparks and both GPUs
  dgx_spark.vllm.ray_cluster_wait:
    container: ray-head
    expected_nodes:
      - {host: spark-a, ip: 192.168.100.11}
      - {host: spark-b, ip: 192.168.100.12}
    expected_gpus: 2
    timeout: 180
"""

RETURN = r"""
worker_engines:
  description:
    - For each worker in O(workers), C(watched) or why its engine could not be watched.
    - Empty when the first poll found the cluster complete (nothing was watched).
  returned: always
  type: dict
  sample: {"spark-2": "watched"}
nodes:
  description: Alive Ray nodes at the end (IP, hostname, GPUs).
  returned: always
  type: list
  elements: dict
alive_nodes:
  description: Number of alive nodes at the end.
  returned: always
  type: int
gpus:
  description: GPUs declared by the alive nodes at the end.
  returned: always
  type: float
missing:
  description: Expected nodes that are not alive, as C(host) and C(ip).
  returned: always
  type: list
  elements: dict
stale:
  description:
    - Expected nodes seen alive only from before their Ray container's last start (O(expected_nodes[].started_at)),
      which Ray has not marked dead yet, as C(host) and C(ip).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds waited.
  returned: always
  type: float
progress:
  description: One record (seconds, state) each time the observed state changed.
  returned: always
  type: list
  elements: dict
head_log:
  description: End of the head container's log.
  returned: on failure
  type: str
"""

import contextlib
import json
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _container, _ray
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import (
    DOCKER_COMMON_ARGS,
    WATCHED_CONTAINER_OPTIONS,
    DockerException,
    docker_client,
    find_container,
    log_tail,
    watch_containers,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._wait import StopWaiting, wait_for

# Seconds between the checks of the head's container, and of the workers' (each a new SSH connection and
# `docker system dial-stdio` on the worker, CPU its starting Ray wants), while a watch runs.
HEAD_CHECK_S = 0.5
WORKER_CHECK_S = 2.5


class ClusterWait:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.summary = None
        self.alive = []
        self.error = None
        self.restarts = 0
        self.first_argv = []
        self.expectation = []
        self.deadline = 0.0
        self.engines = {}
        self.watched = []
        self.worker_log = ""

    def run(self):
        ips = [n["ip"] for n in self.p["expected_nodes"]]
        if len(set(ips)) != len(ips):
            self.module.fail_json(
                msg="expected_nodes: two nodes share one IP (%s); each node needs its own fabric IP" % ips
            )
        client = docker_client(self.module)
        container = find_container(client, self.p["container"])
        if container is None or container.status != "running":
            status = "missing" if container is None else container.status
            self.module.fail_json(
                msg="The Ray head container %s is not running on this node (%s); start it with ray_node "
                "(role ray_cluster) first." % (self.p["container"], status),
                head_log=log_tail(container, self.p["log_lines"]) if container is not None else "",
                **self.empty(),
            )
        self.restarts = container.attrs.get("RestartCount", 0)
        # A converged cluster is recognised by the first query alone: one read of the node table, and the
        # workers' engines are not opened. Only a cluster not complete yet is watched, each exec for up to
        # `watch` seconds (the join is seen within 0.1 s, not a fresh Python later), with its workers'
        # containers watched for an exit.
        self.first_argv = [self.p["python"], "-c", _ray.RAY_QUERY, str(self.p["poll_timeout"])]
        # What a watching query stops on (after its seconds, see watch()).
        self.expectation = [
            json.dumps(sorted(ips)),
            str(float(self.p["expected_gpus"])),
            json.dumps(_ray.not_before(self.p["expected_nodes"])),
        ]
        self.watched, self.engines, self.watching = [], {}, False
        self.deadline = time.monotonic() + self.p["timeout"]
        res = wait_for(lambda: self.poll(container), self.p["timeout"], self.p["interval"])
        out = dict(
            changed=False,
            nodes=self.alive,
            alive_nodes=len(self.alive),
            gpus=self.summary["gpus"] if self.summary else 0.0,
            missing=self.summary["missing"] if self.summary else self.all_missing(),
            stale=self.summary["stale"] if self.summary else [],
            elapsed=round(res.elapsed, 2),
            progress=res.progress,
            worker_engines=self.engines,
        )
        if res.ok:
            self.module.exit_json(**out)
        out["head_log"] = log_tail(container, self.p["log_lines"])
        self.module.fail_json(msg=self.failure_message(res), **out)

    def poll(self, container):
        self.check_head(container)
        self.check_workers()
        watching = self.watching and self.p["watch"] > 0
        result = self.watch(container) if watching else self.query(container, self.first_argv)
        text = result.output.decode("utf-8", "replace") if isinstance(result.output, bytes) else str(result.output)
        doc = _ray.parse_query_output(text) if result.exit_code == 0 else None
        if doc is None:
            lines = [line for line in text.strip().splitlines() if line.strip()]
            self.error = lines[-1] if lines else "exit code %s, no output" % result.exit_code
            self.start_watching(False)
            return False, "Ray not answering: %s" % self.error
        self.error = None
        state = _ray.cluster_state(doc)
        self.alive = state["alive"]
        done, self.summary = _ray.compare(state, self.p["expected_nodes"], self.p["expected_gpus"])
        self.start_watching(done)
        return done, _ray.progress_line(self.summary)

    def check_head(self, container):
        try:
            container.reload()
        except DockerException as exc:
            raise StopWaiting("the head's Docker engine stopped answering: %s" % exc) from exc
        gone = _container.exited_how(container, self.restarts)
        if gone == "restarted":
            raise StopWaiting("the head container %s restarted: Ray exited in it" % self.p["container"])
        if gone:
            raise StopWaiting("the head container %s is %s" % (self.p["container"], gone))

    def query(self, container, argv):
        try:
            return container.exec_run(argv)
        except DockerException as exc:
            raise StopWaiting("docker exec in %s failed: %s" % (self.p["container"], exc)) from exc

    def watch(self, container):
        """One watching query, for up to `watch` seconds (no later than the timeout): one Ray import, so a join
        is seen within 0.1 s; the head and the workers are checked beside it, and a failure ends it."""
        seconds = max(1.0, min(self.p["watch"], self.deadline - time.monotonic()))
        argv = [*self.first_argv, "%g" % seconds, *self.expectation]
        answer = {}

        def run():
            try:
                answer["result"] = self.query(container, argv)
            except StopWaiting as exc:
                answer["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        workers_checked = time.monotonic()
        try:
            while True:
                thread.join(HEAD_CHECK_S)
                if not thread.is_alive():
                    break
                self.check_head(container)
                if time.monotonic() - workers_checked >= WORKER_CHECK_S:
                    self.check_workers()
                    workers_checked = time.monotonic()
        except StopWaiting:
            self.stop_watch(container)
            raise
        if "error" in answer:
            raise answer["error"]
        return answer["result"]

    def stop_watch(self, container):
        """Ends the watching query in the head container; one that cannot be reached ends on its alarm."""
        with contextlib.suppress(DockerException):
            container.exec_run([self.p["python"], "-c", _ray.STOP_WATCH, _ray.RAY_QUERY])

    def start_watching(self, done):
        """After the first query that does not show the cluster complete: watch the workers' containers."""
        if not done and not self.watching:
            self.watching = True
            self.watch_workers()

    def watch_workers(self):
        """Find each worker's Ray container; note its restart count to compare against."""
        self.watched, self.engines = watch_containers(self.p["workers"], self.p["docker_timeout"])

    def check_workers(self):
        for worker, found, restarts in self.watched:
            try:
                found.reload()
            except DockerException:
                continue  # the join decides; an engine that stops answering is not Ray's failure
            gone = _container.exited_how(found, restarts, _ray.WORKER_RESTARTS_TOLERATED)
            if gone in ("exited", "dead", "restarted"):
                self.worker_log = "--- %s %s log:\n%s" % (
                    worker["host"],
                    worker["container"],
                    log_tail(found, self.p["log_lines"]),
                )
                raise StopWaiting(
                    "the Ray container %s on %s %s: Ray exited in it" % (worker["container"], worker["host"], gone)
                )

    def all_missing(self):
        return [{"host": n["host"], "ip": n["ip"]} for n in self.p["expected_nodes"]]

    def empty(self):
        return dict(
            nodes=[],
            alive_nodes=0,
            gpus=0.0,
            missing=self.all_missing(),
            stale=[],
            elapsed=0.0,
            progress=[],
            worker_engines={},
        )

    def failure_message(self, res):
        if res.stopped:
            head = "Stopped waiting for the Ray cluster after %.0fs: %s." % (res.elapsed, res.stopped)
        else:
            head = "The Ray cluster was not complete after %ss." % self.p["timeout"]
        if self.summary is None:
            never = "%s The head never answered a query%s." % (
                head,
                " (last error: %s)" % self.error if self.error else " before that",
            )
            return never + ("\n" + self.worker_log if self.worker_log else "")
        parts = [head, "Last seen: %s." % _ray.progress_line(self.summary)]
        for node in self.summary["missing"]:
            parts.append(
                "Missing node %s (%s): its Ray worker never joined or died; check its container and Docker engine."
                % (node["host"], node["ip"])
            )
        for node in self.summary.get("stale") or []:
            parts.append(
                "Node %s (%s) is still listed alive from before its Ray container last started: Ray marks a raylet "
                "dead after its health checks fail (about 30 s by default)." % (node["host"], node["ip"])
            )
        if self.summary["unexpected_ips"]:
            parts.append("Nodes not in the inventory joined: %s." % ", ".join(self.summary["unexpected_ips"]))
        if (
            not self.summary["missing"]
            and not self.summary["stale"]
            and self.summary["gpus"] != self.summary["expected_gpus"]
        ):
            parts.append(
                "Every node is alive but the GPUs do not add up (%g, expected %g): check gpus/declared_gpus per node."
                % (self.summary["gpus"], self.summary["expected_gpus"])
            )
        if self.error:
            parts.append("Last query error: %s." % self.error)
        if self.worker_log:
            parts.append("\n" + self.worker_log)
        return " ".join(parts)


def main():
    argument_spec = dict(
        container=dict(type="str", default="ray-head"),
        expected_nodes=dict(
            type="list",
            elements="dict",
            required=True,
            options=dict(
                host=dict(type="str", required=True), ip=dict(type="str", required=True), started_at=dict(type="str")
            ),
        ),
        expected_gpus=dict(type="int", required=True),
        timeout=dict(type="int", default=300),
        interval=dict(type="float", default=1.0),
        poll_timeout=dict(type="int", default=10),
        watch=dict(type="float", default=60.0),
        workers=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(WATCHED_CONTAINER_OPTIONS, container=dict(type="str", default="ray-worker")),
        ),
        python=dict(type="str", default="python3"),
        log_lines=dict(type="int", default=40),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    ClusterWait(module).run()


if __name__ == "__main__":
    main()
