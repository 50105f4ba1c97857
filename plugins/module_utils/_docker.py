# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One Docker client for every module that talks to a node's engine (private)."""

from __future__ import annotations

import traceback

from ansible.module_utils.basic import missing_required_lib

try:
    import docker
    from docker.errors import APIError, DockerException, ImageNotFound, NotFound

    HAS_DOCKER = True
    DOCKER_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - reported through fail_json
    HAS_DOCKER = False
    DOCKER_IMPORT_ERROR = traceback.format_exc()
    APIError = DockerException = ImageNotFound = NotFound = Exception

__all__ = [
    "DOCKER_COMMON_ARGS",
    "HAS_DOCKER",
    "WATCHED_CONTAINER_OPTIONS",
    "APIError",
    "DockerException",
    "ImageNotFound",
    "NotFound",
    "connect",
    "docker_client",
    "watch_containers",
]

# Merged into every Docker-using module's argument_spec.
DOCKER_COMMON_ARGS = dict(
    docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
    docker_timeout=dict(type="int", default=120),
)


# The options of a container another node's engine holds, watched from this node (see watch_containers).
WATCHED_CONTAINER_OPTIONS = dict(
    host=dict(type="str", required=True),
    docker_host=dict(type="str", required=True),
    container=dict(type="str", required=True),
)


def docker_client(module):
    """Return a connected DockerClient or fail with the cause named."""
    if not HAS_DOCKER:
        module.fail_json(
            msg=missing_required_lib("docker (the Docker SDK for Python)"),
            exception=DOCKER_IMPORT_ERROR,
        )
    host = module.params["docker_host"]
    try:
        client = docker.DockerClient(base_url=host, timeout=module.params["docker_timeout"])
        client.ping()
    except DockerException as exc:
        module.fail_json(
            msg="docker_host: the Docker engine at %s is not reachable (%s). "
            "Start the engine on this node or fix docker_host." % (host, exc)
        )
    return client


def find_container(client, name):
    """Return the container called name, or None when there is none."""
    try:
        return client.containers.get(name)
    except NotFound:
        return None


def log_tail(container, lines):
    """The last lines of a container's log as text ('' when it cannot be read)."""
    try:
        raw = container.logs(tail=lines, stdout=True, stderr=True)
    except DockerException as exc:
        return "(log not readable: %s)" % exc
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def connect(host, timeout):
    """A client for an engine by address; ssh:// goes through the ssh binary (no paramiko needed on nodes)."""
    kwargs = {"base_url": host, "timeout": timeout}
    if host.startswith("ssh://"):
        kwargs["use_ssh_client"] = True
    client = docker.DockerClient(**kwargs)
    client.ping()
    return client


def watch_containers(targets, timeout):
    """Find each target's container through its engine (target: host, container, docker_host).

    Returns ([(target, container, its restart count now)], {host: "watched" or "not watched: why"}): a
    watcher compares the restart count later, as a restart policy hides an exit."""
    watched, engines = [], {}
    for target in targets:
        try:
            found = connect(target["docker_host"], timeout).containers.get(target["container"])
        except DockerException as exc:
            engines[target["host"]] = "not watched: %s" % str(exc).strip()[:200]
            continue
        watched.append((target, found, found.attrs.get("RestartCount", 0)))
        engines[target["host"]] = "watched"
    return watched, engines
