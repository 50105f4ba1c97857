# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: plan_key
short_description: One digest of everything a deploy's stages are made from, for every node at once
description:
  - Returns the SHA-256 of, for each host of O(hosts), every variable whose name starts with one of the stages'
    prefixes (C(fabric_) for C(fabric)), C(cluster_) or C(deploy_), templated with that host's variables (one that
    does not template, such as one naming a role default not loaded yet, counts by its error), and the host's name,
    address, user, port and groups; of every file of the stages' roles and of C(roles/cluster) (defaults,
    argument specs, tasks, templates), of C(playbooks/) and of C(plugins/); of this collection's version; and of
    O(extra).
  - It covers what every stage's own M(dgx_spark.vllm.stage_state) inputs digest covers (the lookup
    C(dgx_spark.vllm.stage_inputs)), and more, without the roles loaded. The deploy's first play compares it with
    the key of the last successful run recorded on each node; when they match, the node's record holds every
    stage's checks and one probe per node tells whether anything must run, without the roles' checks.
  - Variables ending in C(_token) are left out, as C(dgx_spark.vllm.stage_inputs) leaves them out.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
options:
  _terms:
    description: The stage names, in run order.
    required: true
    type: list
    elements: str
  hosts:
    description: The hosts whose settings count (the play's).
    type: list
    elements: str
    required: true
  extra:
    description: >-
      Anything else the stages' result depends on that lies outside variables and this collection (a build
      context's digest).
    type: raw
"""

EXAMPLES = r"""
- name: Name this run's settings
  ansible.builtin.set_fact:
    deploy_plan_key: "{{ lookup('dgx_spark.vllm.plan_key', 'fabric', 'model', hosts=ansible_play_hosts) }}"
  run_once: true
"""

RETURN = r"""
_raw:
  description: The hex SHA-256 digest.
  type: list
  elements: str
"""

import hashlib
import json
import os

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.dgx_spark.vllm.plugins.plugin_utils._digest import (
    COLLECTION_ROOT,
    collection_version,
    file_digests,
)

# Besides the stages' own prefixes: the shared settings (roles/cluster) and the deploy's own (records path).
SHARED_PREFIXES = ("cluster_", "deploy_")
# Where a host is and what it belongs to: other stages' inputs name these (peers' addresses, the head).
HOST_KEYS = ("inventory_hostname", "ansible_host", "ansible_user", "ansible_port", "group_names")


def host_settings(hostvars, prefixes):
    """{name: templated value, or the error that templating it raised} of one host's settings."""
    names = sorted(
        name for name in hostvars if (name.startswith(prefixes) and not name.endswith("_token")) or name in HOST_KEYS
    )
    out = {}
    for name in names:
        try:
            out[name] = hostvars[name]
        except AnsibleError as exc:
            out[name] = "not templated: %s" % exc.message
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        stages = [term for term in terms if term]
        if not stages:
            raise AnsibleError(
                "plan_key: give the stage names, e.g. lookup('dgx_spark.vllm.plan_key', 'fabric', hosts=[...])."
            )
        prefixes = tuple(stage + "_" for stage in stages) + SHARED_PREFIXES
        hostvars = (variables or {})["hostvars"]
        hosts = sorted(self.get_option("hosts"))
        code = {
            name: file_digests(os.path.join(COLLECTION_ROOT, name))
            for name in ["roles/" + stage for stage in stages] + ["roles/cluster", "playbooks", "plugins"]
        }
        blob = json.dumps(
            dict(
                settings={host: host_settings(hostvars[host], prefixes) for host in hosts},
                code=code,
                collection=collection_version(),
                extra=self.get_option("extra"),
            ),
            sort_keys=True,
            default=str,
        )
        return [hashlib.sha256(blob.encode("utf-8")).hexdigest()]
