"""LAB-ONLY: see the package docstring."""

from vllm.platforms.cpu import CpuPlatform


class LabCpuPlatform(CpuPlatform):
    # Ray's accelerator key for the fake GPUs each lab node declares.
    ray_device_key = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "dgx_spark_lab_cpu.communicator.LabCpuCommunicator"
