#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_info
short_description: Facts about a node's NVIDIA GPUs, read with nvidia-smi
description:
  - Reads every GPU's name, index, UUID, PCI bus id, driver and CUDA versions, clocks,
    persistence mode and whether its memory is unified with the CPU's (GB10 in a DGX Spark).
  - On unified memory nvidia-smi reports no memory figures; they are returned as null, never
    as a health signal.
  - A node without nvidia-smi, without a loaded driver or without GPUs is an answer
    (RV(gpu_count=0) and RV(reason)), not a failure.
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.attributes.FACTS
options:
  nvidia_smi:
    description:
      - Path of the nvidia-smi executable. By default it is looked up on E(PATH).
    type: path
notes:
  - Runs nvidia-smi with C(LC_ALL=C); only its CSV query interface and C(--version) are parsed.
"""

EXAMPLES = r"""
- name: Read the GPUs of every node
  dgx_spark.vllm.gpu_info:
  register: gpu

- name: Every node has exactly one GPU
  ansible.builtin.assert:
    that: gpu.gpu_count == 1
    fail_msg: "{{ inventory_hostname }}: {{ gpu.reason | default('gpu_count is ' ~ gpu.gpu_count) }}"
"""

RETURN = r"""
gpu_count:
  description: Number of GPUs nvidia-smi lists; 0 when there is none or nvidia-smi cannot answer.
  returned: always
  type: int
  sample: 1
reason:
  description: Why RV(gpu_count) is 0.
  returned: when gpu_count is 0
  type: str
  sample: nvidia-smi is not installed on this node (no NVIDIA driver)
nvidia_smi:
  description: The nvidia-smi that answered; null when there is none.
  returned: always
  type: str
  sample: /usr/bin/nvidia-smi
driver_version:
  description: NVIDIA driver version.
  returned: always
  type: str
  sample: 580.159.04
cuda_version:
  description: Highest CUDA version the driver supports, from C(nvidia-smi --version).
  returned: always
  type: str
  sample: "13.0"
unified_memory:
  description: True when any GPU shares memory with the CPU (GB10); its memory figures are then null.
  returned: always
  type: bool
  sample: true
gpus:
  description: One entry per GPU; any value nvidia-smi cannot report is null.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index as nvidia-smi numbers it.
      type: int
    uuid:
      description: GPU UUID.
      type: str
    name:
      description: Product name.
      type: str
      sample: NVIDIA GB10
    pci_bus_id:
      description: PCI bus id.
      type: str
    driver_version:
      description: Driver version reported for this GPU.
      type: str
    persistence_mode:
      description: Whether persistence mode is on.
      type: bool
    pstate:
      description: Performance state.
      type: str
    clocks_gr:
      description: Current graphics clock, MHz.
      type: int
    clocks_sm:
      description: Current SM clock, MHz.
      type: int
    clocks_mem:
      description: Current memory clock, MHz.
      type: int
    clocks_max_gr:
      description: Highest graphics clock, MHz.
      type: int
    clocks_max_mem:
      description: Highest memory clock, MHz.
      type: int
    memory_total:
      description: Framebuffer size in MiB; null on unified memory.
      type: int
    memory_used:
      description: Framebuffer in use in MiB; null on unified memory.
      type: int
    compute_cap:
      description: CUDA compute capability.
      type: str
      sample: "12.1"
    addressing_mode:
      description: C(ATS), C(HMM) or C(None); null when the driver does not report it.
      type: str
    unified_memory:
      description: Whether this GPU's memory is shared with the CPU.
      type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nvidia_smi import (
    NvidiaSmi,
    NvidiaSmiError,
)

# nvidia-smi's own words when the kernel driver is missing or mismatched.
_DRIVER_DOWN = ("couldn't communicate with the NVIDIA driver", "Driver/library version mismatch")


class GpuInfo:
    def __init__(self, module):
        self.module = module
        self.smi = NvidiaSmi(module, module.params["nvidia_smi"])

    def answer(self, **extra):
        result = dict(
            changed=False,
            gpu_count=0,
            gpus=[],
            nvidia_smi=self.smi.path or None,
            driver_version=None,
            cuda_version=None,
            unified_memory=False,
        )
        result.update(extra)
        return result

    def run(self):
        if not self.smi.present:
            return self.answer(reason="nvidia-smi is not installed on this node (no NVIDIA driver)")
        try:
            gpus = self.smi.query_gpus()
        except NvidiaSmiError as exc:
            if any(words in str(exc) for words in _DRIVER_DOWN):
                return self.answer(reason="the NVIDIA driver is not loaded: %s" % exc)
            self.module.fail_json(msg=str(exc))
        if not gpus:
            return self.answer(reason="nvidia-smi lists no GPU on this node")
        versions = self.smi.versions()
        return self.answer(
            gpu_count=len(gpus),
            gpus=gpus,
            driver_version=versions.get("driver_version") or gpus[0]["driver_version"],
            cuda_version=versions.get("cuda_version"),
            unified_memory=any(gpu["unified_memory"] for gpu in gpus),
        )


def main():
    module = AnsibleModule(argument_spec=dict(nvidia_smi=dict(type="path")), supports_check_mode=True)
    module.exit_json(**GpuInfo(module).run())


if __name__ == "__main__":
    main()
