#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A complete model directory on this node: verify, download, manifest, sync to workers, drop caches."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_files
short_description: Verify, download and sync a model directory; drop the page cache
description:
  - Verifies on the node it runs on that a model directory is complete, C(config.json), and
    C(model.safetensors.index.json) with every shard its C(weight_map) lists, or a single
    C(model.safetensors). Each shard's expected size is read from its own safetensors header, so a
    shard cut short is named.
  - With O(download=true), downloads a missing or incomplete model from the Hugging Face hub with
    C(huggingface_hub.snapshot_download) (resumable) when that library is importable on the node.
  - Returns a manifest (relative path, size, fingerprint) and its digest, so a role can compare
    nodes and sync only the ones that differ.
  - With O(sync_to), copies the directory from this node to the listed nodes over SSH on the fabric,
    node to node (the payload never passes through the controller). With O(sync_topology=chain) (the
    default) this node streams one tar of the files some node lacks to the first node; each node writes
    the files it lacks and passes the same bytes on to the next as they arrive, so this node sends one
    copy whatever the number of nodes. Files a node holds that this node does not (an older revision's
    shards) are removed there. A node that holds every file (its O(sync_to[].manifest) equals this
    node's) is left out. The next node's SSH uses this node's key through a private, forwarded
    C(ssh-agent) (no key is copied) and the host keys this node knows for that address. With
    O(sync_topology=star), this node runs C(rsync --delete) to each node in turn (one copy per node).
  - A chain copy interrupted resumes by file on the next run (the files a node holds whole are not
    sent again); rsync resumes inside a file.
  - With O(drop_caches=true), drops the page cache (on unified-memory nodes the page cache competes
    with GPU memory); where C(/proc/sys) is read-only (containers) this is reported, not failed.
    Dropping caches is an action, not a state, so it does not count as a change.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  path:
    description: Model directory on this node.
    type: path
    required: true
  repo_id:
    description: Hugging Face repository id (e.g. C(Qwen/Qwen3.5-122B-A10B-FP8)), for O(download=true).
    type: str
  revision:
    description: Hub revision (branch, tag or commit) to download.
    type: str
  token:
    description: Hugging Face token for gated or private repositories.
    type: str
  download:
    description: Download from the hub when the directory is missing or incomplete.
    type: bool
    default: false
  fingerprint:
    description:
      - How files are fingerprinted in the manifest. V(size) only sizes; V(sample) SHA-256 of the size
        and the first and last MiB (cheap); V(sha256) the whole file (slow on 119 GB).
    type: str
    choices: [size, sample, sha256]
    default: sample
  fail_on_incomplete:
    description: Fail when the directory is not complete (after any download).
    type: bool
    default: true
  sync_to:
    description: Nodes to copy the directory to, from this node, over SSH.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: Inventory hostname (for the report).
        type: str
        required: true
      address:
        description: The node's fabric address.
        type: str
        required: true
      path:
        description: Directory on that node; defaults to O(path).
        type: path
      manifest:
        description:
          - That node's manifest (the RV(manifest) of this module run there). With O(sync_topology=chain),
            only the files whose size or fingerprint differ are written there; omitted, every file is.
        type: list
        elements: dict
  sync_topology:
    description:
      - V(chain) streams through the O(sync_to) nodes in their order (this node sends one copy);
        V(star) copies from this node to each one with C(rsync) (one copy each).
    type: str
    choices: [chain, star]
    default: chain
  ssh_user:
    description: SSH user on the O(sync_to) nodes.
    type: str
    default: root
  ssh_key:
    description: Private key on this node for SSH to the O(sync_to) nodes.
    type: path
  ssh_known_hosts:
    description: Known-hosts file on this node for those connections (new host keys are accepted and recorded).
    type: path
  drop_caches:
    description: Drop the page cache at the end (unified-memory nodes, before a model loads).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Model complete on the head (download when missing)
  dgx_spark.vllm.model_files:
    path: /opt/models/Qwen3.5-122B-A10B-FP8
    repo_id: Qwen/Qwen3.5-122B-A10B-FP8
    download: true
    token: "{{ vault_hf_token | default(omit) }}"

- name: Copy to the worker over the fabric
  dgx_spark.vllm.model_files:
    path: /opt/models/Qwen3.5-122B-A10B-FP8
    sync_to:
      - {host: spark-b, address: 192.168.100.12}
    ssh_key: /root/.ssh/dgx_spark_vllm_sync
"""

RETURN = r"""
state:
  description: V(complete), V(incomplete) or V(missing).
  returned: always
  type: str
layout:
  description: V(sharded) (index and shards), V(single) (one model.safetensors) or null.
  returned: always
  type: str
shards:
  description: Number of weight files.
  returned: always
  type: int
missing:
  description: Files that should exist and do not.
  returned: always
  type: list
  elements: str
short:
  description: Shards smaller than their own header says (file, size, expected).
  returned: always
  type: list
  elements: dict
manifest:
  description: Regular files as relative path, size and fingerprint.
  returned: always
  type: list
  elements: dict
manifest_digest:
  description: SHA-256 of the manifest; equal digests mean identical directories.
  returned: always
  type: str
total_bytes:
  description: Bytes in the manifest.
  returned: always
  type: int
download:
  description: Whether a download was attempted, and how it went.
  returned: always
  type: dict
synced:
  description:
    - One record per O(sync_to) node (host, address, changed, seconds, files). A chain copy adds
      C(source) (the node it streamed from), C(bytes) (received) and C(error).
  returned: always
  type: list
  elements: dict
page_cache:
  description: Whether the page cache was dropped (C(requested), C(dropped), C(reason)).
  returned: always
  type: dict
sent_bytes:
  description: Bytes this node sent for a chain copy (one stream, whatever the number of nodes); 0 with V(star).
  returned: always
  type: int
"""

import os
import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _chain_copy, _model, _ssh

try:
    from huggingface_hub import snapshot_download

    HAS_HF_HUB = True
    HF_HUB_IMPORT_ERROR = None
except ImportError:  # only needed for download=true; reported then
    snapshot_download = None
    HAS_HF_HUB = False
    HF_HUB_IMPORT_ERROR = traceback.format_exc()

SAFE_PATH = re.compile(r"^[A-Za-z0-9_./@+-]+$")


class ModelFiles:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.result = dict(
            changed=False,
            download=dict(attempted=False, ok=None, message=""),
            synced=[],
            sent_bytes=0,
            page_cache=dict(requested=self.p["drop_caches"], dropped=False, reason=""),
        )

    def run(self):
        self.check_input()
        report = _model.verify(self.p["path"])
        if report["state"] != "complete" and self.p["download"]:
            report = self.download(report)
        self.result.update(report)
        if report["state"] != "complete" and self.p["fail_on_incomplete"]:
            self.module.fail_json(msg=self.incomplete_message(report), **self.result)
        if os.path.isdir(self.p["path"]):
            entries, digest = _model.manifest(self.p["path"], self.p["fingerprint"])
        else:
            entries, digest = [], ""
        self.result.update(manifest=entries, manifest_digest=digest, total_bytes=sum(e["size"] for e in entries))
        if self.p["sync_topology"] == "chain":
            self.chain(entries)
        else:
            for target in self.p["sync_to"]:
                self.sync(target)
        if self.p["drop_caches"]:
            if self.module.check_mode:
                self.result["page_cache"]["reason"] = "check mode"
            else:
                self.result["page_cache"].update(_model.drop_page_cache())
        self.module.exit_json(**self.result)

    def check_input(self):
        errors = []
        if self.p["download"] and not self.p["repo_id"]:
            errors.append("repo_id: required with download=true (e.g. Qwen/Qwen3.5-122B-A10B-FP8)")
        if self.p["sync_to"]:
            if not self.p["ssh_key"]:
                errors.append("ssh_key: required with sync_to (a key on this node that the targets accept)")
            for key in ("path", "ssh_key", "ssh_known_hosts"):
                if self.p[key] and not SAFE_PATH.match(self.p[key]):
                    errors.append(
                        "%s: %r has characters rsync's -e or a remote path would split; use a plain path"
                        % (key, self.p[key])
                    )
            for target in self.p["sync_to"]:
                if target.get("path") and not SAFE_PATH.match(target["path"]):
                    errors.append("sync_to.path: %r is not a plain path" % target["path"])
        if errors:
            self.module.fail_json(msg="; ".join(errors))

    def download(self, before):
        info = self.result["download"]
        info["attempted"] = True
        if self.module.check_mode:
            info["message"] = "check mode: would download %s" % self.p["repo_id"]
            return before
        if not HAS_HF_HUB:
            self.module.fail_json(
                msg=missing_required_lib("huggingface_hub")
                + " It is needed on this node to download %s; or put the model at %s yourself."
                % (self.p["repo_id"], self.p["path"]),
                exception=HF_HUB_IMPORT_ERROR,
                **self.result,
            )
        started = time.monotonic()
        try:
            snapshot_download(
                repo_id=self.p["repo_id"],
                revision=self.p["revision"],
                local_dir=self.p["path"],
                token=self.p["token"],
            )
        except Exception as exc:  # the hub library raises many kinds; all end here
            info.update(ok=False, message=str(exc))
            self.module.fail_json(
                msg="Could not download %s from the Hugging Face hub on this node: %s: %s. "
                "Check the node's access to huggingface.co (and the token for gated repos); a node that "
                "cannot reach the hub (like the lab) needs the files put at %s by other means; "
                "an interrupted download resumes on the next run."
                % (self.p["repo_id"], type(exc).__name__, exc, self.p["path"]),
                **self.result,
            )
        info.update(ok=True, seconds=round(time.monotonic() - started, 1))
        self.result["changed"] = True
        return _model.verify(self.p["path"])

    def incomplete_message(self, report):
        parts = ["path: model directory %s is %s." % (self.p["path"], report["state"])]
        if report["missing"]:
            parts.append("Missing: %s." % ", ".join(report["missing"]))
        for item in report["short"]:
            if item.get("expected"):
                parts.append("Short: %s (%d of %d bytes)." % (item["file"], item["size"], item["expected"]))
            else:
                parts.append("Unreadable: %s (%s)." % (item["file"], item["problem"]))
        parts.extend(p + "." for p in report["problems"])
        if not self.p["download"]:
            parts.append("Download it again (download=true with repo_id) or copy the files, then rerun.")
        return " ".join(parts)

    def chain(self, entries):
        targets = [dict(t, path=t.get("path") or self.p["path"]) for t in self.p["sync_to"]]
        hops, files = _chain_copy.plan(entries, targets)
        records = {}
        for target in targets:
            records[target["host"]] = dict(host=target["host"], address=target["address"], changed=False)
            records[target["host"]].update(seconds=0.0, files=0, bytes=0, source="", error="")
        self.result["synced"] = list(records.values())
        if not hops:
            return
        self.result["changed"] = True
        for previous, hop in zip([dict(host="this node"), *hops], hops):
            records[hop["host"]].update(changed=True, files=len(hop["extract"]), source=previous["host"])
            records[hop["host"]]["removed"] = len(hop["remove"])
        if self.module.check_mode:
            return
        bins = {name: self.module.get_bin_path(name, required=True) for name in (*_chain_copy.BINARIES, "tar")}
        try:
            sent = _chain_copy.send(
                _chain_copy.tar_source(bins["tar"], self.p["path"], files),
                hops,
                bins=bins,
                ssh_argv=self.ssh_argv(bins["ssh"]),
                user=self.p["ssh_user"],
                key=self.p["ssh_key"],
                known_hosts=self.p["ssh_known_hosts"],
                fallback="sync_topology=star (model_sync_topology)",
            )
        except (OSError, RuntimeError) as exc:
            self.module.fail_json(msg="The chain copy of %s could not start: %s" % (self.p["path"], exc), **self.result)
        for report in sent["reports"]:
            records[report["host"]].update(seconds=report["seconds"], bytes=report["bytes"], error=report["error"])
        self.result["sent_bytes"] = sent["reports"][0]["bytes"] if sent["reports"] else 0
        failed = [r for r in sent["reports"] if not r["ok"]]
        if failed or sent["source_error"]:
            reasons = ([sent["source_error"]] if sent["source_error"] else []) + [
                "%s: %s" % (r["host"], r["error"]) for r in failed
            ]
            self.module.fail_json(
                msg="The chain copy of %s (%s) did not complete: %s. The run after this one sends only the files "
                "a node does not hold whole; check SSH between these nodes as %s on the fabric (the next node's "
                "host key known to this node), and space under %s; or set sync_topology=star (model_sync_topology)."
                % (
                    self.p["path"],
                    " -> ".join(["this node"] + [h["host"] for h in hops]),
                    "; ".join(reasons),
                    self.p["ssh_user"],
                    self.p["path"],
                ),
                **self.result,
            )

    def ssh_argv(self, ssh):
        """This node's ssh to the targets: the key alone; new host keys accepted and recorded."""
        return _ssh.client_argv(ssh, self.p["ssh_key"], self.p["ssh_known_hosts"], accept_new=True)

    def sync(self, target):
        dest = target.get("path") or self.p["path"]
        record = dict(host=target["host"], address=target["address"], changed=False, seconds=0.0, files=0)
        self.result["synced"].append(record)
        rsync = self.module.get_bin_path("rsync", required=True)
        ssh = self.ssh_argv("ssh")
        # --delete: an older revision's shards would leave the manifests unequal for good.
        argv = [rsync, "-a", "--partial", "--mkpath", "--delete", "--itemize-changes", "-e", " ".join(ssh)]
        argv += ["--exclude=/%s" % name for name in sorted(_model.SKIP_DIRS)]
        if self.module.check_mode:
            argv.append("--dry-run")
        remote = "%s:%s/" % (_ssh.destination(self.p["ssh_user"], target["address"]), dest.rstrip("/"))
        argv += [self.p["path"].rstrip("/") + "/", remote]
        started = time.monotonic()
        rc, out, err = self.module.run_command(argv, environ_update=dict(LC_ALL="C"))
        record["seconds"] = round(time.monotonic() - started, 1)
        if rc != 0:
            self.module.fail_json(
                msg="rsync of %s to %s (%s) failed (rc %d): %s. The sync runs from this node to the target over "
                "SSH on the fabric; check that the target accepts ssh_key and has rsync."
                % (self.p["path"], target["host"], target["address"], rc, (err or out).strip()),
                **self.result,
            )
        changes = _model.itemized_changes(out)
        record.update(changed=bool(changes), files=len([c for c in changes if c[1] == "f"]))
        if changes:
            self.result["changed"] = True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            repo_id=dict(type="str"),
            revision=dict(type="str"),
            token=dict(type="str", no_log=True),
            download=dict(type="bool", default=False),
            fingerprint=dict(type="str", choices=["size", "sample", "sha256"], default="sample"),
            fail_on_incomplete=dict(type="bool", default=True),
            sync_to=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    host=dict(type="str", required=True),
                    address=dict(type="str", required=True),
                    path=dict(type="path"),
                    manifest=dict(type="list", elements="dict"),
                ),
            ),
            sync_topology=dict(type="str", choices=["chain", "star"], default="chain"),
            ssh_user=dict(type="str", default="root"),
            ssh_key=dict(type="path", no_log=False),
            ssh_known_hosts=dict(type="path"),
            drop_caches=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    ModelFiles(module).run()


if __name__ == "__main__":
    main()
