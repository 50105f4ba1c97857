# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The contract every engine container on a node follows, Ray node or vLLM rank alike (private; used by
ray_node and vllm_serve).

Host network and IPC, `--init`, a restart policy, the fabric's environment (its env file on the node, read
as `docker run --env-file` reads it), the model mounts, GPUs when
the node has them, RDMA devices with IPC_LOCK and an unlimited memlock, and the image's ENTRYPOINT always
overridden (and reported). A label holds a hash of the whole configuration (image ID included): same hash
and running is left alone, another hash is recreated.
"""

from __future__ import annotations

import hashlib
import json
import os

HASH_LABEL = "dgx_spark.vllm.config_hash"
RESTART_POLICIES = ["no", "always", "unless-stopped", "on-failure"]

# Merged into the argument_spec of every module that makes an engine container (doc fragment: container).
CONTRACT_ARGS = dict(
    gpus=dict(type="int", default=0),
    shm_size=dict(type="str", default="16g"),
    rdma_devices=dict(type="list", elements="str", default=[]),
    restart_policy=dict(type="str", choices=RESTART_POLICIES, default="unless-stopped"),
    env_file=dict(type="path"),
    mounts=dict(
        type="list",
        elements="dict",
        default=[],
        options=dict(
            source=dict(type="str", required=True),
            target=dict(type="str", required=True),
            read_only=dict(type="bool", default=False),
        ),
    ),
)


def contract_problems(p):
    """'parameter: problem; fix' strings for the contract's own parameters."""
    errors = []
    for dev in p.get("rdma_devices") or []:
        if not dev.startswith("/dev/"):
            errors.append("rdma_devices: %r is not a device path under /dev (e.g. /dev/infiniband)" % dev)
    if p.get("gpus") is not None and p["gpus"] < 0:
        errors.append("gpus: must be 0 or more, got %s" % p["gpus"])
    for idx, mount in enumerate(p.get("mounts") or []):
        if not str(mount.get("source", "")).startswith("/") or not str(mount.get("target", "")).startswith("/"):
            errors.append("mounts[%d]: source and target must be absolute paths" % idx)
    return errors


def read_env_file(path):
    """KEY=VALUE lines of a docker --env-file (blank lines and # comments skipped, values taken as they
    are). Raises ValueError naming the path and the line."""
    env = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key or key != key.strip():
                raise ValueError("%s line %d is not KEY=VALUE: %r" % (path, number, line[:80]))
            env[key] = value
    return env


def file_env(p, check_mode):
    """(environment from p['env_file'], problem): the file's entries; a missing file in check mode is
    reported as a problem and read as empty (the fabric stage writes it; check mode wrote nothing)."""
    path = p.get("env_file")
    if not path:
        return {}, None
    try:
        return read_env_file(path), None
    except FileNotFoundError:
        why = (
            "env_file: %s is not on this node; the fabric stage writes it (run the deploy, or its fabric stage)" % path
        )
        if check_mode:
            return {}, why
        raise ValueError(why) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError("env_file: cannot read %s: %s" % (path, exc)) from exc
    except ValueError as exc:
        raise ValueError("env_file: %s" % exc) from exc


def module_file_env(module, fail):
    """file_env() for a module: a problem in check mode is a warning; any other is fail(msg)."""
    try:
        entries, problem = file_env(module.params, module.check_mode)
    except ValueError as exc:
        fail(str(exc))
    if problem:
        module.warn(problem)
    return entries


