#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: nccl_test
short_description: Bounded NCCL all-reduce and all-gather across the nodes, against a bus bandwidth threshold
description:
  - Runs all-reduce and all-gather with C(torch.distributed) (NCCL backend, one process per GPU,
    started by C(torch.distributed.run)) at bounded sizes, with warm-up and timed iterations, and
    checks every result value.
  - Run it on every node at once (one task over the group); the head (O(node_rank=0)) reports the
    numbers. Rendezvous is on O(master_addr), the head's fabric address.
  - Reports algorithm and bus bandwidth per size as nccl-tests defines them
    (busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather) and the transport NCCL chose
    (C(NET/IB), C(NET/Socket), C(P2P), C(SHM)), read from its C(NCCL_DEBUG=INFO) lines.
  - Fails when the peak bus bandwidth of O(threshold_op) is below O(threshold_gbps), naming the
    likely cause (socket transport, one HCA only, MTU or GID index).
  - With O(image), runs inside that image through the node's Docker engine (host network and IPC,
    all GPUs, O(devices)), with the entrypoint overridden by O(python). Without it, runs O(python) on the node.
  - A node without an NVIDIA GPU, or an image whose PyTorch sees none, is reported as skipped with
    the reason, never as a number.
  - Before the test, and also where it is skipped, reads which NCCL library the image's Python loads
    (RV(library)), that is the file vLLM's pynccl opens (C(libnccl.so.2) or C(VLLM_NCCL_SO_PATH)) and the
    one torch's calls bind to, each with its version and whether the pip wheel or the system package
    installed it; C(not available) with the reason where there is none (a CPU build of torch).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.docker
attributes:
  check_mode:
    support: full
    details: The test changes nothing on the node, so it also runs in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Never reports a change.
options:
  master_addr:
    description: Address of the head node on the fabric; every node's rank 0 process rendezvous there.
    type: str
    required: true
  master_port:
    description: TCP port for the rendezvous on O(master_addr).
    type: int
    default: 29511
  nnodes:
    description: Number of nodes taking part.
    type: int
    default: 1
  node_rank:
    description: This node's rank, 0 on the head.
    type: int
    default: 0
  gpus_per_node:
    description: Processes (GPUs) per node. By default, the number of GPUs nvidia-smi lists here.
    type: int
  image:
    description: Runtime image to run the test in. When omitted, O(python) runs on the node itself.
    type: str
  devices:
    description: Host devices passed into the container, for example V(/dev/infiniband).
    type: list
    elements: str
    default: []
  python:
    description: Python interpreter with PyTorch, inside O(image) or on the node.
    type: str
    default: python3
  env:
    description:
      - Environment for every rank, typically the dict from M(dgx_spark.vllm.nccl_env).
      - C(NCCL_DEBUG=INFO) is added when absent, since the transport is read from it.
    type: dict
    default: {}
  sizes:
    description: Message sizes in bytes, each at most 1 GiB per rank.
    type: list
    elements: int
    default: [8388608, 67108864, 268435456]
  ops:
    description: Collectives to run.
    type: list
    elements: str
    choices: [all_reduce, all_gather]
    default: [all_reduce, all_gather]
  warmup:
    description: Untimed iterations before timing each size.
    type: int
    default: 5
  iters:
    description: Timed iterations per size.
    type: int
    default: 20
  timeout:
    description: Seconds the whole test may take, rendezvous included.
    type: int
    default: 600
  threshold_gbps:
    description: Lowest acceptable peak bus bandwidth of O(threshold_op), GB/s (10^9 bytes).
    type: float
    default: 21.875
  threshold_op:
    description: Collective whose peak bus bandwidth is held to O(threshold_gbps).
    type: str
    choices: [all_reduce, all_gather]
    default: all_gather
  run_test:
    description: Run the collective test. With V(false), only the NCCL library is read (RV(library)).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Bounded NCCL test across both Sparks, inside the runtime image
  dgx_spark.vllm.nccl_test:
    image: "{{ runtime_image_id }}"
    devices: [/dev/infiniband]
    env: "{{ nccl_env.env }}"
    master_addr: "{{ hostvars[groups['spark_head'][0]].fabric_ip }}"
    nnodes: "{{ groups['spark'] | length }}"
    node_rank: "{{ groups['spark'].index(inventory_hostname) }}"
  register: nccl

