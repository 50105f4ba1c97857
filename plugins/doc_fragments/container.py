# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared documentation of the engine container contract's options (module_utils/_container.py)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  gpus:
    description:
      - Physical GPUs on this node. Above 0, the container gets C(--gpus all) (a device request).
    type: int
    default: 0
  shm_size:
    description: Shared memory size of the container (used when host IPC is not in effect).
    type: str
    default: 16g
  rdma_devices:
    description: RDMA device paths to pass through (e.g. C(/dev/infiniband)); adds C(IPC_LOCK) and an unlimited memlock.
    type: list
    elements: str
    default: []
  restart_policy:
    description: Docker restart policy.
    type: str
    choices: ["no", always, unless-stopped, on-failure]
    default: unless-stopped
  env_file:
    description:
      - An environment file on this node (C(KEY=VALUE) lines, as C(docker run --env-file) reads them), such
        as the fabric stage's C(/etc/dgx-spark/nccl.env). Its entries go into the container's environment;
        the module's own environment entries win over it. Its content enters the configuration hash, so a
        changed file recreates the container.
      - A missing file fails, naming it; in check mode it is a warning and reads as empty.
    type: path
  mounts:
    description:
      - Bind mounts (model directory, caches).
      - The missing source of a writable mount is made (mode 0755) before the container is created, as
        C(docker run -v) does, where the engine is this node's own (a C(unix://) O(docker_host)); a container
        whose writable source is gone is recreated. A read-only source must exist.
    type: list
    elements: dict
    default: []
    suboptions:
      source:
        description: Path on the node.
        type: str
        required: true
      target:
        description: Path in the container.
        type: str
        required: true
      read_only:
        description: Mount read-only.
        type: bool
        default: false
"""
