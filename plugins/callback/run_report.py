# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-host summary of a playbook run, written as JSON for the re-convergence report."""

from __future__ import annotations

DOCUMENTATION = r"""
name: run_report
type: aggregate
short_description: Write a per-host JSON summary of a playbook run
description:
  - Counts ok, changed, failed, skipped and unreachable results per host, and keeps the names of
    the tasks that changed (or would change, in check mode) and each failure's message.
  - Keeps the serving probe and the watchdog's decision of a task that returned them (M(dgx_spark.vllm.vllm_serve),
    or the deploy's stage probe M(dgx_spark.vllm.stage_state) under C(endpoint)), the last one of the run,
    so the report says how the endpoint answered (latency, tokens, engine version) or why it failed.
  - Used by the reconverge role's runner; it leaves the normal output alone.
requirements:
  - enable with C(callbacks_enabled = dgx_spark.vllm.run_report)
options:
  path:
    description: File the JSON summary is written to at the end of the run.
    type: path
    required: true
    env:
      - name: DGX_SPARK_RUN_REPORT
    ini:
      - section: dgx_spark_run_report
        key: path
"""

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dgx_spark.vllm.run_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._hosts = {}
        self._check_mode = False

    def _host(self, result):
        name = result._host.get_name()
        return self._hosts.setdefault(
            name,
            {"ok": 0, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 0, "changed_tasks": [], "failures": []},
        )

    def v2_playbook_on_play_start(self, play):
        self._check_mode = bool(play.check_mode) or self._check_mode

    def _keep_serving(self, host, result):
        found = result._result
        # The deploy's stage probe returns the serving probe under endpoint (vllm_serve's endpoint is its URL).
        if isinstance(found.get("endpoint"), dict) and isinstance(found["endpoint"].get("probe"), dict):
            host["probe"] = found["endpoint"]["probe"]
        for key in ("probe", "watchdog"):
            if isinstance(found.get(key), dict):
                host[key] = found[key]

    def v2_runner_on_ok(self, result):
        host = self._host(result)
        host["ok"] += 1
        self._keep_serving(host, result)
        if result._result.get("changed", False):
            host["changed"] += 1
            name = result._task.get_name()
            if name not in host["changed_tasks"]:
                host["changed_tasks"].append(name)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if ignore_errors:
            return
        host = self._host(result)
        host["failed"] += 1
        self._keep_serving(host, result)
        host["failures"].append({"task": result._task.get_name(), "msg": str(result._result.get("msg", ""))[:2000]})

    def v2_runner_on_skipped(self, result):
        self._host(result)["skipped"] += 1

    def v2_runner_on_unreachable(self, result):
        host = self._host(result)
        host["unreachable"] += 1
        host["failures"].append({"task": result._task.get_name(), "msg": str(result._result.get("msg", ""))[:2000]})

    def v2_playbook_on_stats(self, stats):
        path = self.get_option("path")
        report = {"check_mode": self._check_mode, "hosts": self._hosts}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
