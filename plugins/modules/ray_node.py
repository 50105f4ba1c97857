#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Ray head or a Ray worker as a container on the node's Docker engine."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ray_node
short_description: Run the Ray head or a Ray worker as a container on a node
description:
  - Creates, recreates, starts or removes the container that runs C(ray start --block) on one node.
  - The image's own ENTRYPOINT is always overridden (an image whose entrypoint runs its own launcher
    would otherwise swallow the command); the module reads the image's entrypoint and reports what it overrode.
  - The container uses the host network and host IPC, C(--init), a restart policy, the environment
    from the fabric (C(nccl_env)), and the model and cache mounts. GPUs are requested (C(--gpus all))
    only when O(gpus) is above 0; RDMA devices and C(IPC_LOCK) only when O(rdma_devices) is given.
  - Idempotent by a label holding a hash of the container configuration (image ID included),
    unchanged and running is left alone, changed is recreated, stopped is started.
  - After a (re)start the module waits for Ray's "Ray runtime started" line and fails early, with the
    container log, when the container exits instead.
  - A worker may be started before or together with its head; its C(ray start --address) keeps retrying
    the head's GCS (for minutes), and the wait covers that; a timeout says when the GCS never answered.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.docker
  - dgx_spark.vllm.container
  - dgx_spark.vllm.stage_record
  - dgx_spark.vllm.attributes.STATEFUL
