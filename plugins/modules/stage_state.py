#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: stage_state
short_description: Record what each node stage left, and tell which stages a node still shows converged
description:
  - With O(operation=record), after the stages in O(stages) ran successfully, writes for each the digest of
    its settings (O(stages[].inputs)), a fingerprint of the live state its O(stages[].checks) read and the facts
    later stages need (O(stages[].facts)) to O(path), mode C(0600).
  - With O(operation=probe), reads the same live state again in one pass and reports, in order, whether each
    stage is converged; settings changed, a live check failing now (an interface down or at another MTU, a
    DF ping lost, the Docker engine silent, a directory or package missing, too little disk) or a fingerprint
    that differs (file digests, image IDs, model manifest, GPUs, boot id) make a stage run, and every stage after it.
  - With O(operation=check), runs the stages' pass-or-fail checks now and reports what fails; it reads no
    record and writes none (preflight checks the head's node-to-node SSH this way, as the probe does).
  - With O(plan), O(operation=record) also records the run's plan (its key and every stage's inputs, checks and fact
    names) once every stage is recorded under those inputs, and O(operation=probe) without O(stages) probes the stages
    and endpoint the plan holds, when the node's plan was made with the same O(plan.key); otherwise it reads
    nothing more and says why (RV(plan)).
  - The deploy playbook runs one probe per node instead of every stage's own checks when nothing changed; a
    stage that runs does all its own checks.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
requirements:
  - iproute2 (C(ip)) for C(interfaces), iputils ping for C(ping), the Docker SDK
    for Python for C(docker) and C(images), nvidia-smi for C(gpus)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
