# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared documentation of the record option of the modules that end a node's stage group
(module_utils/_stage_state.py RECORD_OPTIONS)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  record:
    description:
      - The deploy's record of the stage group this module run ends on the node, written as
        M(dgx_spark.vllm.stage_state) with O(dgx_spark.vllm.stage_state#module:operation=record) writes it, once
        the module's own work succeeded (not in check mode). The deploy hands it over where nothing of the group
        is left to run after this module on the node, so the record costs no task of its own.
      - Omitted, nothing is recorded.
    type: dict
    suboptions:
      path:
        description: The record file on the node.
        type: path
        default: /var/lib/dgx-spark/stages.json
      stages:
        description: The stages of the group that ran, as O(dgx_spark.vllm.stage_state#module:stages).
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: The stage name.
            type: str
            required: true
          inputs:
            description: A digest of the stage's settings, made on the controller.
            type: str
            required: true
          facts:
            description: Facts the stage set that later stages read.
            type: dict
            default: {}
          fact_names:
            description: The names of the facts the stage's record keeps.
            type: list
            elements: str
            default: []
          checks:
            description: The live state the stage leaves, as O(dgx_spark.vllm.stage_state#module:stages[].checks).
            type: dict
            default: {}
      forget:
        description:
          - Stages whose records are dropped before the module does anything else (not in check mode). The deploy's
            head drops those of its cluster group with its Ray start, so a run that fails before the serve verified
            the endpoint, the Ray start's own failure included, leaves the head without them and the next run starts
            the group again on every node (a worker's record, made as its own Ray container started, does not show
            that it joined).
        type: list
        elements: str
        default: []
      plan:
        description: The run's plan, as O(dgx_spark.vllm.stage_state#module:plan).
        type: dict
        suboptions:
          key:
            description: A digest of everything the run's stages are made from.
            type: str
            required: true
          stages:
            description: Every stage of the run in order.
            type: list
            elements: dict
            default: []
          endpoint:
            description: The endpoint the plan's probe asks.
            type: dict
          api_key:
            description: Not used here (the probe's).
            type: str
"""
