#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_image
short_description: Pull, build or graft a vLLM runtime image, verify it, promote it, copy it to the other nodes
description:
  - Gets a runtime image from one of three sources (O(pull), O(build), O(graft)) on the node's engine.
  - Verifies it in a throwaway container whose entrypoint is overridden (no network) with C(pip check),
    C(import vllm, transformers) and their versions, the model's C(config.json) architecture in
    C(vllm.ModelRegistry.get_supported_archs()) (after vLLM's general plugins load), and
    C(transformers.AutoConfig) loading that config. The image's own Entrypoint and Cmd are reported.
  - Only an image that passes is tagged O(in_service_tag). When verification fails the module fails,
    the image in service stays as it was, and the message quotes each cause.
  - Then streams C(docker save) from this engine into C(docker load) on each of O(peers) whose
    O(in_service_tag) image ID differs (engine to engine, never through the controller), and checks
    that every peer ends with the same image ID.
  - Idempotent. A build or graft is labelled with a hash of its inputs; the same inputs again
    build nothing, copy nothing and report no change.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.docker
  - dgx_spark.vllm.attributes
attributes:
  check_mode:
    support: full
    description:
      - Builds, pulls, tags and copies nothing.
      - An image already on the engine is still verified (in a throwaway container).
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  name:
    description:
      - Repository and tag given to the image that O(build) or O(graft) produces (the candidate).
      - With O(pull), the pulled reference is the candidate and this is ignored.
    type: str
    default: dgx-spark/vllm-runtime:candidate
  pull:
    description:
      - Image reference (tag or digest) to pull when the engine does not have it.
    type: str
  build:
    description:
      - Build the candidate from a build context on the node.
    type: dict
    suboptions:
      context:
        description: Directory on the node holding the build context.
        type: path
        required: true
      dockerfile:
        description: Dockerfile path relative to O(build.context).
        type: str
        default: Dockerfile
      args:
        description: Build arguments.
        type: dict
        default: {}
  graft:
    description:
      - Build the candidate as a multi-stage Dockerfile from O(graft.base), with files copied from
        O(graft.donor), pip requirements added and model registry entries added (as a vLLM general plugin).
    type: dict
    suboptions:
      base:
        description: Image the candidate starts from; must exist on the engine.
        type: str
        required: true
      donor:
        description: Image the files come from; must exist on the engine.
        type: str
        required: true
      files:
        description:
          - Absolute paths in the donor copied to the same path, or dicts with C(src) and C(dest).
        type: list
        elements: raw
        default: []
      pip_requirements:
        description: Requirement specifiers installed with the image's pip after the files are copied.
        type: list
        elements: str
        default: []
      registry:
        description: Model registry entries to add.
        type: list
        elements: dict
        default: []
        suboptions:
          architecture:
            description: Architecture name as in C(config.json), for example C(Qwen3_5MoeForConditionalGeneration).
            type: str
            required: true
          class:
            description: Model class as C(module:Class), importable in the image.
            type: str
            required: true
  model_dir:
    description:
      - Model directory on the node; its C(config.json) gives the architectures to check and the
        config that C(AutoConfig) must load.
    type: path
  architecture:
    description:
      - Architecture to check when there is no model directory.
    type: str
  python:
    description:
      - Python interpreter inside the image, used for verification and for graft steps.
    type: str
    default: python3
  in_service_tag:
    description:
      - Tag that marks the verified image in service, on this node and on every peer.
    type: str
    default: dgx-spark/vllm-runtime:in-service
  verify_timeout:
    description:
      - Seconds the verification container may run.
    type: int
    default: 300
  copy_timeout:
    description:
      - Seconds the copy to O(peers) waits on either engine before it gives up. C(docker save) sends its
        first byte only after this node's engine has written the whole image to its temporary directory,
        and C(docker load) answers only after the peer has unpacked it; for a 20 GB image on a slow disk
        each takes minutes.
      - With O(copy_topology=chain), the seconds without a byte moving before this node stops the stream; a peer
        stops a C(docker load) that takes nothing for half of it (a frozen engine or disk; the peers after it
        still get the stream).
    type: int
    default: 1800
  require_ray:
    description:
      - Refuse an image where C(import ray) fails. The Ray backend runs its cluster inside the image; vLLM's
        own multiprocessing backend (C(vllm_server_backend=mp)) needs no Ray, and vLLM's release images ship
        without it.
    type: bool
    default: true
  require_ray_agent:
    description:
      - Refuse an image whose Ray is plain C(ray), without the metrics agent of C(ray[default]) (Ray's own test,
        C(ray._private.utils.get_dashboard_dependency_error)). Set where every node's Ray metrics are scraped.
    type: bool
    default: false
  verified_record:
    description:
      - A JSON file on this node that remembers passed verifications, keyed by a hash of the image ID,
        the model config, the architectures, the Python and the verification script. An image ID is its
        content, so the same key passes again and is not re-run (C(verification.recorded) is then true).
        A failed verification is never recorded. Unset (the default), every run verifies.
    type: path
  peers:
    description:
      - The other nodes' engines that must end with the same image, for example C(ssh://root@198.18.10.12)
        (this node needs SSH to them, and the C(docker) CLI must be on them).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Name used in results and messages.
        type: str
        required: true
      docker_host:
        description:
          - Docker API address of the peer's engine as reached from this node; C(ssh://USER@ADDRESS) for
            O(copy_topology=chain).
        type: str
        required: true
  copy_topology:
    description:
      - How the image reaches the O(peers) that lack it. C(star) streams C(docker save) here into C(docker load) on
        each peer in turn (this node sends one copy per peer). C(chain) streams one C(docker save) to the first
        peer over SSH; each peer runs C(docker load) and passes the same bytes on to the next as they arrive, so
        this node sends one copy whatever the number of peers. Each peer's image ID is read afterwards either way.
      - C(chain) needs O(ssh_key), C(ssh://USER@ADDRESS) peers, and each relayed peer's host key in
        O(ssh_known_hosts) (a peer passes the stream on only to a host key this node knows); the peers need
        python3 and the C(docker) CLI.
    type: str
    choices: [star, chain]
    default: star
  ssh_key:
    description:
      - This node's key for SSH to the peers (O(copy_topology=chain)); it goes to a private ssh-agent forwarded
        for the copy's length, never to a peer.
    type: path
  ssh_known_hosts:
    description:
      - known_hosts file holding the peers' host keys (O(copy_topology=chain)); the user's own by default.
    type: path
notes:
  - Bad input fails before anything is built or tagged, naming the parameter.
seealso:
  - module: dgx_spark.vllm.vllm_serve
"""

EXAMPLES = r"""
- name: Verify and promote the community image, copy it to the workers
  dgx_spark.vllm.vllm_image:
    pull: registry.example/vllm/vllm-openai:v0.33.0
    model_dir: /models/Qwen3.5-122B-A10B-FP8
    peers:
      - name: spark-b
        docker_host: ssh://root@spark-b

- name: Graft newer model files into an older image (verification names what is missing)
  dgx_spark.vllm.vllm_image:
    name: dgx-spark/vllm-runtime:graft
    graft:
      base: dgx-spark-lab/runtime-old:latest
      donor: dgx-spark-lab/runtime-donor:latest
      files:
        - /opt/venv/lib/python3.11/site-packages/vllm/model_executor/models/qwen3_5.py
      pip_requirements:
        - transformers>=5
      registry:
        - architecture: Qwen3_5MoeForConditionalGeneration
          class: vllm.model_executor.models.qwen3_5_moe:Qwen3_5MoeForConditionalGeneration
    architecture: Qwen3_5MoeForConditionalGeneration

- name: Build from a context on the node
  dgx_spark.vllm.vllm_image:
    build:
      context: /srv/vllm-image
      args:
        VLLM_VERSION: 0.33.0
    model_dir: /models/Qwen3.5-122B-A10B-FP8
"""

RETURN = r"""
image:
  description: Reference of the candidate image.
  returned: always
  type: str
  sample: dgx-spark/vllm-runtime:candidate
image_id:
  description: ID of the candidate image (null in check mode when it would be built or pulled).
  returned: always
  type: str
  sample: sha256:0f3c...
in_service_id:
  description: ID of the image tagged O(in_service_tag) after the run.
  returned: always
  type: str
inputs_hash:
  description: Hash of the source inputs, kept in the image label C(dgx_spark.vllm.inputs).
  returned: always
  type: str
built:
  description: Whether the image was built (or pulled) in this run.
  returned: always
  type: bool
promoted:
  description: Whether O(in_service_tag) moved to the candidate in this run.
  returned: always
  type: bool
dockerfile:
  description: The generated Dockerfile of a graft.
  returned: when O(graft) is used
  type: str
verification:
  description: What the throwaway container found, and the image's own entrypoint.
  returned: when the image exists
  type: dict
  contains:
    passed:
      description: Whether every check passed.
      type: bool
    recorded:
      description: True when the result came from O(verified_record) (this image, model and checks passed before).
      type: bool
    causes:
      description: One line per failed check.
      type: list
      elements: str
    pip_check:
      description: Output lines of C(pip check).
      type: list
      elements: str
    vllm_version:
      description: C(vllm.__version__) in the image.
      type: str
    transformers_version:
      description: C(transformers.__version__) in the image.
      type: str
    ray_version:
      description: C(ray.__version__) in the image (the Ray cluster runs inside it).
      type: str
    ray_agent:
      description:
        - Whether the image's Ray is C(ray[default]), with the metrics agent (Ray's own
          C(ray._private.utils.get_dashboard_dependency_error)); null without Ray or for an older recorded verification.
      type: bool
    architectures:
      description: Architectures checked.
      type: list
      elements: str
    architecture_supported:
      description: Whether one of them is registered.
      type: bool
    closest_architectures:
      description: Registered architectures closest to a missing one.
      type: list
      elements: str
    autoconfig_class:
      description: Config class AutoConfig returned.
      type: str
    registered_architectures:
      description: How many architectures the registry has.
      type: int
    python:
      description: Python version in the image.
      type: str
    entrypoint:
      description: The image's own Entrypoint (overridden for verification, and by the collection's launchers).
      type: list
      elements: str
    cmd:
      description: The image's own Cmd.
      type: list
      elements: str