options:
  operation:
    description: C(probe) reads and compares; C(record) writes the record of stages that just ran; C(check) only checks.
    type: str
    choices: [probe, record, check]
    required: true
  path:
    description: The record file on the node.
    type: path
    default: /var/lib/dgx-spark/stages.json
  stages:
    description:
      - The node stages in run order (probe) or the stages that just ran (record).
      - Required unless O(plan) is given to O(operation=probe) or O(operation=record).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The stage name.
        type: str
        required: true
      inputs:
        description: A digest of the stage's settings, made on the controller.
        type: str
        required: true
      facts:
        description: Facts the stage set that later stages read (record only); returned by a converged probe.
        type: dict
        default: {}
      fact_names:
        description:
          - The names of the facts the stage's record keeps. Kept with O(plan) (record) and returned with the
            plan's stages (probe), so a run that takes the plan's description of a stage records the same facts.
        type: list
        elements: str
        default: []
      checks:
        description:
          - The live state the stage leaves. Keys C(python) (minimum version), C(disk) (C(path), C(min_free_bytes)),
            C(directories) (paths), C(packages) (Debian package names), C(docker) (engine address), C(ssh)
            (C(key), C(user), C(addresses); the key alone, no prompt) are pass-or-fail checks.
          - C(boot) (true), C(gpus) (true), C(files) (paths, each fingerprinted by SHA-256), C(interfaces)
            (C(name), C(mtu), C(address); each also checked up, at that MTU and holding that address), C(images)
            (C(docker_host), C(refs); image IDs), C(sources) (C(docker_host), C(refs); the IDs of the images the
            stage was made from, by name; one absent now is no change, one naming another image is), C(model)
            (C(path), C(fingerprint)) and C(containers)
            (C(running) and C(absent) container names, C(docker_host) the modules' default unless given; each
            running one by ID and last start, so a container Docker restarted or someone recreated no longer
            matches) are fingerprinted.
          - C(ping) (C(mtu), C(rails) of C(interface) and C(peers), C(count), C(timeout)) sends don't-fragment pings
            of the full MTU; a lost one fails the check.
          - C(listening) (C(name), C(address), C(port) of each service the stage started) connects to each; one that
            does not accept a TCP connection fails the check.
        type: dict
        default: {}
  endpoint:
    description:
      - With O(operation=probe) on the node that serves the API, the warm check runs alongside the live checks,
        one bounded completion (its answer shows the engine serves the model and generates). One that is refused
        or fails is probed in full (C(/health), C(/v1/models), C(/version), the completion, as
        M(dgx_spark.vllm.vllm_serve) asks) to name the failed step; one that times out is not asked again. A
        failure makes stage O(endpoint.stage) run. The probe is returned as RV(endpoint).
      - Not asked when O(endpoint.stage) has no record or its settings changed since it (it runs anyway).
    type: dict
    suboptions:
      stage:
        description: The stage that serves this endpoint (its record alone does not show a failed engine).
        type: str
        required: true
      host:
        description: The address vllm serve binds; a wildcard is asked through loopback.
        type: str
        required: true
      port:
        description: The API port.
        type: int
        required: true
      served_model_name:
        description: The model name C(/v1/models) must list and the completion asks for.
        type: str
        required: true
      api_key:
        description: The API key, sent in the C(Authorization) header only.
        type: str
      prompt:
        description: The completion's prompt.
        type: str
        default: The capital of France is
      max_tokens:
        description: The completion's token limit.
        type: int
        default: 16
      timeout:
        description: Seconds the whole probe may take, the completion included.
        type: int
        default: 60
      answer:
        description:
          - The answer this same check gave earlier in the run (C(endpoint.probe) of a probe with O(plan) that
            asked it); it is taken as the endpoint's, which is not asked again (a hung engine is not waited out twice).
        type: dict
  plan:
    description:
      - The run's plan. O(operation=probe) with O(plan) and no O(stages) reads the node's recorded plan; when its
        key is O(plan.key), the node is probed as with the plan's stages and endpoint given.
      - O(operation=record) records it once every stage of O(plan.stages) is recorded with those inputs (after
        the stages in O(stages), if any, are); otherwise the node's plan is dropped.
    type: dict
    suboptions:
      key:
        description: A digest of everything the run's stages are made from (lookup C(dgx_spark.vllm.plan_key)).
        type: str
        required: true
      stages:
        description:
          - Every stage of the run in order, each with the keys of O(stages) (record); C(facts) is not used here
            (each stage's own record holds them).
        type: list
        elements: dict
        default: []
      endpoint:
        description:
          - The endpoint the plan's probe asks, with the keys of O(endpoint) (record); C(stage), C(host), C(port)
            and C(served_model_name) are required, the others take O(endpoint)'s defaults. Its C(api_key) is not
            written.
        type: dict
      api_key:
        description: The API key for the plan's endpoint probe (probe), sent in the C(Authorization) header only.
        type: str
attributes:
  check_mode:
    support: full
    description: >-
      O(operation=probe) and O(operation=check) read only; O(operation=record) reports what it would write
      and writes nothing.
  diff_mode:
    support: none
    description: The record is bookkeeping; no diff is shown.
  idempotent:
    support: full
    description: Recording the same state twice leaves the file unchanged the second time.
"""

EXAMPLES = r"""
- name: Find the stages the last successful run left converged
  dgx_spark.vllm.stage_state:
    operation: probe
    stages:
      - name: fabric
        inputs: "{{ {'mtu': fabric_mtu, 'interfaces': fabric_interfaces} | to_json | hash('sha256') }}"
        checks:
          interfaces: "{{ fabric_interfaces | map('combine', {'mtu': fabric_mtu}) }}"
          files: [/etc/dgx-spark/nccl.env]
  register: probe

- name: Check the head reaches every worker address with its node-to-node key
  dgx_spark.vllm.stage_state:
    operation: check
    stages:
      - name: peers
        inputs: ""
        checks:
          ssh: {key: /root/.ssh/dgx_spark_ed25519, user: root, addresses: [192.168.100.11, 198.18.120.11]}
  register: peers
"""

RETURN = r"""
stages:
  description: Each stage given, in order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The stage.
      type: str
    converged:
      description: >-
        Whether the node still shows what the last run left (probe), whether it was recorded (record), or
        whether every check passes (check).
      type: bool
    reasons:
      description: Why the stage runs (probe), why it was not recorded (record), or which checks fail (check).
      type: list
      elements: str
    recorded:
      description: Whether the node holds a record of a successful run of the stage (probe).
      type: bool
    checks_passed:
      description: Whether the stage's live checks pass on the node now, whatever its record says (probe).
      type: bool
    facts:
      description: >-
        The facts the stage's last successful run recorded (probe), converged or not; empty without a record.
      type: dict
seconds:
  description: Seconds each kind of live check took (probe).
  returned: when O(operation=probe)
  type: dict
  sample: {"ping": 0.41, "images": 0.05}
endpoint:
  description:
    - The probe of O(endpoint) (keys as M(dgx_spark.vllm.vllm_probe)'s C(probe); C(owned_by) and
      C(engine_version) are null when the one completion answered); when it passed, also C(endpoint) (the API's
      C(/v1) URL as the node reaches it), C(model), C(engine) (null when the completion alone answered) and
      C(completion).
  returned: when O(operation=probe), O(endpoint) is given and its stage's record holds the same settings
  type: dict
  sample: {"probe": {"ok": true, "step": null, "latency_s": 0.49, "seconds": 0.57}, "model": "qwen3.5-122b"}
plan:
  description:
    - With O(plan), probe - whether the node's plan was made with O(plan.key) (C(matched); when not, nothing was
      probed, RV(stages) is empty) and why not (C(why)); when it matched, also the plan's C(stages) (name,
      inputs, checks, fact_names) and C(endpoint) (without the API key), which a run that describes only the
      stages it runs records again; record - whether the plan was recorded (C(recorded)) and why not (C(why)).
  returned: when O(plan) is given to O(operation=probe) or O(operation=record)
  type: dict
  sample: {"matched": false, "why": "the settings or the collection changed since the last successful run"}
