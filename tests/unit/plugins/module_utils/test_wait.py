"""The shared waiter: deadline, interval cap, progress records, timeout carries the last state."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _wait


class FakeClock:
    """A clock that only moves when the waiter sleeps (or a check spends time)."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def states(seq):
    it = iter(seq)

    def check():
        return next(it)

    return check


def test_done_on_first_poll_does_not_sleep():
    clock = FakeClock()
    res = _wait.wait_for(states([(True, "ready")]), 10, clock=clock, sleep=clock.sleep)
    assert res.ok and not res.timed_out
    assert res.polls == 1
    assert clock.sleeps == []
    assert res.progress == [{"t": 0.0, "state": "ready"}]


def test_interval_is_capped_at_one_second():
    clock = FakeClock()
    res = _wait.wait_for(
        states([(False, "a"), (False, "a"), (True, "b")]), 30, interval=5, clock=clock, sleep=clock.sleep
    )
    assert res.ok
    assert clock.sleeps == [1.0, 1.0]


def test_timeout_carries_last_state_and_stops_at_deadline():
    clock = FakeClock()

    def check():
        return False, {"alive": 1, "seen": round(clock.now - 100.0, 1)}

    res = _wait.wait_for(check, 2.5, interval=1, clock=clock, sleep=clock.sleep)
    assert not res.ok and res.timed_out
    # Last sleep is trimmed to the remaining time: never past the deadline.
    assert clock.sleeps == [1.0, 1.0, 0.5]
    assert res.elapsed == pytest.approx(2.5)
    assert res.last == {"alive": 1, "seen": 2.5}


def test_progress_records_only_changes():
    clock = FakeClock()
    seq = [(False, "1/2")] * 5 + [(False, "2/2 nodes, 1 GPU")] * 3 + [(True, "2/2 nodes, 2 GPUs")]
    res = _wait.wait_for(states(seq), 60, clock=clock, sleep=clock.sleep)
    assert [p["state"] for p in res.progress] == ["1/2", "2/2 nodes, 1 GPU", "2/2 nodes, 2 GPUs"]
    assert [p["t"] for p in res.progress] == [0.0, 5.0, 8.0]
    assert res.polls == 9


def test_progress_is_bounded():
    clock = FakeClock()
    res = _wait.wait_for(lambda: (False, clock.now), 500, clock=clock, sleep=clock.sleep)
    assert len(res.progress) <= _wait.MAX_PROGRESS
    # The first and the newest records survive trimming.
    assert res.progress[0]["t"] == 0.0
    assert res.progress[-1]["state"] == res.last


def test_stop_waiting_ends_early_with_reason():
    clock = FakeClock()
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise _wait.StopWaiting("process exited", state={"exit": 1})
        return False, "starting"

    res = _wait.wait_for(check, 100, clock=clock, sleep=clock.sleep)
    assert not res.ok
    assert not res.timed_out
    assert res.stopped == "process exited"
    assert res.last == {"exit": 1}
    assert res.as_dict()["stopped"] == "process exited"


def test_zero_timeout_polls_once():
    clock = FakeClock()
    res = _wait.wait_for(states([(False, "x")]), 0, clock=clock, sleep=clock.sleep)
    assert res.polls == 1 and res.timed_out and clock.sleeps == []


def test_negative_timeout_rejected():
    with pytest.raises(ValueError):
        _wait.wait_for(lambda: (True, None), -1)
