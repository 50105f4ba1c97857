# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared documentation of the Docker connection options."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  docker_host:
    description:
      - Docker engine API address on the managed node.
    type: str
    default: unix:///var/run/docker.sock
  docker_timeout:
    description:
      - Seconds to wait for one Docker API call.
    type: int
    default: 120
requirements:
  - docker (the Docker SDK for Python) on the managed node
"""