meminfo:
  description:
    - The node's C(/proc/meminfo) (probe), which the deploy's memory-fit check reads instead of asking the node
      again (GB10 memory is unified); null where it cannot be read.
  returned: when O(operation=probe)
  type: str
  sample: "MemTotal:       127535828 kB\nMemFree: ..."
first_run:
  description: Index in O(stages) of the first stage that runs; the number of stages when none does (probe).
  returned: when O(operation=probe)
  type: int
  sample: 2
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _probe
from ansible_collections.dgx_spark.vllm.plugins.module_utils._stage_state import (
    ENDPOINT_OPTIONS,
    PLAN_OPTIONS,
    RECORD_PATH,
    STAGE_OPTIONS,
    check,
    checked_input,
    planned,
    probe,
    record_and_write,
)


def ask(served):
    """The warm check of the endpoint this node serves (one completion; probed in full when it fails), or the
    answer the same check gave earlier in the run."""
    if served.get("answer"):
        return served["answer"]
    # Only the head's probe sends HTTP: the import is about 70 ms of every other start of this module.
    from ansible.module_utils.urls import open_url  # noqa: PLC0415

    base = _probe.local_url(served["host"], served["port"])
    return _probe.probe_url(open_url, base, served, once=True)


def read_meminfo():
    """The node's /proc/meminfo, for the deploy's memory-fit check (GB10 memory is unified); None where unreadable."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            operation=dict(type="str", choices=["probe", "record", "check"], required=True),
            path=dict(type="path", default=RECORD_PATH),
            stages=dict(type="list", elements="dict", default=[], options=STAGE_OPTIONS),
            endpoint=dict(type="dict", options=ENDPOINT_OPTIONS),
            plan=dict(type="dict", options=PLAN_OPTIONS),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    stages, plan = checked_input(module, "", module.params["stages"], module.params["plan"])
    if not stages and not (plan and module.params["operation"] in ("probe", "record")):
        module.fail_json(msg="stages: give the stages (or, to probe or record a plan, plan).")
    if module.params["operation"] == "probe":
        served = module.params["endpoint"]
        extra = {}
        if plan and not stages:
            # The one look of a converged cluster: the stages and endpoint the last successful run recorded.
            stages, served, why = planned(path, plan["key"])
            extra["plan"] = dict(matched=why is None, why=why)
            if why:
                module.exit_json(changed=False, stages=[], first_run=0, seconds={}, meminfo=read_meminfo(), **extra)
            # What the run records again for the stages it does not describe anew (no API key is recorded).
            extra["plan"].update(stages=stages, endpoint=served)
            served = dict(served, api_key=plan["api_key"]) if served else None
        found, first_run, seconds, answer = probe(
            module, path, stages, endpoint=(served["stage"], lambda: ask(served)) if served else None
        )
        if answer is not None:
            extra["endpoint"] = dict(probe=answer)
            if answer["ok"]:
                base = _probe.local_url(served["host"], served["port"])
                extra["endpoint"].update(_probe.summary(base, served["served_model_name"], answer))
        module.exit_json(
            changed=False, stages=found, first_run=first_run, seconds=seconds, meminfo=read_meminfo(), **extra
        )
    if module.params["operation"] == "check":
        found = [
            dict(name=name, converged=not problems, reasons=problems, facts={})
            for name, problems in check(module, stages)
        ]
        module.exit_json(changed=False, stages=found)
    done, skipped, changed = record_and_write(module, path, stages, plan)
    extra = {}
    if plan is not None:
        extra["plan"] = dict(recorded="plan" not in skipped, why=(skipped.get("plan") or [None])[0])
    module.exit_json(
        changed=changed,
        **extra,
        stages=[
            dict(name=stage["name"], converged=stage["name"] in done, reasons=skipped.get(stage["name"], []), facts={})
            for stage in stages
        ],
    )


if __name__ == "__main__":
    main()
