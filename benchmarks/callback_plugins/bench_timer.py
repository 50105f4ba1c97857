# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark timer (benchmarks only, not shipped as a collection plugin).

Writes one JSON document to $BENCH_TIMER_OUT when the playbook ends: per task and host the
controller's wall-clock start and end, the status, and whether the task ran on the node (a
module executed over SSH) or only on the controller; plus the recap's changed counts.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: bench_timer
type: aggregate
short_description: Per task and host wall-clock times for benchmarks/run.py
description:
  - Writes per task and host start and end times, status and changed counts to C(BENCH_TIMER_OUT).
requirements:
  - enable in ANSIBLE_CALLBACKS_ENABLED
"""

# Actions that run on the controller only: no SSH round trip to the node.
CONTROLLER_ONLY = {
    "ansible.builtin.set_fact",
    "ansible.builtin.assert",
    "ansible.builtin.debug",
    "ansible.builtin.fail",
    "ansible.builtin.meta",
    "ansible.builtin.include_tasks",
    "ansible.builtin.import_tasks",
    "ansible.builtin.include_role",
    "ansible.builtin.add_host",
    "ansible.builtin.group_by",
    "ansible.builtin.validate_argument_spec",
    "validate_argument_spec",
    "set_fact",
    "assert",
    "debug",
    "fail",
    "meta",
}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = time.time()
        self.tasks = []
        self.open = {}

    def v2_runner_on_start(self, host, task):
        self.open[(task._uuid, host.get_name())] = time.time()

    def _done(self, result, status):
        now = time.time()
        task = result._task
        host = result._host.get_name()
        res = result._result
        delegated = (res.get("_ansible_delegated_vars") or {}).get("ansible_host")
        remote = task.action not in CONTROLLER_ONLY and delegated not in ("localhost", "127.0.0.1")
        items = 1
        if isinstance(res.get("results"), list):
            items = len([r for r in res["results"] if not r.get("skipped")])
        self.tasks.append(
            dict(
                task=task.get_name(),
                action=task.action,
                host=host,
                status=status,
                changed=bool(res.get("changed")),
                remote=remote and status != "skipped",
                executions=items if status != "skipped" else 0,
                start=self.open.pop((task._uuid, host), now),
                end=now,
                result={
                    k: res[k]
                    for k in (
                        "elapsed",
                        "bytes_moved",
                        "peers",
                        "timings",
                        "actions",
                        "progress",
                        "command",
                        "flag_check",
                        "engine",
                        "synced",
                        "sent_bytes",
                        "seconds",
                        "msg",
                    )
                    if k in res
                },
            )
        )

    def v2_runner_on_ok(self, result):
        self._done(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._done(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._done(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._done(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("BENCH_TIMER_OUT")
        if not path:
            return
        hosts = sorted(stats.processed.keys())
        summary = {h: stats.summarize(h) for h in hosts}
        doc = dict(started=self.started, ended=time.time(), recap=summary, tasks=self.tasks)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, default=str)
