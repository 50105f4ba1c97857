"""The serving probe and the watchdog's arithmetic, against the engine's recorded HTTP answers."""

from __future__ import annotations

import json
import os
from urllib.error import HTTPError

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _probe, _wait

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "vllm_api", "lab-0.32.0-tp2-ray.json")
with open(FIXTURE, encoding="utf-8") as handle:
    RECORDED = json.load(handle)
SERVED = RECORDED["models"]["data"][0]["id"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def wait(self, check, timeout, interval=1.0):
        def sleep(seconds):
            self.now += seconds

        return _wait.wait_for(check, timeout, interval, clock=lambda: self.now, sleep=sleep)


def endpoint(clock, **answers):
    """An engine answering as the lab's real one did; `answers` replaces a path's answer (an exception
    is raised; a number is the seconds the request takes)."""
    asked = []

    def http(method, path, body, timeout):
        asked.append((method, path, timeout))
        how = answers.get(path)
        if isinstance(how, Exception):
            raise how
        if isinstance(how, (int, float)):
            clock.now += min(how, timeout)
            if how > timeout:
                raise TimeoutError("timed out")
        if path == "/health":
            return 200, b""
        key = {"/v1/models": "models", "/version": "version", "/v1/completions": "completion"}[path]
        return 200, json.dumps(RECORDED[key]).encode()

    return http, asked


def run(clock, http, timeout=30):
    return _probe.probe(http, SERVED, "The capital of France is", 8, timeout, wait=clock.wait, clock=lambda: clock.now)


def test_a_serving_engine_passes_with_its_latency_tokens_and_version():
    clock = Clock()
    http, asked = endpoint(clock, **{"/v1/completions": 1.5})
    found = run(clock, http)
    assert found["ok"] and found["step"] is None and found["health"] == 200
    assert found["engine_version"] == RECORDED["version"]["version"] and found["owned_by"] == "vllm"
    assert found["latency_s"] == 1.5 and found["tokens"] == RECORDED["completion"]["usage"]["completion_tokens"]
    assert found["text"] == RECORDED["completion"]["choices"][0]["text"]
    assert [p for _m, p, _t in asked] == ["/health", "/v1/models", "/version", "/v1/completions"]


def test_a_hung_completion_fails_within_the_deadline():
    clock = Clock()
    http, asked = endpoint(clock, **{"/v1/completions": 600})
    found = run(clock, http, timeout=20)
    assert not found["ok"] and found["step"] == "completion" and found["health"] == 200
    assert "no completion within 20s although /health answered 200" in found["why"]
    assert found["seconds"] <= 20 and asked[-1][2] <= 20


def test_health_503_fails_at_once_without_asking_further():
    clock = Clock()
    http, asked = endpoint(clock, **{"/health": HTTPError("u", 503, "Service Unavailable", {}, None)})
    found = run(clock, http)
    assert found["step"] == "health" and found["health"] == 503 and "the engine is dead" in found["why"]
    assert len(asked) == 1 and clock.now == 0


def test_a_silent_health_is_asked_again_for_a_few_seconds_only():
    clock = Clock()
    http, asked = endpoint(clock, **{"/health": ConnectionRefusedError(111, "refused")})
    found = run(clock, http)
    assert found["step"] == "health" and found["health"] is None and "did not answer" in found["why"]
    assert clock.now == _probe.HEALTH_SETTLE_S and len(asked) == 5


def test_a_model_not_listed_fails_naming_both():
    clock = Clock()
    http, _asked = endpoint(clock)
    found = _probe.probe(http, "other", "p", 8, 30, wait=clock.wait, clock=lambda: clock.now)
    assert found["step"] == "models" and "not the served name other" in found["why"] and SERVED in found["why"]


def test_the_watchdog_restarts_at_once_then_backs_off_then_stops_at_a_crash_loop():
    now = 10_000.0
    assert _probe.restart_decision([], now, 3, 3600, 30) == ("restart", 0, [])
    one = [{"at": now - 10, "why": "a"}]
    assert _probe.restart_decision(one, now, 3, 3600, 30)[:2] == ("restart", 20)
    two = [{"at": now - 100, "why": "a"}, {"at": now - 10, "why": "b"}]
    assert _probe.restart_decision(two, now, 3, 3600, 30)[:2] == ("restart", 50)  # 30 x 2, 10 s gone
    three = [{"at": now - 4000, "why": "old"}, *two, {"at": now - 5, "why": "c"}]
    decision, wait, recent = _probe.restart_decision(three, now, 3, 3600, 30)
    assert decision == "crash_loop" and wait == 0 and [e["why"] for e in recent] == ["a", "b", "c"]
    message = _probe.crash_loop_message(recent, 3600, 3, "/var/lib/dgx-spark/vllm-restarts.json")
    assert "after removing /var/lib/dgx-spark/vllm-restarts.json on the head" in message
    assert "restarted 3 time(s) in the last 3600s" in message and "vllm_server_max_restarts (3)" in message


def test_the_history_survives_a_bad_file_and_keeps_the_newest(tmp_path):
    path = str(tmp_path / "sub" / "restarts.json")
    assert _probe.read_history(path) == []
    assert _probe.write_history(path, [{"at": float(i), "why": str(i)} for i in range(60)], keep=50) is None
    assert [e["why"] for e in _probe.read_history(path)][:1] == ["10"] and len(_probe.read_history(path)) == 50
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("{not json")
    assert _probe.read_history(path) == []


def once(clock, http, timeout=30):
    return _probe.ask_once(http, SERVED, "The capital", 1, timeout, wait=clock.wait, clock=lambda: clock.now)


def test_the_warm_check_is_one_completion_and_leaves_the_engine_unnamed():
    clock = Clock()
    http, asked = endpoint(clock, **{"/v1/completions": 0.2})
    found = once(clock, http)
    assert found["ok"] and [p for _m, p, _t in asked] == ["/v1/completions"]
    assert found["models"] == [RECORDED["completion"]["model"]]
    assert found["text"] == RECORDED["completion"]["choices"][0]["text"]
    assert found["engine_version"] is None and found["owned_by"] is None and found["latency_s"] == 0.2
    assert _probe.summary("http://h:8000", SERVED, found)["engine"] is None


def test_a_refused_warm_check_is_probed_in_full_naming_the_step():
    clock = Clock()
    refused = ConnectionRefusedError(111, "refused")
    http, asked = endpoint(clock, **{"/v1/completions": refused, "/health": refused})
    found = once(clock, http)
    assert found["step"] == "health" and "did not answer" in found["why"]
    assert [p for _m, p, _t in asked][:2] == ["/v1/completions", "/health"]


def test_a_hung_warm_check_is_not_asked_again():
    clock = Clock()
    http, asked = endpoint(clock, **{"/v1/completions": 600})
    found = once(clock, http, timeout=20)
    assert not found["ok"] and found["step"] == "completion" and "no completion within 20s" in found["why"]
    assert len(asked) == 1 and clock.now == 20


def test_the_full_probe_reports_what_v1_models_lists_not_the_completion_model():
    clock = Clock()
    http, _asked = endpoint(clock)
    found = run(clock, http)
    assert found["models"] == [m["id"] for m in RECORDED["models"]["data"]]


def test_a_warm_check_for_a_model_not_served_is_probed_in_full_naming_models():
    clock = Clock()
    missing = HTTPError("http://h/v1/completions", 404, "Not Found", {}, None)
    http, asked = endpoint(clock, **{"/v1/completions": missing})
    found = _probe.ask_once(http, "other-model", "x", 1, 30, wait=clock.wait, clock=lambda: clock.now)
    assert found["step"] == "models" and "not the served name other-model" in found["why"]
    assert [p for _m, p, _t in asked] == ["/v1/completions", "/health", "/v1/models"]


def test_a_malformed_answer_falls_back_to_the_full_probe_in_the_time_left():
    clock = Clock()
    calls = []

    def http(method, path, body, timeout):
        calls.append((path, timeout))
        if path == "/v1/completions" and len(calls) == 1:
            clock.now += 12
            return 200, b"<html>proxy error</html>"
        if path == "/health":
            return 200, b""
        key = {"/v1/models": "models", "/version": "version", "/v1/completions": "completion"}[path]
        return 200, json.dumps(RECORDED[key]).encode()

    found = once(clock, http, timeout=30)
    # The second completion is the full probe's own: it passed, the engine is named.
    assert found["ok"] and found["health"] == 200 and found["owned_by"] == "vllm"
    assert [p for p, _t in calls] == ["/v1/completions", "/health", "/v1/models", "/version", "/v1/completions"]
    assert max(t for _p, t in calls[1:]) <= 18  # 30 s in all, 12 gone


def test_an_answer_without_a_usage_dict_still_passes_with_no_token_count():
    clock = Clock()

    def http(method, path, body, timeout):
        answer = dict(RECORDED["completion"], usage="n/a")
        return 200, json.dumps(answer).encode()

    found = once(clock, http)
    assert found["ok"] and found["tokens"] is None and found["text"] == RECORDED["completion"]["choices"][0]["text"]
