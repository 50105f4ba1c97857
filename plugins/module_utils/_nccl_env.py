# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The environment every serving container gets, built from the fabric facts (private).

Each name was checked against its upstream source (2026-11-29):

variable: who reads it; source
- NCCL_SOCKET_IFNAME: NCCL bootstrap and socket transport; NCCL docs "Environment Variables"
  (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)
- NCCL_IB_HCA: NCCL IB/RoCE transport, which HCAs; same page
- NCCL_IB_GID_INDEX: NCCL, the GID index for RoCE; same page, and NCCL net_ib NCCL_PARAM(IbGidIndex, "IB_GID_INDEX")
- NCCL_IB_DISABLE: NCCL, 1 turns the IB/RoCE transport off; same page
- NCCL_IGNORE_CPU_AFFINITY: NCCL, ignore the job's CPU mask when choosing GPU affinity; same page
- GLOO_SOCKET_IFNAME: PyTorch Gloo process groups; torch.distributed docs "Choosing the network interface to use"
- TP_SOCKET_IFNAME: PyTorch TensorPipe RPC agent; pytorch torch/csrc/distributed/rpc/tensorpipe_agent.cpp
  (kSocketIfnameEnvVar)
- MASTER_ADDR: torch.distributed env:// rendezvous; torch.distributed docs "Environment variable initialization"
- UCX_NET_DEVICES: UCX, the devices UCX may use; UCX FAQ, NVIDIA DOCA UCX guide
- OMPI_MCA_btl_tcp_if_include: Open MPI TCP BTL (MCA parameter btl_tcp_if_include through OMPI_MCA_);
  docs.open-mpi.org tuning-apps/networking/tcp
- VLLM_HOST_IP: vLLM, this node's IP for its internal distributed use; vllm/envs.py, docs configuration/env_vars
- RAY_memory_monitor_refresh_ms: Ray raylet, 0 disables the OOM killer; Ray docs
  ray-core/scheduling/ray-oom-prevention

RAY_memory_monitor_refresh_ms=0: page cache counts as used memory on the unified-memory GB10, so Ray's
monitor kills workers while a 119 GB model loads. NCCL_IGNORE_CPU_AFFINITY=1: Grace's CPU layout misleads
NCCL's affinity choice (community DGX Spark recipes set it).
"""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER = "# Managed by dgx_spark.vllm (nccl_env); changes here are overwritten.\n"
# Set from the fabric facts on RDMA hosts; refused in extra_env on every host, so that a host without
# RDMA (the lab, a socket fallback) refuses what a real Spark refuses. roles/fabric/vars/main.yml
# lists the same names for the deploy's first play (a unit test holds them equal).
RDMA_KEYS = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE")


def _ip(address):
    return str(address).split("/", 1)[0]


def build_env(interfaces, master_addr, host_ip=None, allow_socket_fallback=False, extra_env=None):
    """(env dict, None) or (None, error naming the parameter)."""
    if not interfaces:
        return None, "interfaces: at least one fabric interface is needed"
    primary = interfaces[0]["name"]
    rdma = [item for item in interfaces if item.get("rdma_device")]
    env = {
        "NCCL_SOCKET_IFNAME": primary,
        "GLOO_SOCKET_IFNAME": primary,
        "TP_SOCKET_IFNAME": primary,
        "UCX_NET_DEVICES": primary,
        "OMPI_MCA_btl_tcp_if_include": primary,
        "VLLM_HOST_IP": _ip(host_ip or interfaces[0]["address"]),
        "MASTER_ADDR": _ip(master_addr),
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        "RAY_memory_monitor_refresh_ms": "0",
    }
    if rdma:
        missing = [item["name"] for item in rdma if item.get("gid_index") is None]
        if missing:
            return None, (
                "interfaces: %s has an RDMA device but no RoCE v2 GID index; configure it with roce_interface "
                "first" % ", ".join(missing)
            )
        indexes = sorted({int(item["gid_index"]) for item in rdma})
        if len(indexes) > 1:
            return None, (
                "interfaces: NCCL_IB_GID_INDEX is one number for every HCA, but the twins' RoCE v2 GIDs sit at "
                "different indexes (%s); give every twin its address the same way so the indexes match"
                % ", ".join("%s=%s" % (item["rdma_device"], item["gid_index"]) for item in rdma)
            )
        env.update(
            NCCL_IB_HCA=",".join(item["rdma_device"] for item in rdma),
            NCCL_IB_GID_INDEX=str(indexes[0]),
            NCCL_IB_DISABLE="0",
        )
    elif allow_socket_fallback:
        env["NCCL_IB_DISABLE"] = "1"
    else:
        return None, (
            "interfaces: none of %s has an RDMA device, so NCCL would fall back to TCP sockets (about 10x "
            "slower). Check the CX-7 driver (ibdev2netdev, /sys/class/infiniband), or set "
            "allow_socket_fallback=true where sockets are intended (the lab)"
            % ", ".join(item["name"] for item in interfaces)
        )
    for key, value in (extra_env or {}).items():
        if not NAME.match(key):
            return None, "extra_env: %r is not a valid environment variable name" % key
        if key in env or key in RDMA_KEYS:
            return None, "extra_env: %s is set from the fabric facts; change those instead of overriding it" % key
        text = "%s" % (value,)
        if "\n" in text or "\r" in text:
            return None, "extra_env: the value of %s spans lines; an env file holds one line per variable" % key
        env[key] = text
    return env, None


def render(env):
    """KEY=VALUE lines, sorted, as docker --env-file and systemd EnvironmentFile read them."""
    return HEADER + "".join("%s=%s\n" % (key, env[key]) for key in sorted(env))