- name: Which NCCL library the runtime image loads, without running a collective
  dgx_spark.vllm.nccl_test:
    image: "{{ runtime_image_id }}"
    master_addr: 127.0.0.1
    run_test: false
  register: nccl_library
"""

RETURN = r"""
skipped:
  description: True when there is no GPU to test; RV(reason) says why.
  returned: always
  type: bool
reason:
  description: Why the test was skipped.
  returned: when skipped
  type: str
  sample: nvidia-smi lists no GPU on this node
results:
  description: One row per collective and size (on the head only).
  returned: always
  type: list
  elements: dict
  sample: [{"op": "all_gather", "bytes": 268435456, "seconds": 0.000582, "correct": true,
            "algbw_gbps": 461.085, "busbw_gbps": 230.542}]
peak_busbw_gbps:
  description: Highest bus bandwidth per collective, GB/s.
  returned: always
  type: dict
  sample: {"all_gather": 230.542, "all_reduce": 298.921}
transport:
  description: What NCCL chose, from its log.
  returned: always
  type: dict
  sample: {"transports": ["NET/IB"], "ib_devices": ["roceP2p1s0f1", "rocep1s0f1"], "networks": ["IB"]}
passed:
  description: Values right and peak bus bandwidth at or above the threshold (head only; workers report true).
  returned: always
  type: bool
problems:
  description: What failed, each with its likely cause.
  returned: always
  type: list
  elements: str
world_size:
  description: Number of ranks.
  returned: when the test ran
  type: int
command:
  description: The command line that ran (inside the container when O(image) is set).
  returned: when the test ran
  type: list
  elements: str
entrypoint:
  description: The entrypoint that replaced the image's own.
  returned: when O(image) is set and the test ran
  type: str
log_tail:
  description: Last lines of the test's output, NCCL's included.
  returned: when the test ran
  type: str