def container_config(p, image_id, argv, role, env):
    """Everything that defines the container, in a JSON-able form (hashed into a label)."""
    rdma = list(p.get("rdma_devices") or [])
    restart = {"Name": p["restart_policy"]}
    if p["restart_policy"] == "on-failure":
        restart["MaximumRetryCount"] = 0
    mounts = [
        {"source": m["source"], "target": m["target"], "read_only": bool(m.get("read_only"))}
        for m in (p.get("mounts") or [])
    ]
    return {
        "image": image_id,
        "entrypoint": argv[:1],
        "command": argv[1:],
        "env": {str(k): str(v) for k, v in sorted(env.items())},
        "network_mode": "host",
        "ipc_mode": "host",
        "shm_size": p["shm_size"],
        "init": True,
        "privileged": bool(p.get("privileged")),
        "restart_policy": restart,
        "mounts": mounts,
        "devices": ["%s:%s:rwm" % (d, d) for d in rdma],
        "cap_add": ["IPC_LOCK"] if rdma else [],
        # RDMA registers memory: an unlimited memlock is what the verbs stack expects.
        "memlock_unlimited": bool(rdma),
        "gpus_all": p["gpus"] > 0,
        "labels": {str(k): str(v) for k, v in sorted((p.get("labels") or {}).items())},
        "role": role,
    }


def missing_writable_sources(config, docker_host):
    """The writable mounts' sources missing on this node (the engine's cache): the API's bind mount refuses a
    missing source, and a running container whose source was removed writes where nothing will read it again,
    so either recreates the container. Only for the node's own engine (a unix socket): a remote engine's paths
    are not this host's. A read-only mount (the model) must exist."""
    if not str(docker_host).startswith("unix://"):
        return []
    return [m["source"] for m in config["mounts"] if not m["read_only"] and not os.path.isdir(m["source"])]


def make_sources(paths):
    """Make each directory (mode 0755), as `docker run -v` does; the problem, naming the path, or None."""
    for path in paths:
        try:
            os.makedirs(path, mode=0o755, exist_ok=True)
        except OSError as exc:
            return "mounts: cannot make %s on this node (%s); make it a directory or fix ray_cluster_cache_dir" % (
                path,
                exc,
            )
    return None


def config_hash(config):
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def create_kwargs(config, name, digest, docker_types, role_label):
    """Keyword arguments for DockerClient.containers.create() from container_config()."""
    labels = dict(config["labels"])
    labels[HASH_LABEL] = digest
    labels[role_label] = config["role"]
    kwargs = dict(
        image=config["image"],
        name=name,
        entrypoint=config["entrypoint"],
        command=config["command"],
        environment=config["env"],
        network_mode=config["network_mode"],
        ipc_mode=config["ipc_mode"],
        shm_size=config["shm_size"],
        init=config["init"],
        privileged=config["privileged"],
        restart_policy=config["restart_policy"],
        labels=labels,
        detach=True,
    )
    if config["mounts"]:
        kwargs["mounts"] = [
            docker_types.Mount(target=m["target"], source=m["source"], type="bind", read_only=m["read_only"])
            for m in config["mounts"]
        ]
    if config["devices"]:
        kwargs["devices"] = config["devices"]
    if config["cap_add"]:
        kwargs["cap_add"] = config["cap_add"]
    if config["memlock_unlimited"]:
        kwargs["ulimits"] = [docker_types.Ulimit(name="memlock", soft=-1, hard=-1)]
    if config["gpus_all"]:
        kwargs["device_requests"] = [docker_types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kwargs


def plan(current, digest, force=False):
    """What makes the container match: "created", "recreated", "started", or None (it already does)."""
    if current is None:
        return "created"
    if current.labels.get(HASH_LABEL) != digest or force:
        return "recreated"
    if current.status != "running":
        return "started"
    return None


def describe(container):
    """The container as a diff shows it ({} when there is none)."""
    if container is None:
        return {}
    config = container.attrs.get("Config") or {}
    return dict(
        name=container.name,
        status=container.status,
        config_hash=container.labels.get(HASH_LABEL),
        command=list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []),
    )


def entrypoint_message(image_entrypoint, new_entrypoint):
    if image_entrypoint:
        return "overrode ENTRYPOINT %s with %s" % (list(image_entrypoint), list(new_entrypoint))
    return "image has no ENTRYPOINT; set %s" % (list(new_entrypoint),)


def exited_how(container, restarts, tolerated=0):
    """How a container shows that its main process exited: its status when not running, "restarted" when
    its restart count grew past `restarts` + `tolerated` (a restart policy hides the exit), else None."""
    if container.status != "running":
        return container.status
    if container.attrs.get("RestartCount", 0) > restarts + tolerated:
        return "restarted"
    return None
