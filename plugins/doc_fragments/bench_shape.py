# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared documentation of a benchmark's dataset shape (module_utils/_vllm_bench.py SHAPE_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  shape:
    description: The named dataset shape of the sweep.
    type: dict
    required: true
    suboptions:
      name:
        description: The shape's name; reports compare only with earlier reports of the same name and model.
        type: str
        required: true
      dataset:
        description: vLLM's dataset; random prompts of O(shape.input_len) tokens.
        type: str
        choices: [random]
        default: random
      input_len:
        description: Prompt length in tokens.
        type: int
        required: true
      output_len:
        description: Tokens generated per request (end of sequence ignored).
        type: int
        required: true
      num_prompts:
        description: Requests sent at each point.
        type: int
        required: true
      load:
        description: What the sweep varies, C(concurrency) (requests in flight at most, sent at once) or
          C(request_rate) (requests per second, Poisson arrivals).
        type: str
        choices: [concurrency, request_rate]
        default: concurrency
      points:
        description: The values of O(shape.load), one benchmark each, in this order.
        type: list
        elements: float
        required: true
"""
