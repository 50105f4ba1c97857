"""Small fakes of the Docker SDK objects the modules touch, fed with recorded real `docker inspect` JSON."""

from __future__ import annotations

import copy
import json
import os

from docker.errors import ImageNotFound, NotFound
from module_runner import FIXTURES


def inspect(name):
    with open(os.path.join(FIXTURES, "docker", name), encoding="utf-8") as handle:
        return json.load(handle)


class FakeExecResult:
    def __init__(self, exit_code, output):
        self.exit_code = exit_code
        self.output = output


class FakeContainer:
    def __init__(self, attrs, log=b"", client=None):
        self.attrs = copy.deepcopy(attrs)
        self.log = log
        self.client = client
        self.calls = []
        # exec_run(argv) -> FakeExecResult; tests replace this with their own recorder.
        self.exec_handler = None
        # Status after start() (a container that dies at once ends up "exited").
        self.status_after_start = "running"

    @property
    def id(self):
        return self.attrs["Id"]

    @property
    def name(self):
        return self.attrs["Name"].lstrip("/")

    @property
    def status(self):
        return self.attrs["State"]["Status"]

    @property
    def labels(self):
        return self.attrs["Config"].get("Labels") or {}

    def reload(self):
        self.calls.append("reload")

    def start(self):
        self.calls.append("start")
        self.attrs["State"]["Status"] = self.status_after_start

    def remove(self, force=False):
        self.calls.append(("remove", force))
        if self.client is not None:
            self.client.containers.items.pop(self.name, None)

    def logs(self, tail="all", stdout=True, stderr=True):
        lines = self.log.splitlines(keepends=True)
        if tail != "all":
            lines = lines[-tail:]
        return b"".join(lines)

    def exec_run(self, cmd, **kwargs):
        self.calls.append(("exec", cmd, kwargs))
        return self.exec_handler(cmd, **kwargs)


class FakeImages:
    def __init__(self, images):
        self.items = images

    def get(self, ref):
        if ref not in self.items:
            raise ImageNotFound("No such image: %s" % ref)
        return FakeImage(self.items[ref])


class FakeImage:
    def __init__(self, attrs):
        self.attrs = attrs
        self.id = attrs["Id"]


class FakeContainers:
    def __init__(self, client, template):
        self.client = client
        self.items = {}
        self.created = []
        # The recorded inspect that created containers are modelled on.
        self.template = template
        self.log_for_new = b"Ray runtime started.\n"
        self.status_after_start = "running"

    def add(self, container):
        container.client = self.client
        self.items[container.name] = container
        return container

    def get(self, name):
        if name not in self.items:
            raise NotFound("No such container: %s" % name)
        return self.items[name]

    def create(self, **kwargs):
        self.created.append(kwargs)
        attrs = copy.deepcopy(self.template)
        attrs["Name"] = "/" + kwargs["name"]
        attrs["Id"] = "new%04d" % len(self.created)
        attrs["Config"]["Labels"] = dict(kwargs.get("labels") or {})
        attrs["Config"]["Entrypoint"] = kwargs.get("entrypoint")
        attrs["Config"]["Cmd"] = kwargs.get("command")
        attrs["State"]["Status"] = "created"
        container = FakeContainer(attrs, log=self.log_for_new)
        container.status_after_start = self.status_after_start
        return self.add(container)


class FakeClient:
    def __init__(self, images=None, container_template="container_ray_head.json"):
        self.images = FakeImages(images or {})
        self.containers = FakeContainers(self, inspect(container_template))

    def ping(self):
        return True


def use_client(monkeypatch, module, client):
    """Make module's docker_client() return client."""
    monkeypatch.setattr(module, "docker_client", lambda _module: client)
    return client