peers:
  description: One entry per peer.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Peer name.
      type: str
    image_id_before:
      description: Peer's in-service image ID before.
      type: str
    image_id:
      description: Peer's in-service image ID after.
      type: str
    bytes_moved:
      description: Bytes that reached the peer (from this node, or from the peer before it in the chain).
      type: int
    seconds:
      description: Seconds the stream to the peer took (0 when its image ID already matched).
      type: float
    source:
      description: Where the peer's copy came from, C(this node) or the peer before it in the chain; empty when
        its image ID already matched.
      type: str
bytes_moved:
  description: Bytes that reached all peers together (with O(copy_topology=chain) more than this node sent).
  returned: always
  type: int
sent_bytes:
  description: Bytes this node sent into the chain (one copy whatever the number of peers).
  returned: when O(copy_topology=chain) copied to a peer
  type: int
chain_seconds:
  description: Seconds the chain copy took, from this node's docker save to the last peer's docker load.
  returned: when O(copy_topology=chain) copied to a peer
  type: float
failed_peer:
  description: Name of the peer whose copy broke (its engine stopped answering, or the stream broke).
  returned: when a copy to a peer fails (not when this node's own docker save failed)
  type: str
"""

import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _chain_copy, _ssh
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import DOCKER_COMMON_ARGS, connect, docker_client
from ansible_collections.dgx_spark.vllm.plugins.module_utils._image import (
    INPUTS_LABEL,
    VERIFY_SCRIPT,
    CopyBroken,
    DockerException,
    ImageError,
    build_image,
    canonical_hash,
    evaluate,
    graft_context,
    graft_dockerfile,
    image_id,
    image_or_none,
    missing_donor_paths,
    normalize_files,
    parse_verification,
    read_model_config,
    registry_entries,
    run_verification,
    stream_image,
    tree_hash,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import read_text, write_text

# A peer the chain reaches: ssh://USER@ADDRESS, an IPv6 address bare or bracketed, no port.
SSH_PEER = re.compile(r"^ssh://(?P<user>[^-@/\s][^@/\s]*)@(?:\[(?P<bracketed>[^\]/@]+)\]|(?P<address>[^\[\]/@]+))$")
# Docker's reference grammar, simplified: lower-case path components, optional tag and digest.
IMAGE_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+:[a-f0-9]{32,})?$"
)


class ImageManager:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.client = docker_client(module)
        self.result = {"changed": False, "built": False, "promoted": False, "bytes_moved": 0, "peers": []}
        self.before = {}
        self.after = {}

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, **dict(self.result, **extra))

    # Inputs: everything checked before anything is built or tagged.
    def check_inputs(self):
        p = self.p
        if p["copy_topology"] == "chain" and p["peers"]:
            self.check_chain_inputs()
        if p["pull"] and not IMAGE_REFERENCE.match(p["pull"]):
            raise ImageError(
                "pull: %r is not an image reference; write [registry/]repository[:tag][@digest] in lower case, "
                "e.g. nvcr.io/nvidia/vllm:25.09-py3" % p["pull"]
            )
        self.config_text, self.archs = None, [p["architecture"]] if p["architecture"] else []
        if p["model_dir"]:
            self.config_text, self.archs = read_model_config(p["model_dir"])
        if p["build"]:
            context = p["build"]["context"]
            if not os.path.isdir(context):
                raise ImageError("build.context: %s is not a directory on this node" % context)
            if not os.path.isfile(os.path.join(context, p["build"]["dockerfile"])):
                raise ImageError("build.dockerfile: %s has no %s" % (context, p["build"]["dockerfile"]))
            return {"build": p["build"], "context": tree_hash(context)}
        if p["graft"]:
            graft = p["graft"]
            ids = {}
            for key in ("base", "donor"):
                ids[key] = image_id(self.client, graft[key])
                if ids[key] is None:
                    raise ImageError("graft.%s: image %s does not exist on this node's engine" % (key, graft[key]))
            files = normalize_files(graft["files"])
            registry_entries(graft)
            missing = missing_donor_paths(self.client, graft["donor"], [pair[0] for pair in files])
            if missing:
                raise ImageError("graft.files: not in donor image %s: %s" % (graft["donor"], ", ".join(missing)))
            graft = dict(graft, python=p["python"])
            self.result["dockerfile"] = graft_dockerfile(graft)
            return {"graft": graft, "ids": ids, "dockerfile": self.result["dockerfile"]}
        return {"pull": p["pull"]}

    def check_chain_inputs(self):
        if not self.p["ssh_key"]:
            raise ImageError(
                "ssh_key: copy_topology=chain needs this node's key for SSH to the peers; or copy_topology=star"
            )
        users = set()
        for index, peer in enumerate(self.p["peers"]):
            found = SSH_PEER.match(peer["docker_host"])
            # One colon is HOST:PORT: the hops reach each other on port 22 (an IPv6 address has several).
            if not found or (found.group("address") or "").count(":") == 1:
                raise ImageError(
                    "peers[%d].docker_host: %r is not ssh://USER@ADDRESS (no port), which copy_topology=chain "
                    "streams over; or copy_topology=star" % (index, peer["docker_host"])
                )
            users.add(found.group("user"))
            # Each hop reaches the next as the first peer's user (the relays share one forwarded key).
            if len(users) > 1:
                raise ImageError(
                    "peers[%d].docker_host: %r is not the user the other peers are reached as (%s); copy_topology="
                    "chain reaches every peer as one user; or copy_topology=star"
                    % (index, peer["docker_host"], sorted(users - {found.group("user")})[0])
                )

    def obtain(self, inputs):
        """The candidate image, built or pulled only when missing or its inputs changed."""
        p = self.p
        ref = p["pull"] or p["name"]
        self.result["image"] = ref
        inputs_hash = canonical_hash(inputs)
        self.result["inputs_hash"] = inputs_hash
        image = image_or_none(self.client, ref)
        self.before["image_id"] = image.id if image else None
        current = image is not None and (p["pull"] or image.labels.get(INPUTS_LABEL) == inputs_hash)
        if not current and not self.module.check_mode:
            labels = {INPUTS_LABEL: inputs_hash}
            if p["pull"]:
                image = self.client.images.pull(p["pull"])
            elif p["build"]:
                build = p["build"]
                image = build_image(
                    self.client, ref, labels, build["args"], path=build["context"], dockerfile=build["dockerfile"]
                )
            else:
                image = build_image(self.client, ref, labels, fileobj=graft_context(inputs["graft"]))
            image.reload()
        self.result["built"] = not current
        self.result["image_id"] = image.id if (current or not self.module.check_mode) else None
        self.after["image_id"] = self.result["image_id"]
        return image if self.result["image_id"] else None

    def verify(self, image):
        checks = [image.id, self.config_text, self.archs, self.p["python"], VERIFY_SCRIPT]
        if not self.p["require_ray"]:
            checks.append("no ray")  # a record made without the Ray check does not pass an image that needs Ray
        if self.p["require_ray_agent"]:
            checks.append("ray agent")  # likewise for the metrics agent
        key = canonical_hash(checks)
        records = self.read_records()
        if key in records:
            self.result["verification"] = dict(records[key], recorded=True)
            return []
        output = run_verification(self.client, image.id, self.p["python"], self.config_text, self.p["verify_timeout"])
        facts, causes = evaluate(
            parse_verification(output), self.archs, self.p["require_ray"], self.p["require_ray_agent"]
        )
        config = image.attrs.get("Config") or {}
        facts.update(passed=not causes, causes=causes, entrypoint=config.get("Entrypoint"), cmd=config.get("Cmd"))
        self.result["verification"] = dict(facts, recorded=False)
        if not causes and self.p["verified_record"] and not self.module.check_mode:
            records[key] = facts
            self.write_records(records)
        return causes

    def read_records(self):
        text = read_text(self.p["verified_record"]) if self.p["verified_record"] else None
        try:
            records = json.loads(text) if text else {}
        except ValueError:
            return {}  # unreadable: verify again, and rewrite it
        return records if isinstance(records, dict) else {}

    def write_records(self, records):
        write_text(self.module, self.p["verified_record"], json.dumps(records, sort_keys=True), "0600")

    def promote(self):
        tag = self.p["in_service_tag"]
        in_service = image_id(self.client, tag)
        self.before["in_service_id"] = in_service
        target = self.result["image_id"]
        if target and in_service != target and not self.module.check_mode:
            repo, version = tag.rsplit(":", 1)
            self.client.images.get(target).tag(repo, version)
        self.result["promoted"] = in_service != target
        self.after["in_service_id"] = target
        self.result["in_service_id"] = target if target else in_service

    def distribute(self):
        tag, target = self.p["in_service_tag"], self.result["image_id"]
        entries = []
        for peer in self.p["peers"]:
            try:
                client = connect(peer["docker_host"], self.p["docker_timeout"])
            except DockerException as exc:
                self.fail("peers: %s (%s) is not reachable: %s" % (peer["name"], peer["docker_host"], exc))
            before = self.peer_image_id(peer, client, tag)
            entry = {"name": peer["name"], "image_id_before": before, "image_id": before, "bytes_moved": 0}
            entry.update(seconds=0.0, source="")
            entries.append((peer, client, entry))
        differ = [item for item in entries if item[2]["image_id_before"] != target]
        copied = differ if target and not self.module.check_mode else []
        if copied and self.p["copy_topology"] == "chain":
            self.chain([(peer, entry) for peer, _client, entry in copied])
        else:
            for peer, _client, entry in copied:
                started = time.monotonic()
                try:
                    source = connect(self.p["docker_host"], self.p["copy_timeout"])
                    sink = connect(peer["docker_host"], self.p["copy_timeout"])
                    entry["bytes_moved"] = stream_image(source, sink, tag)
                except CopyBroken as exc:
                    self.copy_broken(peer, entry["image_id_before"], exc)
                entry.update(seconds=round(time.monotonic() - started, 2), source="this node")
        for peer, client, entry in differ:
            # Read back from the peer's engine (the image ID is its content), or what check mode would leave.
            entry["image_id"] = self.peer_image_id(peer, client, tag) if copied else target
            if entry["image_id"] != target:
                self.fail(
                    "peers: %s has %s as %s after the copy, not %s" % (peer["name"], entry["image_id"], tag, target)
                )
        for peer, _client, entry in entries:
            self.before["peer " + peer["name"]] = entry["image_id_before"]
            self.after["peer " + peer["name"]] = entry["image_id"]
            self.result["peers"].append(entry)
            self.result["bytes_moved"] += entry["bytes_moved"]

    def peer_image_id(self, peer, client, tag):
        """The peer's image ID of `tag`; an engine that cannot read it fails the run naming that peer."""
        try:
            return image_id(client, tag)
        except DockerException as exc:
            self.fail(
                "peers: the Docker engine on %s (%s) could not read %s: %s. Where it names a missing "
                "/var/lib/docker/overlay2 directory, that engine's image store lost a layer (a full disk, or a load or "
                "removal cut off): on %s remove the containers made from it, then the image (docker rm -f $(docker "
                "ps -aq --filter ancestor=%s); docker image rm -f %s), and run the deploy again, which copies it anew "
                "and starts them again." % (peer["name"], peer["docker_host"], tag, exc, peer["name"], tag, tag)
            )

    def chain(self, stale):
        """One docker save down the stale peers in order, each loading it; fail naming the hops that did not."""
        tag = self.p["in_service_tag"]
        hops = []
        for peer, entry in stale:
            found = SSH_PEER.match(peer["docker_host"])
            address = found.group("bracketed") or found.group("address")
            hops.append(dict(host=peer["name"], address=address, user=found.group("user"), load=True))
            entry["source"] = hops[-2]["host"] if len(hops) > 1 else "this node"
        bins = {name: self.module.get_bin_path(name, required=True) for name in (*_chain_copy.BINARIES, "docker")}
        started = time.monotonic()
        try:
            sent = _chain_copy.send(
                _chain_copy.image_source(bins["docker"], self.p["docker_host"], tag),
                hops,
                bins=bins,
                ssh_argv=_ssh.client_argv(bins["ssh"], self.p["ssh_key"], self.p["ssh_known_hosts"]),
                user=hops[0]["user"],
                key=self.p["ssh_key"],
                known_hosts=self.p["ssh_known_hosts"],
                fallback="copy_topology=star (runtime_image_copy_topology)",
                idle_timeout=self.p["copy_timeout"],
            )
        except (OSError, RuntimeError) as exc:
            self.fail("peers: the chain copy of %s could not start: %s" % (tag, exc))
        by_host = {report["host"]: report for report in sent["reports"]}
        for _peer, entry in stale:
            report = by_host.get(entry["name"], {})
            entry.update(bytes_moved=report.get("bytes", 0), seconds=report.get("seconds", 0.0))
        self.result["sent_bytes"] = sent["reports"][0]["bytes"] if sent["reports"] else 0
        self.result["chain_seconds"] = round(time.monotonic() - started, 2)
        failed = [r for r in sent["reports"] if not r["ok"]]
        if failed or sent["source_error"] or sent["stalled"]:
            reasons = [why for why in (sent["source_error"], sent["stalled"]) if why]
            reasons += [self.hop_failure(r, stale) for r in failed]
            # A broken docker save here fails the first load too: the peer is not the cause.
            if failed and not sent["source_error"]:
                self.result["failed_peer"] = failed[0]["host"]
            self.fail(
                "peers: the chain copy of %s (%s) did not complete: %s. A peer keeps what it had as %s unless its "
                "docker load finished; check SSH between these nodes (the next node's host key known to this node) "
                "and `docker info` on each, then run the deploy again; or set copy_topology=star "
                "(runtime_image_copy_topology)."
                % (tag, " -> ".join(["this node"] + [h["host"] for h in hops]), "; ".join(reasons), tag)
            )

    def hop_failure(self, report, stale):
        """One failed hop: how many bytes reached it, and whether its engine still answers."""
        peer = next(p for p, _entry in stale if p["name"] == report["host"])
        why = report["error"]
        # A hop after a broken one was never asked: its engine is not the cause.
        if not why.startswith("not reached"):
            try:
                connect(peer["docker_host"], 10)
            except DockerException:
                why = "the Docker engine on %s stopped answering (%s)" % (report["host"], why)
        return "to %s after %d bytes (%.1f MiB): %s" % (
            report["host"],
            report["bytes"],
            report["bytes"] / 1048576.0,
            why,
        )

    def copy_broken(self, peer, before, exc):
        """Fail naming the peer, which engine stopped answering, how far the copy got and what to run."""
        name, host, tag = peer["name"], peer["docker_host"], self.p["in_service_tag"]
        try:
            connect(host, 10)
            peer_answers = True
        except DockerException:
            peer_answers = False
        sent = exc.bytes_sent
        try:
            self.client.ping()
            why = "the stream broke" if peer_answers else "the Docker engine on %s stopped answering" % name
            if peer_answers and exc.timed_out:
                silent = "this node's docker save" if sent == 0 else "docker save here or docker load on %s" % name
                why = (
                    "%s sent nothing for copy_timeout (%d s; the role's runtime_image_copy_timeout): raise it "
                    "for a large image on a slow disk" % (silent, self.p["copy_timeout"])
                )
        except DockerException:
            why = "this node's own Docker engine stopped answering"
        self.result["failed_peer"] = name
        self.fail(
            "peers: copying %s to %s (%s) failed after %d bytes (%.1f MiB) were sent: %s (%s). %s keeps what it "
            "had as %s (%s); nothing was tagged there. Check that `docker info` answers on %s (systemctl status "
            "docker), then run the deploy again: the copy starts over."
            % (tag, name, host, sent, sent / 1048576.0, why, exc, name, tag, before or "no image", name)
        )

    def run(self):
        try:
            inputs = self.check_inputs()
            image = self.obtain(inputs)
            if image is not None:
                causes = self.verify(image)
                if causes:
                    self.result["in_service_id"] = image_id(self.client, self.p["in_service_tag"])
                    self.result["changed"] = self.result["built"]
                    self.fail(
                        "image %s failed verification; %s stays in service (%s):\n- %s"
                        % (self.result["image"], self.p["in_service_tag"], self.result["in_service_id"] or "none yet",
                           "\n- ".join(causes))
                    )  # fmt: skip
            self.promote()
            self.distribute()
        except ImageError as exc:
            self.fail(str(exc))
        except DockerException as exc:
            self.fail("Docker engine error: %s" % exc)
        self.result["changed"] = self.before != self.after or self.result["built"]
        if self.module._diff:
            self.result["diff"] = {"before": self.before, "after": self.after}
        self.module.exit_json(**self.result)


def main():
    argument_spec = dict(
        name=dict(type="str", default="dgx-spark/vllm-runtime:candidate"),
        pull=dict(type="str"),
        build=dict(
            type="dict",
            options=dict(
                context=dict(type="path", required=True),
                dockerfile=dict(type="str", default="Dockerfile"),
                args=dict(type="dict", default={}),
            ),
        ),
        graft=dict(
            type="dict",
            options=dict(
                base=dict(type="str", required=True),
                donor=dict(type="str", required=True),
                files=dict(type="list", elements="raw", default=[]),
                pip_requirements=dict(type="list", elements="str", default=[]),
                registry=dict(
                    type="list",
                    elements="dict",
                    default=[],
                    options={"architecture": dict(type="str", required=True), "class": dict(type="str", required=True)},
                ),
            ),
        ),
        model_dir=dict(type="path"),
        architecture=dict(type="str"),
        python=dict(type="str", default="python3"),
        in_service_tag=dict(type="str", default="dgx-spark/vllm-runtime:in-service"),
        verify_timeout=dict(type="int", default=300),
        copy_timeout=dict(type="int", default=1800),
        verified_record=dict(type="path"),
        require_ray=dict(type="bool", default=True),
        require_ray_agent=dict(type="bool", default=False),
        peers=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(name=dict(type="str", required=True), docker_host=dict(type="str", required=True)),
        ),
        copy_topology=dict(type="str", choices=["star", "chain"], default="star"),
        ssh_key=dict(type="path", no_log=False),
        ssh_known_hosts=dict(type="path"),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    module = AnsibleModule(
        argument_spec=argument_spec,
        mutually_exclusive=[("pull", "build", "graft"), ("model_dir", "architecture")],
        required_one_of=[("pull", "build", "graft")],
        supports_check_mode=True,
    )
    ImageManager(module).run()


if __name__ == "__main__":
    main()