options:
  name:
    description: Container name.
    type: str
    required: true
  state:
    description:
      - V(started) makes the container exist with this configuration and run.
      - V(absent) removes it (teardown).
    type: str
    choices: [started, absent]
    default: started
  role:
    description: Whether this node is the Ray head or a worker. Required when O(state=started).
    type: str
    choices: [head, worker]
  image:
    description: Image reference (name:tag or ID) on this node's engine. Required when O(state=started).
    type: str
  node_ip:
    description: This node's fabric address, passed as C(--node-ip-address). Required when O(state=started).
    type: str
  head_address:
    description: The head's fabric address, C(HOST) or C(HOST:PORT). Required for a worker.
    type: str
  ray_port:
    description: Port of the head's GCS (C(--port) on the head, the default port in O(head_address) on workers).
    type: int
    default: 6379
  declared_gpus:
    description:
      - GPUs Ray is told this node has (C(--num-gpus)). Defaults to O(gpus).
      - Declaring GPUs without devices (O(gpus=0), O(declared_gpus=1)) is how the GPU-less lab runs a
        tensor-parallel layout; Ray schedules on the declaration only.
    type: int
  num_cpus:
    description: CPUs Ray is told this node has (C(--num-cpus)); Ray counts them when omitted.
    type: int
  metrics_export_port:
    description:
      - Port of this node's Ray metrics agent, which serves Prometheus metrics (C(--metrics-export-port)).
        Ray picks a free port when omitted. The agent serves them only when the image has C(ray[default]).
    type: int
  dashboard_agent_listen_port:
    description:
      - HTTP port of this node's Ray dashboard agent (C(--dashboard-agent-listen-port)); it listens on the node's
        address and loopback. Ray's default (52365) when omitted. Only C(ray[default]) starts the agent.
    type: int
  dashboard_agent_grpc_port:
    description:
      - gRPC port of this node's Ray dashboard agent (C(--dashboard-agent-grpc-port)); it listens on every
        address. Ray picks a free port when omitted. Only C(ray[default]) starts the agent.
    type: int
  runtime_env_agent_port:
    description:
      - HTTP port of this node's Ray runtime environment agent (C(--runtime-env-agent-port)), on the node's
        address. Ray picks a free port when omitted.
    type: int
  include_dashboard:
    description: Start the Ray dashboard on the head (off by default).
    type: bool
    default: false
  dashboard_host:
    description: Address the dashboard binds to when O(include_dashboard=true).
    type: str
    default: 127.0.0.1
  dashboard_port:
    description: Dashboard port when O(include_dashboard=true).
    type: int
    default: 8265
  privileged:
    description: Run privileged. Not needed for GPUs or RDMA; off by default.
    type: bool
    default: false
  env:
    description: Environment of the container (the fabric's C(fabric_nccl_env) dict).
    type: dict
    default: {}
  labels:
    description: Extra container labels.
    type: dict
    default: {}
  force_restart:
    description:
      - Recreate the container even when its configuration is unchanged
        (e.g. a worker after its head was recreated).
    type: bool
    default: false
  wait_ready:
    description:
      - Wait for C(Ray runtime started) after a (re)start. With V(false) the module returns once the container
        runs; M(dgx_spark.vllm.ray_cluster_wait) then follows the head, and fails at once when its container stops
        or restarts (the ray_cluster role starts the workers sooner this way).
    type: bool
    default: true
  start_timeout:
    description:
      - Seconds to wait for C(Ray runtime started) after a (re)start.
      - For a worker started together with its head this includes the head's start-up.
    type: int
    default: 120
  log_lines:
    description: Lines of the container log included in a failure.
    type: int
    default: 40
"""

EXAMPLES = r"""
- name: Ray head on the head node
  dgx_spark.vllm.ray_node:
    name: ray-head
    role: head
    image: dgx-spark/vllm-runtime:in-service
    node_ip: "{{ fabric_ip }}"
    gpus: 1
    env: "{{ fabric_nccl_env }}"
    rdma_devices: [/dev/infiniband]
    mounts:
      - source: /opt/models
        target: /models
        read_only: true

- name: Ray worker in the lab (no GPU device, one GPU declared)
  dgx_spark.vllm.ray_node:
    name: ray-worker
    role: worker
    image: dgx-spark/vllm-runtime:in-service
    node_ip: "{{ fabric_ip }}"
    head_address: 198.18.100.11
    gpus: 0
    declared_gpus: 1
"""

RETURN = r"""
container:
  description: The container after the run (empty when absent).
  returned: always
  type: dict
  sample: {id: 4f1c0e, name: ray-head, status: running, started_at: "2026-12-02T06:10:03.52Z"}
  contains:
    started_at:
      description: When the container last started (Docker's C(State.StartedAt)); ray_cluster_wait holds the node's
        Ray registration against it.
      type: str
actions:
  description: What was done, in order (V(created), V(recreated), V(started), V(removed)); empty when nothing changed.
  returned: always
  type: list
  elements: str
command:
  description: The C(ray start) command line the container runs.
  returned: when state is started
  type: list
  elements: str
  sample: [ray, start, --head, --port=6379, --node-ip-address=198.18.100.11, --num-gpus=1]
image_entrypoint:
  description: The image's own ENTRYPOINT (null when it has none).
  returned: when state is started
  type: list
  elements: str
entrypoint:
  description: What happened to the entrypoint, in words.
  returned: when state is started
  type: str
  sample: overrode ENTRYPOINT ['/opt/start.sh'] with ['ray']
config_hash:
  description: Hash of the container configuration, stored in the container's label.
  returned: when state is started
  type: str
ready_seconds:
  description: Seconds until Ray reported it started (after a (re)start only).
  returned: when the container was (re)started
  type: float
record:
  description: >-
    What O(record) recorded (C(recorded), the stages; C(reasons), why a stage or the plan was not; C(changed);
    C(plan), whether the plan was, with O(record.plan)).
  returned: when O(record) is given, O(state=started) and not in check mode
  type: dict
  sample: {recorded: [ray_cluster, vllm_server], reasons: {}, changed: true, plan: true}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _container, _ray
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import (
    DOCKER_COMMON_ARGS,
    DockerException,
    ImageNotFound,
    docker_client,
    find_container,
    log_tail,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._stage_state import (
    RECORD_OPTIONS,
    checked_record,
    record_group,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._wait import StopWaiting, wait_for

try:
    from docker import types as docker_types
except ImportError:  # pragma: no cover - docker_client() reports the missing SDK
    docker_types = None


class RayNode:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.result = dict(changed=False, actions=[], container={})

    def run(self):
        if self.p["state"] == "started":
            errors = _ray.check_params(self.p)
            if errors:
                self.module.fail_json(msg="; ".join(errors))
        client = docker_client(self.module)
        current = find_container(client, self.p["name"])
        if self.p["state"] == "absent":
            self.absent(current)
        else:
            self.started(client, current)
            record = self.p["record"]
            # The head's is only the drop checked_record made: nothing to read or write again.
            if record and (record["stages"] or record["plan"]) and not self.module.check_mode:
                self.result["record"] = record_group(self.module, record)
        self.module.exit_json(**self.result)

    def absent(self, current):
        before = _container.describe(current)
        if current is not None:
            self.result["changed"] = True
            self.result["actions"].append("removed")
            if not self.module.check_mode:
                self.docker(current.remove, force=True)
        self.result["diff"] = dict(before=before, after={})

    def started(self, client, current):
        try:
            image = client.images.get(self.p["image"])
        except ImageNotFound:
            self.module.fail_json(
                msg="image: %s is not on this node's Docker engine; run the runtime_image role first "
                "(it builds, verifies and copies the image to every node)" % self.p["image"]
            )
        from_file = _container.module_file_env(self.module, lambda msg: self.module.fail_json(msg=msg))
        config = _ray.desired_config(self.p, image.id, from_file)
        digest = _container.config_hash(config)
        image_entrypoint = (image.attrs.get("Config") or {}).get("Entrypoint")
        self.result.update(
            command=config["entrypoint"] + config["command"],
            image_entrypoint=image_entrypoint,
            entrypoint=_container.entrypoint_message(image_entrypoint, config["entrypoint"]),
            config_hash=digest,
        )
        before = _container.describe(current)
        missing = _container.missing_writable_sources(config, self.p["docker_host"])
        plan = _container.plan(current, digest, self.p["force_restart"] or bool(missing))
        after = dict(before) if plan is None else dict(name=self.p["name"], status="running", config_hash=digest)
        after["command"] = self.result["command"]
        self.result["diff"] = dict(before=before, after=after)
        if plan is None:
            self.result["container"] = self.summary(current)
            return
        self.result["changed"] = True
        self.result["actions"].append(plan)
        if self.module.check_mode:
            return
        # Before the old container goes: a source that cannot be made leaves it as it was.
        problem = _container.make_sources(missing)
        if problem:
            self.module.fail_json(msg=problem, **self.result)
        if plan == "started":
            self.docker(current.start)
            container = current
        else:
            if current is not None:
                self.docker(current.remove, force=True)
            kwargs = _container.create_kwargs(config, self.p["name"], digest, docker_types, _ray.ROLE_LABEL)
            container = self.docker(client.containers.create, **kwargs)
            self.docker(container.start)
        # The start time the Ray wait holds this node's registration against.
        self.docker(container.reload)
        if self.p["wait_ready"]:
            self.wait_ready(container)
        self.result["container"] = self.summary(container)

    def wait_ready(self, container):
        def check():
            container.reload()
            if container.status in ("exited", "dead", "restarting"):
                raise StopWaiting("container %s" % container.status, state=container.status)
            return _ray.READY_MARK in log_tail(container, 200), container.status

        # Reading the log tail is cheap: poll often, so the node's join is reported promptly.
        res = wait_for(check, self.p["start_timeout"], interval=0.25)
        self.result["ready_seconds"] = round(res.elapsed, 2)
        if not res.ok:
            why = res.stopped or "no '%s' within %ss" % (_ray.READY_MARK, self.p["start_timeout"])
            tail = log_tail(container, max(200, self.p["log_lines"]))
            if self.p["role"] == "worker" and _ray.waiting_for_gcs(tail):
                why += "; the head's GCS at %s never answered: is the Ray head up, and the fabric path to it open?" % (
                    _ray.head_address(self.p)
                )
            self.module.fail_json(
                msg="Ray did not start in container %s (%s). %s. Log tail:\n%s"
                % (
                    self.p["name"],
                    why,
                    self.result["entrypoint"],
                    "\n".join(tail.splitlines()[-self.p["log_lines"] :]),
                ),
                **self.result,
            )

    def docker(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except DockerException as exc:
            self.module.fail_json(msg="Docker engine refused %s: %s" % (getattr(call, "__name__", call), exc))
        return None  # pragma: no cover

    @staticmethod
    def summary(container):
        state = container.attrs.get("State") or {}
        return dict(id=container.id, name=container.name, status=container.status, started_at=state.get("StartedAt"))


def main():
    argument_spec = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["started", "absent"], default="started"),
        role=dict(type="str", choices=["head", "worker"]),
        image=dict(type="str"),
        node_ip=dict(type="str"),
        head_address=dict(type="str"),
        ray_port=dict(type="int", default=6379),
        declared_gpus=dict(type="int"),
        num_cpus=dict(type="int"),
        metrics_export_port=dict(type="int"),
        dashboard_agent_listen_port=dict(type="int"),
        dashboard_agent_grpc_port=dict(type="int"),
        runtime_env_agent_port=dict(type="int"),
        include_dashboard=dict(type="bool", default=False),
        dashboard_host=dict(type="str", default="127.0.0.1"),
        dashboard_port=dict(type="int", default=8265),
        privileged=dict(type="bool", default=False),
        env=dict(type="dict", default={}),
        labels=dict(type="dict", default={}),
        force_restart=dict(type="bool", default=False),
        wait_ready=dict(type="bool", default=True),
        start_timeout=dict(type="int", default=120),
        log_lines=dict(type="int", default=40),
        record=dict(type="dict", options=RECORD_OPTIONS),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    argument_spec.update(_container.CONTRACT_ARGS)
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_if=[
            ("state", "started", ("image", "node_ip", "role")),
        ],
        supports_check_mode=True,
    )
    checked_record(module)
    RayNode(module).run()


if __name__ == "__main__":
    main()
