# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: stage_inputs
short_description: A digest of a deploy stage's settings and of its role's tasks
description:
  - Returns the SHA-256 of every variable whose name starts with the stage's prefix (C(fabric_) for C(fabric))
    or with C(cluster_) (the settings every stage shares, role C(dgx_spark.vllm.cluster)), templated, of the
    text of the role's C(tasks/*.yml), C(vars/*.yml), C(templates/) and C(files/), of this collection's version
    and of O(extra); the deploy's stage record (M(dgx_spark.vllm.stage_state)) compares it with the digest of
    the last successful run.
  - Variables ending in C(_token) are left out, so a new token does not make a stage run.
  - Run it inside the role (C(role_path) and the role's defaults must be in scope).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
options:
  _terms:
    description: The stage name (the variable prefix without the trailing underscore).
    required: true
    type: list
    elements: str
  extra:
    description: Anything else the stage's result depends on (another host's addresses, a build context digest).
    type: raw
"""

EXAMPLES = r"""
- name: Describe the fabric stage
  ansible.builtin.set_fact:
    fabric_inputs: "{{ lookup('dgx_spark.vllm.stage_inputs', 'fabric', extra=groups['spark']) }}"
"""

RETURN = r"""
_raw:
  description: The hex SHA-256 digest.
  type: list
  elements: str
"""

import hashlib
import json

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.dgx_spark.vllm.plugins.plugin_utils._digest import collection_version, file_digests

# The shared settings (roles/cluster) every stage may read: a change there reruns the stages.
SHARED_PREFIX = "cluster_"
# The role's tasks, its fixed vars (the engine's cache variables, the serve arguments) and what it writes
# from (templates, files: a changed rule or config template must run the stage).
ROLE_FILES = ("tasks/*.yml", "vars/*.yml", "templates/**/*", "files/**/*")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1 or not terms[0]:
            raise AnsibleError(
                "stage_inputs: give exactly one stage name, e.g. lookup('dgx_spark.vllm.stage_inputs', 'fabric')."
            )
        stage = terms[0]
        role_path = (variables or {}).get("role_path")
        if not role_path:
            raise AnsibleError("stage_inputs: %s: run it inside the stage's role (role_path is not set)." % stage)
        prefix = stage + "_"
        prefixes = (prefix, SHARED_PREFIX)
        names = sorted(name for name in variables if name.startswith(prefixes) and not name.endswith("_token"))
        settings = {name: self._templar.template(variables[name]) for name in names}
        sources = file_digests(self._templar.template(role_path), ROLE_FILES)
        blob = json.dumps(
            dict(settings=settings, tasks=sources, collection=collection_version(), extra=self.get_option("extra")),
            sort_keys=True,
            default=str,
        )
        return [hashlib.sha256(blob.encode("utf-8")).hexdigest()]
