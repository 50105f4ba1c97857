"""Bad inputs to the collection's modules, roles and inventory, on the lab: each must be refused with
a message naming the parameter and the fix, and leave every node's state (containers, images,
interfaces, files under /etc/dgx-spark, /var/lib/dgx-spark, /etc/netplan) exactly as it was.

    .venv/bin/python tests/bad_inputs/run.py [--keep-lab] [--only NAME] [--skip NAME]

Prints `case | expected | observed | seconds` per case and `N passed, N failed` at the end.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults"))

import labkit as lab

ROLE_PLAYBOOK = os.path.join(lab.ROOT, "tests", "bad_inputs", "role.yml")
# The head's first rail as the inventory gives it (name and ADDRESS/PREFIX), and that address alone.
RAIL, HEAD_CIDR = lab.HEAD_RAIL, lab.FABRIC_CIDR[lab.HEAD]
HEAD_IP = lab.FABRIC[lab.HEAD]
FAB = [{"name": RAIL, "address": HEAD_CIDR}]

# (case, kind, target, arguments, parameter the message must name, words of the fix it must give)
# kind: module (ad hoc on the head), role (tests/bad_inputs/role.yml), inventory (deploy-qwen35.yml
# against a copy of the inventory whose hosts.yml is the given text), deploy (deploy-qwen35.yml with
# the arguments as extra vars: refused by its first play, before any stage starts).
CASES = [
    (
        "roce-address-not-ip",
        "module",
        "roce_interface",
        {"name": RAIL, "address": HEAD_IP.rsplit(".", 1)[0] + ".300/24"},
        "address",
        "ADDRESS/PREFIX",
    ),
    (
        "roce-address-no-prefix",
        "module",
        "roce_interface",
        {"name": RAIL, "address": HEAD_IP},
        "address",
        "/24",
    ),
    (
        "roce-mtu-too-big",
        "module",
        "roce_interface",
        {"name": RAIL, "address": HEAD_CIDR, "mtu": 65000},
        "mtu",
        "9216",
    ),
    (
        "roce-interface-missing",
        "module",
        "roce_interface",
        {"name": "enp9s0nope", "address": HEAD_CIDR},
        "name",
        "fabric_interfaces",
    ),
    (
        "gpu-clocks-min-above-max",
        "module",
        "gpu_clocks",
        {"clocks": "locked", "min_mhz": 3000, "max_mhz": 1000},
        "min_mhz",
        "max_mhz",
    ),
    ("gpu-clocks-locked-no-range", "module", "gpu_clocks", {"clocks": "locked"}, "min_mhz", "max_mhz"),
    ("image-two-sources", "module", "vllm_image", {"pull": "a/b:c", "build": {"context": "/srv/ctx"}}, "pull", "build"),
    ("image-no-source", "module", "vllm_image", {}, "pull", "build"),
    ("image-bad-reference", "module", "vllm_image", {"pull": "Not A Valid//Ref!"}, "pull", "reference"),
    (
        "image-chain-peer-port",
        "module",
        "vllm_image",
        {
            "pull": "a/b:c",
            "copy_topology": "chain",
            "ssh_key": "/root/.ssh/id_ed25519",
            "peers": [{"name": "spark-2", "docker_host": "ssh://root@198.18.100.12:2222"}],
        },
        "peers[0].docker_host",
        "copy_topology=star",
    ),
    (
        "model-dir-missing",
        "module",
        "model_files",
        {"path": "/var/lib/dgx-spark/models/none", "download": False},
        "path",
        "download",
    ),
    (
        "model-download-no-repo",
        "module",
        "model_files",
        {"path": "/var/lib/dgx-spark/models/none", "download": True},
        "repo_id",
        "Qwen/",
    ),
    (
        "serve-tp-zero",
        "module",
        "vllm_serve",
        {"state": "checked", "model": lab.MODEL_PATH, "served_model_name": "m", "tensor_parallel_size": 0},
        "tensor_parallel_size",
        "1 or more",
    ),
    (
        "serve-port-out-of-range",
        "module",
        "vllm_serve",
        {"state": "checked", "model": lab.MODEL_PATH, "served_model_name": "m", "port": 70000},
        "port",
        "65535",
    ),
    (
        "serve-port-not-int",
        "module",
        "vllm_serve",
        {"state": "checked", "model": lab.MODEL_PATH, "served_model_name": "m", "port": "eighty"},
        "port",
        "int",
    ),
    (
        "serve-unknown-flag",
        "module",
        "vllm_serve",
        {"state": "checked", "model": lab.MODEL_PATH, "served_model_name": "m", "extra_args": ["--no-such-flag"]},
        "--no-such-flag",
        "extra_args",
    ),
    (
        "serve-managed-flag",
        "module",
        "vllm_serve",
        {
            "state": "checked",
            "model": lab.MODEL_PATH,
            "served_model_name": "m",
            "extra_args": ["--tensor-parallel-size", "4"],
        },
        "--tensor-parallel-size",
        "tensor_parallel_size",
    ),
    (
        "serve-gpu-mem-above-1",
        "module",
        "vllm_serve",
        {"state": "checked", "model": lab.MODEL_PATH, "served_model_name": "m", "gpu_memory_utilization": 1.5},
        "gpu_memory_utilization",
        "(0, 1]",
    ),
    (
        "ray-node-ip-not-ip",
        "module",
        "ray_node",
        {"name": "ray-bad", "role": "head", "image": lab.IN_SERVICE, "node_ip": "not-an-ip"},
        "node_ip",
        "fabric",
    ),
    (
        "ray-worker-no-head",
        "module",
        "ray_node",
        {"name": "ray-bad", "role": "worker", "image": lab.IN_SERVICE, "node_ip": HEAD_IP},
        "head_address",
        "fabric IP",
    ),
    (
        "ray-port-zero",
        "module",
        "ray_node",
        {"name": "ray-bad", "role": "head", "image": lab.IN_SERVICE, "node_ip": HEAD_IP, "ray_port": 0},
        "ray_port",
        "65535",
    ),
    ("role-fabric-mtu", "role", "fabric", {"fabric_interfaces": FAB, "fabric_mtu": 20000}, "fabric_mtu", "9216"),
    ("role-fabric-no-interfaces", "role", "fabric", {"fabric_interfaces": []}, "fabric_interfaces", "host_vars"),
    (
        "role-gpu-clock-range",
        "role",
        "gpu",
        {"gpu_clocks": "locked", "gpu_clocks_min_mhz": 3000, "gpu_clocks_max_mhz": 1000},
        "gpu_clocks_min_mhz",
        "gpu_clocks_max_mhz",
    ),
    (
        "role-image-no-source",
        "role",
        "runtime_image",
        {"runtime_image_pull": ""},
        "runtime_image_pull",
        "runtime_image_build",
    ),
    (
        "role-image-copy-topology",
        "role",
        "runtime_image",
        {"runtime_image_copy_topology": "ring"},
        "runtime_image_copy_topology",
        "chain",
    ),
    ("role-model-path-empty", "role", "model", {"model_path": ""}, "model_path", "group_vars"),
    (
        "role-serve-parallel-mismatch",
        "role",
        "vllm_server",
        {"vllm_server_tensor_parallel_size": 3},
        "tensor_parallel_size",
        "group_vars",
    ),
    ("role-serve-port-type", "role", "vllm_server", {"vllm_server_port": "eighty"}, "vllm_server_port", "int"),
    (
        "role-serve-unknown-flag",
        "role",
        "vllm_server",
        {"vllm_server_extra_args": ["--frobnicate"]},
        "--frobnicate",
        "extra_args",
    ),
    (
        "role-cluster-gpus-type",
        "role",
        "ray_cluster",
        {"cluster_gpus_per_node": "one", "fabric_ip": HEAD_IP},
        "cluster_gpus_per_node",
        "int",
    ),
    (
        "gpu-clocks-max-above-gpu",
        "module",
        "gpu_clocks",
        {"clocks": "locked", "min_mhz": 1000, "max_mhz": 9999},
        "max_mhz",
        "1980 MHz",
    ),
    ("gpu-clocks-unknown-index", "module", "gpu_clocks", {"gpus": [7], "persist": False}, "gpus", "it has [0]"),
    (
        "nccl-env-gid-index-without-rdma",
        "module",
        "nccl_env",
        {
            "interfaces": [{"name": RAIL, "address": HEAD_CIDR}],
            "master_addr": HEAD_IP,
            "allow_socket_fallback": True,
            "extra_env": {"NCCL_IB_GID_INDEX": "3"},
            "path": "/etc/dgx-spark/bad-inputs.env",
        },
        "extra_env",
        "fabric facts",
    ),
    (
        "role-fabric-extra-env-gid-index",
        "role",
        "fabric",
        {"fabric_extra_env": {"NCCL_IB_GID_INDEX": "3"}},
        "fabric_extra_env",
        "NCCL_IB_GID_INDEX",
    ),
    (
        "role-gpu-clocks-no-max",
        "role",
        "gpu",
        {"gpu_clocks": "locked", "gpu_clocks_min_mhz": 1000},
        "gpu_clocks_max_mhz",
        "give both",
    ),
    (
        "deploy-gpu-clocks-max-above-gpu",
        "deploy",
        "deploy",
        {"gpu_clocks": "locked", "gpu_clocks_min_mhz": 1000, "gpu_clocks_max_mhz": 9999},
        "gpu_clocks_max_mhz (9999)",
        "1980 MHz",
    ),
    (
        "deploy-gpu-clocks-min-below-gpu",
        "deploy",
        "deploy",
        {"gpu_clocks": "locked", "gpu_clocks_min_mhz": 10, "gpu_clocks_max_mhz": 1980},
        "gpu_clocks_min_mhz (10)",
        "345 MHz",
    ),
    (
        "deploy-gpu-clocks-inverted",
        "deploy",
        "deploy",
        {"gpu_clocks": "locked", "gpu_clocks_min_mhz": 1980, "gpu_clocks_max_mhz": 1000},
        "gpu_clocks_min_mhz",
        "min <= max",
    ),
    (
        "deploy-fabric-extra-env-hca",
        "deploy",
        "deploy",
        {"fabric_extra_env": {"NCCL_IB_HCA": "mlx5_0"}},
        "fabric_extra_env",
        "NCCL_IB_HCA",
    ),
    # The monitoring stage's settings are checked in the deploy's first play, before any stage changes a node.
    (
        "deploy-monitoring-port",
        "deploy",
        "deploy",
        {"monitoring_prometheus_port": 70000},
        "monitoring_prometheus_port",
        "TCP ports",
    ),
    (
        "deploy-ray-agent-port-unknown",
        "deploy",
        "deploy",
        {"ray_cluster_agent_ports": {"dashboard_port": 8265}},
        "ray_cluster_agent_ports",
        "dashboard_agent_grpc_port",
    ),
    (
        "deploy-nccl-library-unknown",
        "deploy",
        "deploy",
        {"validate_nccl_library": "nccl"},
        "validate_nccl_library",
        "any, pip, system",
    ),
    (
        # Six GPUs over the lab's two or three nodes, all in one tensor-parallel group.
        "deploy-tp-does-not-split-heads",
        "deploy",
        "deploy",
        {
            "cluster_gpus_per_node": 6 // len(lab.NODES),
            "vllm_server_tensor_parallel_size": 6,
            "vllm_server_pipeline_parallel_size": 1,
        },
        "vllm_server_tensor_parallel_size: 6",
        "TP=2 x PP=3",
    ),
    (
        # The lab's model with a context no lab node's memory holds: the KV cache of one sequence is over
        # MemTotal x vLLM's default utilization (tests/unit/fixtures/memory_fit has the 122B on 64 GB nodes).
        "deploy-memory-does-not-fit",
        "deploy",
        "deploy",
        {"vllm_server_max_model_len": 1000000000},
        "vllm_server_max_model_len 1000000000",
        "a lower vllm_server_max_model_len",
    ),
    (
        "deploy-backend-unknown",
        "deploy",
        "deploy",
        {"vllm_server_backend": "slurm"},
        "vllm_server_backend",
        "one of: ray, mp",
    ),
    (
        "deploy-mp-port-not-a-port",
        "deploy",
        "deploy",
        {"vllm_server_backend": "mp", "vllm_server_mp_port": 70000},
        "vllm_server_mp_port",
        "1..65535",
    ),
    (
        "role-model-drop-caches-required",
        "role",
        "model",
        {"model_drop_caches_required": True},
        "model_drop_caches_required",
        "false",
    ),
    (
        "inventory-no-head-group",
        "inventory",
        "deploy",
        "spark:\n  children:\n    spark_workers:\n      hosts:\n        %s:\n        %s:\n" % (lab.HEAD, lab.WORKER),
        "spark_head",
        "inventory",
    ),
    (
        "inventory-two-heads",
        "inventory",
        "deploy",
        "spark:\n  children:\n    spark_head:\n      hosts:\n        %s:\n        %s:\n" % (lab.HEAD, lab.WORKER),
        "spark_head",
        "exactly one",
    ),
]


def run_case(kind, target, args):
    if kind == "module":
        argv = [
            lab.ANSIBLE,
            "-i",
            lab.INVENTORY,
            lab.HEAD,
            "-o",
            "-m",
            "dgx_spark.vllm." + target,
        ]
        # No arguments at all: no -a (ansible reads "-a '{}'" as raw parameters).
        if args:
            argv += ["-a", json.dumps(args)]
        return lab.run(argv, 120)
    if kind == "deploy":
        return lab.playbook(lab.DEPLOY, "-e", json.dumps(args), timeout=300)
    if kind == "role":
        extra = dict(args, bad_inputs_role=target)
        return lab.playbook(ROLE_PLAYBOOK, "-e", json.dumps(extra), timeout=180)
    with tempfile.TemporaryDirectory() as tmp:
        inv = os.path.join(tmp, "inventory")
        # The lab's inventory with another hosts.yml: group_vars and host_vars are links to the real ones.
        os.makedirs(inv)
        for name in ("group_vars", "host_vars"):
            os.symlink(os.path.join(lab.INVENTORY, name), os.path.join(inv, name))
        with open(os.path.join(inv, "hosts.yml"), "w", encoding="utf-8") as fh:
            fh.write("---\n" + args)
        return lab.playbook(lab.DEPLOY, timeout=180, inventory=inv)


def message(res):
    """The failure message: the msg of the last fatal/FAILED line (module output is one JSON line)."""
    for line in reversed(res.lines):
        if "FAILED!" in line or line.startswith("fatal:"):
            body = line.split("=>", 1)[-1].strip()
            try:
                return json.loads(body).get("msg", body)
            except ValueError:
                return body
    return ""


def check_case(kind, target, arguments, parameter, fix):
    """Run one bad input; it must be refused naming the parameter and the fix, and change nothing."""
    before = lab.snapshots()
    res = run_case(kind, target, arguments)
    after = lab.snapshots()
    msg = " ".join(message(res).split())
    changed = lab.diff(before, after)
    ok = res.rc != 0 and parameter in msg and fix in msg and not changed
    observed = "exit %s; %s; state %s" % (
        res.rc,
        msg[:300] or "no failure message",
        "unchanged" if not changed else "CHANGED: %s" % ", ".join(changed[:5]),
    )
    return ok, observed


def body(suite, args, _made):
    for name, kind, target, arguments, parameter, fix in CASES:
        if not lab.selected(args, name):
            continue
        suite.case(
            name,
            "refused naming %s and %r; state unchanged" % (parameter, fix),
            functools.partial(check_case, kind, target, arguments, parameter, fix),
        )


if __name__ == "__main__":
    sys.exit(lab.main_wrapper("bad_inputs", body))
