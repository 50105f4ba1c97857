#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: nccl_env
short_description: Build the NCCL, Gloo, UCX, Ray and vLLM environment from the fabric facts
description:
  - From this host's fabric interfaces (as returned by M(dgx_spark.vllm.roce_interface)) builds the environment every
    serving container gets, returns it as a dict and, when O(path) is given, writes it as a C(KEY=VALUE) env file.
  - C(NCCL_SOCKET_IFNAME), C(GLOO_SOCKET_IFNAME), C(TP_SOCKET_IFNAME), C(UCX_NET_DEVICES) and
    C(OMPI_MCA_btl_tcp_if_include) name the first interface; C(NCCL_IB_HCA) names every interface's RDMA device
    (both CX-7 twins are needed for 200G) and C(NCCL_IB_GID_INDEX) their common RoCE v2 GID index;
    C(VLLM_HOST_IP) is this host's fabric address, C(MASTER_ADDR) the head's; C(NCCL_IGNORE_CPU_AFFINITY=1) and
    C(RAY_memory_monitor_refresh_ms=0) always.
  - No RDMA device is an error unless O(allow_socket_fallback) is true; then C(NCCL_IB_DISABLE=1).
  - The upstream source of every variable name is listed in C(plugins/module_utils/_nccl_env.py).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes.STATEFUL
options:
  interfaces:
    description: This host's fabric interfaces, first one first (its address becomes C(VLLM_HOST_IP)).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Interface name.
        type: str
        required: true
      address:
        description: Its IPv4 address, with or without prefix.
        type: str
        required: true
      rdma_device:
        description: Its RDMA device; null or omitted when it has none.
        type: str
      gid_index:
        description: The RoCE v2 GID index of its address; needed when O(interfaces[].rdma_device) is set.
        type: int
  master_addr:
    description: The head node's fabric address (C(MASTER_ADDR)), with or without prefix.
    type: str
    required: true
  host_ip:
    description: C(VLLM_HOST_IP); the first interface's address when omitted.
    type: str
  allow_socket_fallback:
    description: Allow NCCL over TCP sockets when no interface has an RDMA device (the lab). Never on a Spark.
    type: bool
    default: false
  extra_env:
    description:
      - More variables, added as they are. Names must be valid and must not override the computed ones.
        The env file is mode O(mode) (C(0600) by default) because these may hold secrets.
    type: dict
    default: {}
  path:
    description: Env file to write; nothing is written when omitted.
    type: path
  mode:
    description: Permissions of the env file, as a quoted octal string.
    type: str
    default: "0600"
"""

EXAMPLES = r"""
- name: Build and write the NCCL environment
  dgx_spark.vllm.nccl_env:
    interfaces:
      - {name: enp1s0f1np1, address: 192.168.100.11/24, rdma_device: rocep1s0f1, gid_index: 3}
      - {name: enP2p1s0f1np1, address: 192.168.101.11/24, rdma_device: roceP2p1s0f1, gid_index: 3}
    master_addr: 192.168.100.11
    path: /etc/dgx-spark/nccl.env
  register: nccl
"""

RETURN = r"""
env:
  description: The environment, name to value (all strings).
  returned: always
  type: dict
  sample:
    NCCL_IB_HCA: rocep1s0f1,roceP2p1s0f1
    NCCL_IB_GID_INDEX: "3"
    NCCL_SOCKET_IFNAME: enp1s0f1np1
path:
  description: The env file written, or null.
  returned: always
  type: str
  sample: /etc/dgx-spark/nccl.env
diff:
  description: Env file content and mode before and after.
  returned: when O(path) is given
  type: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_env import build_env, render
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import file_mode, read_text, write_text


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interfaces=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    name=dict(type="str", required=True),
                    address=dict(type="str", required=True),
                    rdma_device=dict(type="str"),
                    gid_index=dict(type="int"),
                ),
            ),
            master_addr=dict(type="str", required=True),
            host_ip=dict(type="str"),
            allow_socket_fallback=dict(type="bool", default=False),
            extra_env=dict(type="dict", default={}, no_log=False),
            path=dict(type="path"),
            mode=dict(type="str", default="0600"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not re.match(r"^0?[0-7]{3}$", p["mode"]):
        module.fail_json(msg="mode: %r is not an octal mode such as '0600'." % p["mode"])
    mode = p["mode"].zfill(4)
    env, error = build_env(p["interfaces"], p["master_addr"], p["host_ip"], p["allow_socket_fallback"], p["extra_env"])
    if error:
        module.fail_json(msg=error + ".")
    if not p["path"]:
        module.exit_json(changed=False, env=env, path=None)

    before = dict(content=read_text(p["path"]), mode=file_mode(p["path"]))
    after = dict(content=render(env), mode=mode)
    changed = before != after
    if changed and not module.check_mode:
        write_text(module, p["path"], after["content"], mode)
        written = dict(content=read_text(p["path"]), mode=file_mode(p["path"]))
        if written != after:
            module.fail_json(msg="%s does not hold what was written (mode %s)." % (p["path"], written["mode"]))
    module.exit_json(changed=changed, env=env, path=p["path"], diff=dict(before=before, after=after))


if __name__ == "__main__":
    main()
