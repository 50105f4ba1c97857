"""LAB-ONLY: the CPU communicator, with its shared-memory path kept to ranks that share /dev/shm.

vLLM's CPU communicator all-reduces through POSIX shared memory when every rank of a group derives the
same group name. That name comes from the rendezvous port, which is the same on every node, so with one
tensor-parallel rank per lab node the second rank tries to open the first node's shared memory and fails
("open shm in SHMManager failed. errno: 2"). Ranks that do not share one /dev/shm use torch.distributed
(gloo over the fabric), as the upstream code already does when the names differ.
"""

import os
import socket

import torch.distributed
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class LabCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        mine = "%s:%d" % (socket.gethostname(), os.stat("/dev/shm").st_dev)  # noqa: S108 - identity, not a file
        seen = [""] * self.world_size
        torch.distributed.all_gather_object(seen, mine, group=self.device_group)
        same_shm = len(set(seen)) == 1
        # The upstream check is a collective too: every rank must call it, whatever same_shm says.
        return super()._all_group_ranks_share_shm_group_name() and same_shm
