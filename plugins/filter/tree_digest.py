# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A directory on the controller as one digest (its documentation is in tree_digest.yml beside this file)."""

from __future__ import annotations

from ansible_collections.dgx_spark.vllm.plugins.plugin_utils._digest import tree_digest


class FilterModule:
    def filters(self):
        return {"tree_digest": tree_digest}