library:
  description:
    - The NCCL library the image's Python loads, read on this node; C(line) says it in one line.
    - C(build) is C(pip) (an C(nvidia-nccl-cu*) wheel), C(system) (an OS package such as C(libnccl2)),
      C(static) (linked into torch) or C(other); C(builds) holds every build in use (two when torch's
      calls and vLLM's pynccl load different files).
  returned: always
  type: dict
  sample:
    available: true
    build: pip
    builds: [pip]
    name: libnccl.so.2
    version: 2.28.9
    version_from: ncclGetVersion
    package: nvidia-nccl-cu13 2.28.9
    path: /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
    line: >-
      libnccl.so.2 2.28.9 (pip nvidia-nccl-cu13 2.28.9)
      /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
"""

import inspect
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_payload
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import DOCKER_COMMON_ARGS, APIError, docker_client
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_library import describe
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_test import (
    DEFAULT_SIZES,
    DEFAULT_THRESHOLD_GBPS,
    OPS,
    PAYLOAD_NAME,
    check_params,
    launch_args,
    parse_payload_output,
    verdict,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nvidia_smi import NvidiaSmi, NvidiaSmiError

# Created by the NVIDIA driver on a node with a real GPU.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"

CONTAINER_DIR = "/opt/dgx-spark-nccl-test"
LOG_TAIL_LINES = 60
RC_TIMEOUT = 124  # coreutils timeout


def payload_source():
    """The payload's text, from the collection (also when AnsiballZ runs it from a zip)."""
    loader = getattr(_nccl_payload, "__loader__", None)
    source = loader.get_source(_nccl_payload.__name__) if hasattr(loader, "get_source") else None
    source = source or inspect.getsource(_nccl_payload)
    # Ansible's collection loader answers bytes, the standard loaders text.
    return source.decode("utf-8") if isinstance(source, bytes) else source


class NcclTest:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.library = None

    def skipped(self, reason):
        return dict(
            changed=False,
            skipped=True,
            reason=reason,
            results=[],
            peak_busbw_gbps={},
            transport={},
            passed=False,
            problems=[],
            library=self.library,
        )

    def read_library(self, gpus, payload):
        """Which libnccl the image's Python loads: a short run of the payload, GPUs passed where there are any."""
        rc, log, _command = self.run([payload, "--library"], gpus, test=False)
        found = parse_payload_output(log)
        if rc == 0 and found and "library" in found:
            return describe(found["library"])
        last = (log.strip().splitlines() or ["no output"])[-1]
        reason = "the library read exited %d: %s" % (rc, last)
        return dict(available=False, build=None, builds=[], reason=reason, line="not available: %s" % reason)

    def gpus_here(self):
        smi = NvidiaSmi(self.module)
        if not smi.present:
            return 0, "nvidia-smi is not installed on this node (no NVIDIA driver): no GPU to test"
        try:
            count = len(smi.query_gpus())
        except NvidiaSmiError as exc:
            return 0, "nvidia-smi cannot list GPUs: %s" % exc
        if count and not os.path.exists(NVIDIA_CONTROL_DEVICE):
            # An nvidia-smi without the driver's device nodes (the lab's simulator) is no GPU to test.
            return 0, "nvidia-smi lists %d GPU(s) but %s is missing: no NVIDIA device to test" % (
                count,
                NVIDIA_CONTROL_DEVICE,
            )
        return count, None if count else "nvidia-smi lists no GPU on this node"

    def run(self, args, gpus=True, test=True):
        return self.run_image(args, gpus, test) if self.params["image"] else self.run_host(args)

    def run_host(self, args):
        timeout = self.module.get_bin_path("timeout", required=True)
        python = self.module.get_bin_path(self.params["python"], required=True)
        command = [python, *args]
        rc, out, err = self.module.run_command(
            [timeout, "--kill-after=10", str(self.params["timeout"]), *command],
            environ_update=self.env(),
        )
        return rc, out + err, command

    def run_image(self, args, gpus, test):
        client = docker_client(self.module)
        devices = ["%s:%s:rwm" % (d, d) for d in self.params["devices"]]
        command = [self.params["python"], *args]
        try:
            container = self.start_container(client, args, devices, gpus, test)
        except APIError as exc:
            if "could not select device driver" in str(exc):
                self.module.fail_json(
                    msg="image: the Docker engine on this node cannot give containers its GPUs (%s); install the "
                    "NVIDIA Container Toolkit and restart Docker" % exc.explanation
                )
            raise
        try:
            try:
                rc = container.wait(timeout=self.params["timeout"])["StatusCode"]
            except Exception:  # requests' timeout: a peer never joined or NCCL hung
                rc = RC_TIMEOUT
            log = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            container.remove(force=True)
        return rc, log, command

    def start_container(self, client, args, devices, gpus, test):
        from docker.types import DeviceRequest, Ulimit  # noqa: PLC0415 - only with image, guarded by docker_client()

        # The library read needs no network, RDMA or locked memory (an engine without CAP_SYS_RESOURCE refuses it).
        return client.containers.run(
            self.params["image"],
            entrypoint=[self.params["python"]],
            command=args,
            detach=True,
            network_mode="host" if test else "none",
            ipc_mode="host" if test else None,
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else [],
            devices=devices if test else [],
            environment=self.env(),
            volumes={self.workdir: {"bind": CONTAINER_DIR, "mode": "ro"}},
            ulimits=[Ulimit(name="memlock", soft=-1, hard=-1)] if test else [],
            labels={"dgx_spark.vllm.role": "nccl_test"},
        )

    def env(self):
        env = dict((k, str(v)) for k, v in self.params["env"].items())
        env.setdefault("NCCL_DEBUG", "INFO")
        return env

    def test(self):
        errors = check_params(self.params)
        if errors:
            self.module.fail_json(msg="; ".join(errors))
        count, reason = self.gpus_here()
        gpus = self.params["gpus_per_node"] or count
        self.workdir = tempfile.mkdtemp(prefix="nccl_test_", dir=self.module.tmpdir)
        try:
            with open(os.path.join(self.workdir, PAYLOAD_NAME), "w", encoding="utf-8") as handle:
                handle.write(payload_source())
            os.chmod(self.workdir, 0o755)  # noqa: S103 - the container user must read the payload
            payload = (CONTAINER_DIR + "/" if self.params["image"] else self.workdir + "/") + PAYLOAD_NAME
            self.library = self.read_library(count > 0, payload)
            if not count:
                return self.skipped(reason)
            if not self.params["run_test"]:
                return self.skipped("run_test is false: only the NCCL library was read")
            rc, log, command = self.run(launch_args(self.params, gpus, payload))
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.judge(rc, log, command)

    def judge(self, rc, log, command):
        tail = "\n".join(log.splitlines()[-LOG_TAIL_LINES:])
        extra = dict(command=command, log_tail=tail, library=self.library)
        if self.params["image"]:
            extra["entrypoint"] = self.params["python"]
        payload = parse_payload_output(log)
        if payload and payload.get("skipped"):
            result = self.skipped(payload["reason"])
            result.update(extra)
            return result
        if rc == RC_TIMEOUT:
            self.module.fail_json(
                msg="nccl_test timed out after %d s: a node did not join the rendezvous at %s:%d, or NCCL hung"
                % (self.params["timeout"], self.params["master_addr"], self.params["master_port"]),
                **extra,
            )
        if payload is None:
            if rc == 0 and self.params["node_rank"] != 0:
                # Workers take part; the head prints the numbers.
                return dict(
                    changed=False,
                    skipped=False,
                    results=[],
                    peak_busbw_gbps={},
                    transport={},
                    passed=True,
                    problems=[],
                    **extra,
                )
            last = log.strip().splitlines()[-1:] or ["no output"]
            self.module.fail_json(msg="nccl_test exited %d without a result: %s" % (rc, last[0]), **extra)
        if payload.get("failed"):
            self.module.fail_json(msg="nccl_test payload refused to run: %s" % payload["reason"], **extra)
        result = verdict(
            payload, log, self.params["threshold_gbps"], self.params["threshold_op"], self.params["nnodes"]
        )
        result.update(extra, changed=False, skipped=False)
        if not result["passed"] or rc != 0:
            result["problems"] = result["problems"] or ["the test exited %d" % rc]
            self.module.fail_json(msg="; ".join(result["problems"]), **result)
        return result


def main():
    argument_spec = dict(
        master_addr=dict(type="str", required=True),
        master_port=dict(type="int", default=29511),
        nnodes=dict(type="int", default=1),
        node_rank=dict(type="int", default=0),
        gpus_per_node=dict(type="int"),
        image=dict(type="str"),
        devices=dict(type="list", elements="str", default=[]),
        python=dict(type="str", default="python3"),
        env=dict(type="dict", default={}),
        sizes=dict(type="list", elements="int", default=list(DEFAULT_SIZES)),
        ops=dict(type="list", elements="str", choices=list(OPS), default=list(OPS)),
        warmup=dict(type="int", default=5),
        iters=dict(type="int", default=20),
        timeout=dict(type="int", default=600),
        threshold_gbps=dict(type="float", default=DEFAULT_THRESHOLD_GBPS),
        threshold_op=dict(type="str", choices=list(OPS), default="all_gather"),
        run_test=dict(type="bool", default=True),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    module.exit_json(**NcclTest(module).test())


if __name__ == "__main__":
    main()
