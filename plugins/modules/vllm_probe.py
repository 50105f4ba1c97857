#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving probe of a vLLM endpoint, as a read-only module (status.yml)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_probe
short_description: Probe a vLLM endpoint as a user would
description:
  - Asks a served endpoint C(/health), C(/v1/models) (O(served_model_name) listed), C(/version) and one
    completion of O(max_tokens) tokens, all within O(timeout) seconds, and returns what it found. An engine
    whose C(/health) answers 200 while its completions hang fails the probe.
  - The same probe M(dgx_spark.vllm.vllm_serve) runs on every deploy, drift and enforce run.
  - A failed probe is a result, not a module failure (O(fail_on_failure) makes it one).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes.FACTS
options:
  url:
    description: Base URL of the server, without C(/v1) (C(http://HOST:PORT)).
    type: str
    required: true
  served_model_name:
    description: The name clients send as C(model).
    type: str
    required: true
  api_key:
    description: The API key, when the server requires one (sent as a bearer token only).
    type: str
  prompt:
    description: Prompt of the completion.
    type: str
    default: "The capital of France is"
  max_tokens:
    description: Tokens of the completion.
    type: int
    default: 8
  timeout:
    description: Seconds the whole probe may take.
    type: int
    default: 60
  fail_on_failure:
    description: Fail the task when the probe fails.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Probe the endpoint
  dgx_spark.vllm.vllm_probe:
    url: http://198.18.100.11:8000
    served_model_name: qwen3.5-122b-a10b-fp8
    api_key: "{{ vault_vllm_api_key }}"
  register: probe
"""

RETURN = r"""
probe:
  description:
    - ok, step (the step that failed, or null), why, health (C(/health)'s status), models, owned_by,
      engine_version, text, latency_s and tokens of the completion, seconds (the whole probe).
  returned: always
  type: dict
  sample: {ok: true, step: null, health: 200, engine_version: 0.32.0, latency_s: 0.91, tokens: 8, seconds: 0.95}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _probe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            **dict(_probe.PROBE_ARGS, max_tokens=dict(type="int", default=8, no_log=False)),
            fail_on_failure=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout"] < 1 or p["max_tokens"] < 1:
        module.fail_json(msg="timeout and max_tokens must be 1 or more (got %s, %s)" % (p["timeout"], p["max_tokens"]))
    base = p["url"].rstrip("/")
    found = _probe.probe_url(open_url, base, p)
    if p["fail_on_failure"] and not found["ok"]:
        module.fail_json(msg="The probe of %s failed at %s: %s" % (base, found["step"], found["why"]), probe=found)
    module.exit_json(changed=False, probe=found)


if __name__ == "__main__":
    main()
