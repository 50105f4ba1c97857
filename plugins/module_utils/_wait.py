# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one waiter every module that waits uses (private).

A condition is polled until it holds or a deadline passes. The interval is capped at one
second so a module never sleeps past the moment the condition became true by more than that.
Progress is recorded when the observed state changes (not on every poll), so a long wait
returns a short, readable history; a timeout carries the last observed state.
"""

from __future__ import annotations

import time

MAX_INTERVAL = 1.0
MAX_PROGRESS = 50


class WaitResult:
    """Outcome of wait_for(): ok, elapsed seconds, polls, last state, progress records."""

    def __init__(self, ok, elapsed, polls, *, last, progress, stopped=None):
        self.ok = ok
        self.elapsed = elapsed
        self.polls = polls
        self.last = last
        self.progress = progress
        # Set when the check asked to stop early (a condition that can no longer become true).
        self.stopped = stopped

    @property
    def timed_out(self):
        return not self.ok and self.stopped is None

    def as_dict(self):
        return dict(
            ok=self.ok,
            timed_out=self.timed_out,
            elapsed=round(self.elapsed, 2),
            polls=self.polls,
            last=self.last,
            progress=self.progress,
            stopped=self.stopped,
        )


class StopWaiting(Exception):
    """Raised by a check when waiting longer cannot help (e.g. the process died)."""

    def __init__(self, reason, state=None):
        super().__init__(reason)
        self.reason = reason
        self.state = state


def wait_for(check, timeout, interval=MAX_INTERVAL, clock=time.monotonic, sleep=time.sleep):
    """Poll check() until it returns (True, state) or timeout seconds pass.

    check() returns (done, state); state should be small and JSON-serialisable. It may raise
    StopWaiting to end the wait at once. The first poll always happens, even with timeout 0.
    """
    if timeout < 0:
        raise ValueError("timeout must be >= 0")
    interval = min(max(float(interval), 0.05), MAX_INTERVAL)
    start = clock()
    deadline = start + timeout
    progress = []
    polls = 0
    last = None
    while True:
        polls += 1
        try:
            done, state = check()
        except StopWaiting as exc:
            now = clock()
            _record(progress, now - start, exc.state)
            return WaitResult(False, now - start, polls, last=exc.state, progress=progress, stopped=exc.reason)
        now = clock()
        _record(progress, now - start, state)
        last = state
        if done:
            return WaitResult(True, now - start, polls, last=last, progress=progress)
        remaining = deadline - now
        if remaining <= 0:
            return WaitResult(False, now - start, polls, last=last, progress=progress)
        sleep(min(interval, remaining))


def _record(progress, elapsed, state):
    if progress and progress[-1]["state"] == state:
        return
    if len(progress) >= MAX_PROGRESS:
        # Keep the first records and the newest: the start and the end explain most waits.
        del progress[MAX_PROGRESS // 2]
    progress.append({"t": round(elapsed, 2), "state": state})
