# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared attributes blocks."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments,
        the second invocation indicates no change.
"""

    FACTS = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Only reads state; check mode returns the same answer.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
  idempotent:
    support: full
    description: Reads state only.
"""

    # Modules that change state: full check mode, diff and idempotence.
    STATEFUL = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Can run in check mode and return changed status prediction without modifying target.
  diff_mode:
    support: full
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    support: full
    description:
      - When run twice in a row outside check mode, with the same arguments,
        the second invocation indicates no change.
"""
