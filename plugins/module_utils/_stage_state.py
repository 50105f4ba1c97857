# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the last successful run of each node stage left behind, and whether the node still shows it (private).

A stage's record holds the digest of its settings, a fingerprint of the live state it left (interface
state, file digests, image IDs, model manifest, GPUs and boot) and the facts later stages read from it.
A stage is converged when its settings are the same, every live check passes now and the live
fingerprint equals the recorded one; any difference makes the stage run in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import (
    DOCKER_COMMON_ARGS,
    HAS_DOCKER,
    DockerException,
    connect,
    find_container,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._image import image_id
from ansible_collections.dgx_spark.vllm.plugins.module_utils._model import manifest
from ansible_collections.dgx_spark.vllm.plugins.module_utils._netif import C_LOCALE, IpRoute
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nvidia_smi import (
    NvidiaSmi,
    NvidiaSmiError,
    read_boot_id,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._ping import HEADERS, RailPinger
from ansible_collections.dgx_spark.vllm.plugins.module_utils._probe import PROBE_ARGS
from ansible_collections.dgx_spark.vllm.plugins.module_utils._ssh import unreachable
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import read_text, write_text

# Seconds a service of check `listening` has to accept a connection (a local or same-switch address).
LISTEN_TIMEOUT_S = 2
# 2: each stage's record carries the node's time it was made (at).
RECORD_VERSION = 2
# The argument specs of a stage, of the endpoint a stage serves and of a run's plan: module stage_state's, and
# the record option of the modules that end a node's stage group (RECORD_OPTIONS).
STAGE_OPTIONS = dict(
    name=dict(type="str", required=True),
    inputs=dict(type="str", required=True),
    facts=dict(type="dict", default={}),
    fact_names=dict(type="list", elements="str", default=[]),
    checks=dict(type="dict", default={}),
)
ENDPOINT_OPTIONS = dict(
    stage=dict(type="str", required=True),
    host=dict(type="str", required=True),
    port=dict(type="int", required=True),
    answer=dict(type="dict"),
    **PROBE_ARGS,
)
PLAN_OPTIONS = dict(
    key=dict(type="str", required=True, no_log=False),
    # Checked against STAGE_OPTIONS and ENDPOINT_OPTIONS by checked_input.
    stages=dict(type="list", elements="dict", default=[]),
    endpoint=dict(type="dict"),
    api_key=dict(type="str", no_log=True),
)
RECORD_PATH = "/var/lib/dgx-spark/stages.json"
RECORD_OPTIONS = dict(
    path=dict(type="path", default=RECORD_PATH),
    stages=dict(type="list", elements="dict", default=[], options=STAGE_OPTIONS),
    plan=dict(type="dict", options=PLAN_OPTIONS),
    forget=dict(type="list", elements="str", default=[]),
)
# GPU fields that stay put while a node serves (clocks, memory use and pstate move).
GPU_STABLE_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "persistence_mode")


def file_digest(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def load_record(path):
    """The record at path: {"stages": {name: record}, "plan": plan or None}; empty when there is none or it is
    from another version."""
    text = read_text(path)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        data = {}
    return dict(stages=data.get("stages") or {}, plan=data.get("plan") or None)


def dump_record(stages, plan=None):
    data = dict(version=RECORD_VERSION, stages=stages)
    if plan:
        data["plan"] = plan
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def planned(path, key):
    """(stages, endpoint, why not): the stages and endpoint the record's plan holds when it was made with key.

    A plan is recorded after a successful run with every stage recorded under its settings (record's plan);
    key names the settings and code of a run (lookup plan_key)."""
    plan = load_record(path)["plan"]
    if not plan:
        return None, None, "no plan recorded by a successful run"
    if plan.get("key") != key:
        return None, None, "the settings or the collection changed since the last successful run"
    return plan["stages"], plan.get("endpoint"), None


class LiveState:
    """Reads the live state a stage's checks name: returns (fingerprint, problems)."""

    def __init__(self, module):
        self.module = module
        self._ip = None
        self._docker = {}
        self._lock = threading.Lock()  # the stages' checks run at once and share these clients
        self.seconds = {}  # per check, for the report

    @property
    def ip(self):
        with self._lock:
            if self._ip is None:
                self._ip = IpRoute(self.module)
        return self._ip

    def docker(self, host):
        """(client, None) or (None, why)."""
        with self._lock:
            self._connect(host)
        return self._docker[host]

    def _connect(self, host):
        if host not in self._docker:
            if not HAS_DOCKER:
                self._docker[host] = (None, "the Docker SDK for Python is not installed")
            else:
                try:
                    self._docker[host] = (connect(host, 30), None)
                except DockerException as exc:
                    self._docker[host] = (None, "the Docker engine at %s does not answer (%s)" % (host, exc))

    def read(self, checks):
        fingerprint = {}
        problems = []
        for name in sorted(checks):
            spec = checks[name]
            if spec is None:
                continue
            started = time.monotonic()
            value, found = getattr(self, "check_" + name)(spec)
            self.seconds[name] = round(time.monotonic() - started, 3)
            problems.extend(found)
            if value is not None:
                fingerprint[name] = value
        return fingerprint, problems

    # Each check_<name> returns (fingerprint value or None, [problems]).
    def check_python(self, minimum):
        have = "%d.%d.%d" % sys.version_info[:3]
        wanted = tuple(int(part) for part in str(minimum).split("."))
        if sys.version_info[: len(wanted)] >= wanted:
            return None, []
        return None, ["Python %s is older than %s" % (have, minimum)]

    def check_disk(self, spec):
        try:
            stat = os.statvfs(spec["path"])
        except OSError as exc:
            return None, ["%s: %s" % (spec["path"], exc.strerror)]
        free = stat.f_bavail * stat.f_frsize
        if free < int(spec["min_free_bytes"]):
            return None, ["%s has %d bytes free, %d wanted" % (spec["path"], free, int(spec["min_free_bytes"]))]
        return None, []

    def check_directories(self, paths):
        return None, ["directory %s is missing" % path for path in paths if not os.path.isdir(path)]

    def check_packages(self, names):
        if not names:
            return None, []
        dpkg = self.module.get_bin_path("dpkg-query")
        if not dpkg:
            return None, ["dpkg-query is missing: cannot tell whether %s are installed" % ", ".join(names)]
        argv = [dpkg, "-W", "-f=${Package} ${Status}\\n", *names]
        _rc, out, _err = self.module.run_command(argv, environ_update=C_LOCALE)
        installed = {line.split()[0] for line in out.splitlines() if line.endswith(" install ok installed")}
        return None, ["package %s is not installed" % name for name in names if name not in installed]

    def check_docker(self, host):
        _client, why = self.docker(host)
        return None, [why] if why else []

    def check_ssh(self, spec):
        return None, unreachable(self.module, spec["key"], spec["user"], spec["addresses"])

    def check_boot(self, wanted):
        return (read_boot_id() if wanted else None), []

    def check_gpus(self, wanted):
        if not wanted:
            return None, []
        smi = NvidiaSmi(self.module)
        if not smi.present:
            return [], []
        try:
            gpus = smi.query_gpus()
        except NvidiaSmiError as exc:
            return None, [str(exc)]
        return [{field: gpu.get(field) for field in GPU_STABLE_FIELDS} for gpu in gpus], []

    def check_files(self, paths):
        return {path: file_digest(path) for path in paths}, []

    def check_interfaces(self, wanted):
        seen = {}
        problems = []
        for item in wanted:
            state = self.ip.state(item["name"])
            if state is None:
                problems.append("interface %s is missing" % item["name"])
                continue
            seen[item["name"]] = dict(mtu=state["mtu"], up=state["up"], addresses=sorted(state["addresses"]))
            if not state["up"]:
                problems.append("%s is down" % item["name"])
            if state["mtu"] != int(item["mtu"]):
                problems.append("%s has MTU %s, %s wanted" % (item["name"], state["mtu"], item["mtu"]))
            if item["address"] not in state["addresses"]:
                problems.append("%s lacks %s" % (item["name"], item["address"]))
        return seen, problems

    def check_ping(self, spec):
        pinger = RailPinger(self.module, spec.get("count", 3), spec.get("timeout", 2), self.ip)
        payload = int(spec["mtu"]) - HEADERS
        results = pinger.check_all(spec["rails"], payload)
        return None, [result["message"] for result in results if not result["ok"]]

    def image_ids(self, spec):
        """{ref: image ID or None} on the engine at spec's docker_host, or (None, [why it did not answer])."""
        client, why = self.docker(spec["docker_host"])
        if why:
            return None, [why]
        try:
            return {ref: image_id(client, ref) for ref in spec["refs"]}, []
        except DockerException as exc:
            return None, ["the Docker engine at %s failed to answer (%s)" % (spec["docker_host"], exc)]

    def check_images(self, spec):
        ids, problems = self.image_ids(spec)
        return ids, problems or ["image %s is missing" % ref for ref, found in (ids or {}).items() if found is None]

    def check_sources(self, spec):
        """The images a stage was made from, by name: one that names another image now is a change, one absent
        now is not (removed after its image was promoted; see own_reasons)."""
        return self.image_ids(spec)

    def check_containers(self, spec):
        """The containers a cluster stage left: each in `running` the same container (ID and last start)
        and running; none of those in `absent` there at all. The engine is the modules' default unless named."""
        engine = spec.get("docker_host") or DOCKER_COMMON_ARGS["docker_host"]["default"]
        client, why = self.docker(engine)
        if why:
            return None, [why]
        seen, problems = {}, []
        try:
            for name in spec.get("running", []):
                container = find_container(client, name)
                if container is None or container.status != "running":
                    problems.append("container %s is %s" % (name, "missing" if container is None else container.status))
                    continue
                seen[name] = "%s@%s" % (container.id, container.attrs["State"]["StartedAt"])
            there = [name for name in spec.get("absent", []) if find_container(client, name)]
            problems += ["container %s is there" % name for name in there]
        except DockerException as exc:
            return None, ["the Docker engine at %s failed to answer (%s)" % (engine, exc)]
        return seen, problems

    def check_listening(self, services):
        """Services a stage started: each answers a TCP connection at its address and port now."""
        problems = []
        for item in services:
            try:
                socket.create_connection((item["address"], int(item["port"])), timeout=LISTEN_TIMEOUT_S).close()
            except OSError as exc:
                problems.append(
                    "%s does not answer at %s:%s (%s)"
                    % (item["name"], item["address"], item["port"], exc.strerror or exc)
                )
        return None, problems

    def check_model(self, spec):
        if not os.path.isdir(spec["path"]):
            return None, ["model directory %s is missing" % spec["path"]]
        _entries, digest = manifest(spec["path"], spec.get("fingerprint", "sample"))
        return digest, []


def probe(module, path, stages, endpoint=None):
    """Each stage, in order: converged or not and why. Once one stage runs, the later ones run too.

    `endpoint` (stage name, ask): ask() returns the warm check (module_utils/_probe.py ask_once) of the
    endpoint that stage serves; one that fails makes the stage run. Returns (stages, first_run, seconds, served)."""
    recorded = load_record(path)["stages"]
    live = LiveState(module)
    # A stage whose settings changed runs anyway: its endpoint is not asked (a hung one is not waited for).
    wanted = {stage["name"]: stage["inputs"] for stage in stages}
    same = endpoint and (recorded.get(endpoint[0]) or {}).get("inputs") == wanted.get(endpoint[0])
    # The endpoint is asked alongside the live checks, in a thread the module's exit does not wait for.
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(served=endpoint[1]()), daemon=True) if same else None
    if asking:
        asking.start()
    # Every stage's live state at once (the pings and SSH attempts wait on the network); the chain below
    # decides which readings count.
    with ThreadPoolExecutor(max_workers=len(stages)) as pool:
        readings = list(pool.map(lambda stage: live.read(stage.get("checks") or {}), stages))
    served = None
    if asking:
        before = [stage["name"] for stage in stages][: list(wanted).index(endpoint[0])]
        # An earlier stage that runs restarts the engine anyway: a refused or hung endpoint is not waited out.
        if not any(own_reasons(recorded.get(name), wanted[name], readings[i]) for i, name in enumerate(before)):
            asking.join()
            served = answer.get("served")
    if served is not None:
        live.seconds["endpoint"] = served["seconds"]
    out = []
    first_run = len(stages)
    # The newest record of an earlier stage: a stage recorded before it (a run with --tags of that
    # stage alone) did not run on what that stage left, and runs again.
    newest, newest_name = 0, None
    for index, stage in enumerate(stages):
        name = stage["name"]
        record = recorded.get(name)
        if index > first_run:
            reasons = ["an earlier stage (%s) runs" % stages[first_run]["name"]]
        elif record is not None and record.get("inputs") == stage["inputs"] and record.get("at", 0) < newest:
            reasons = ["an earlier stage (%s) ran after its last successful run" % newest_name]
        else:
            reasons = own_reasons(record, stage["inputs"], readings[index])
            if served is not None and name == endpoint[0] and not served["ok"]:
                reasons.append("the endpoint failed its probe at %s: %s" % (served["step"], served["why"]))
        if record and record.get("at", 0) > newest:
            newest, newest_name = record["at"], name
        converged = not reasons
        if not converged and first_run == len(stages):
            first_run = index
        out.append(
            dict(
                name=name,
                converged=converged,
                reasons=reasons,
                recorded=record is not None,
                # The stage's own live checks pass now, whatever its record and the earlier stages say.
                checks_passed=not readings[index][1],
                # A run with --tags of a later stage alone takes these even when this stage is not converged.
                facts=record.get("facts", {}) if record else {},
            )
        )
    return out, first_run, live.seconds, served


# Fingerprints whose entries may read absent later without that being a change.
ABSENT_IS_NO_CHANGE = ("sources",)


def differs(name, now, was):
    if name in ABSENT_IS_NO_CHANGE and isinstance(now, dict) and isinstance(was, dict):
        return any(found is not None and found != was.get(ref) for ref, found in now.items())
    return now != was


def own_reasons(record, inputs, reading):
    """Why a stage runs by its own record and live reading alone (no record, other settings, a failing check,
    a changed fingerprint); [] when it is converged."""
    if record is None:
        return ["no record of a successful run"]
    if record.get("inputs") != inputs:
        return ["its settings changed since the last successful run"]
    fingerprint, problems = reading
    was = record.get("fingerprint", {})
    changed = sorted(key for key in set(fingerprint) | set(was) if differs(key, fingerprint.get(key), was.get(key)))
    return list(problems) + (["changed since the last successful run: %s" % ", ".join(changed)] if changed else [])


def check(module, stages):
    """Each stage's live checks, read now: (name, problems). Nothing recorded, nothing compared."""
    live = LiveState(module)
    return [(stage["name"], live.read(stage.get("checks") or {})[1]) for stage in stages]


def record(module, path, stages, plan=None, forget=()):
    """Record every stage given (run just now): settings digest, live fingerprint and facts.

    Returns (recorded names, skipped {name: problems}, changed, text). A stage whose live checks fail now is
    not recorded (and an older record of it is dropped), so the next run does it again. With plan (key, stages
    with their inputs and checks, endpoint), the plan is recorded when every one of its stages is recorded with
    those inputs; otherwise it is dropped (skipped["plan"] says why). Without plan, the old one is kept. The
    records of the stages named in forget are dropped first.
    """
    current = load_record(path)
    updated = {name: was for name, was in current["stages"].items() if name not in forget}
    live = LiveState(module)
    done, skipped = [], {}
    # This node's clock; only this node's records are compared with it (probe).
    at = round(time.time(), 3)
    for stage in stages:
        fingerprint, problems = live.read(stage.get("checks") or {})
        if problems:
            skipped[stage["name"]] = problems
            updated.pop(stage["name"], None)
            continue
        updated[stage["name"]] = dict(
            inputs=stage["inputs"], fingerprint=fingerprint, facts=stage.get("facts") or {}, at=at
        )
        done.append(stage["name"])
    new_plan = current["plan"]
    if plan is not None:
        stale = [
            stage["name"]
            for stage in plan["stages"]
            if (updated.get(stage["name"]) or {}).get("inputs") != stage["inputs"]
        ]
        new_plan = None
        if stale:
            skipped["plan"] = ["not recorded under these settings: %s" % ", ".join(stale)]
        else:
            new_plan = dict(
                key=plan["key"],
                stages=[
                    dict(
                        name=stage["name"],
                        inputs=stage["inputs"],
                        checks=stage.get("checks") or {},
                        fact_names=stage.get("fact_names") or [],
                    )
                    for stage in plan["stages"]
                ],
                # The API key is never written: the probe is given it.
                endpoint={k: v for k, v in (plan.get("endpoint") or {}).items() if k not in ("api_key", "answer")}
                or None,
            )
    changed = updated != current["stages"] or new_plan != current["plan"]
    return done, skipped, changed, dump_record(updated, new_plan)


# The checks a stage may name: one per LiveState.check_<name>.
CHECK_KEYS = frozenset(name[len("check_") :] for name in vars(LiveState) if name.startswith("check_"))


def validated(module, what, given, options):
    """given checked against options (an argument spec) as AnsibleModule checks its own; fails naming what."""
    result = ArgumentSpecValidator(options).validate(given)
    if result.error_messages:
        module.fail_json(msg="%s: %s" % (what, "; ".join(result.error_messages)))
    return result.validated_parameters


def checked_input(module, what, stages, plan):
    """stages and plan as given (plan's stages and endpoint validated); fails naming what on unknown checks."""
    if plan:
        plan["stages"] = [validated(module, what + "plan.stages", stage, STAGE_OPTIONS) for stage in plan["stages"]]
        if plan["endpoint"]:
            plan["endpoint"] = validated(module, what + "plan.endpoint", plan["endpoint"], ENDPOINT_OPTIONS)
    for stage in stages + (plan["stages"] if plan else []):
        unknown = sorted(set(stage["checks"]) - CHECK_KEYS)
        if unknown:
            module.fail_json(
                msg="%sstages: %s has unknown checks %s; use %s."
                % (what, stage["name"], unknown, ", ".join(sorted(CHECK_KEYS)))
            )
    return stages, plan


def record_and_write(module, path, stages, plan=None, forget=()):
    """record(), written to path (mode 0600) when it changed and not in check mode: (done, skipped, changed)."""
    done, skipped, changed, text = record(module, path, stages, plan, forget)
    if changed and not module.check_mode:
        write_text(module, path, text, "0600")
    return done, skipped, changed


def checked_record(module):
    """The module's record option (RECORD_OPTIONS), checked before the module changes anything; the records it
    names in forget are dropped here, before the module's own work (not in check mode), so a run that fails
    from here on leaves them dropped."""
    spec = module.params["record"]
    if spec:
        checked_input(module, "record.", spec["stages"], spec["plan"])
        if spec["forget"] and not module.check_mode:
            record_and_write(module, spec["path"], [], forget=spec["forget"])
    return spec


def record_group(module, spec, found=None):
    """The record option of a module that ends this node's stage group (checked_record): the group recorded
    after the module's own work succeeded, with the facts it found (name: value) added to the stage whose
    fact_names hold them (the stages named in forget were dropped by checked_record). Returns what the module
    reports as its result's record."""
    stages, plan = spec["stages"], spec["plan"]
    found = found or {}
    stages = [
        dict(stage, facts=dict(stage["facts"], **{k: v for k, v in found.items() if k in stage["fact_names"]}))
        for stage in stages
    ]
    done, skipped, changed = record_and_write(module, spec["path"], stages, plan)
    out = dict(recorded=done, reasons=skipped, changed=changed)
    if plan is not None:
        out["plan"] = "plan" not in skipped
    return out
