# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy summary's NCCL line; the documentation is in nccl_library_line.yml beside this file."""

from __future__ import annotations

from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_library import summary_line


def nccl_library_line(pairs, recorded=False):
    return summary_line([tuple(pair) for pair in pairs], recorded=bool(recorded))


class FilterModule:
    def filters(self):
        return {"nccl_library_line": nccl_library_line}
