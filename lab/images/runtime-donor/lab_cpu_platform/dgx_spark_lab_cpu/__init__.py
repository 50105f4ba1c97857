"""LAB-ONLY vLLM platform plugin: the CPU platform, placed by Ray as if each worker held a GPU.

vLLM's CPU platform has no Ray device key, so its Ray executor refuses to start ("current platform cpu
does not support ray"). In the lab each node declares one fake GPU to Ray (`ray start --num-gpus 1`, as
a Spark has one GB10), so this platform asks Ray for GPU bundles and the tensor-parallel workers land one
per node, while the work itself runs on the CPU.
"""


def register():
    return "dgx_spark_lab_cpu.platform.LabCpuPlatform"
