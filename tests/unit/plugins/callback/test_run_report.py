"""run_report keeps the last serving probe a host's tasks returned: vllm_serve's, or the stage probe's."""

from __future__ import annotations

from types import SimpleNamespace

from ansible_collections.dgx_spark.vllm.plugins.callback.run_report import CallbackModule

PASSED = dict(ok=True, step=None, why=None, latency_s=0.49, tokens=8, engine_version="0.32.0")
FAILED = dict(ok=False, step="completion", why="no completion within 60s", latency_s=60.0, tokens=None)


def result(name, returned):
    host = SimpleNamespace(get_name=lambda: "spark-1")
    return SimpleNamespace(_host=host, _task=SimpleNamespace(get_name=lambda: name), _result=returned)


def test_the_stage_probes_endpoint_probe_is_kept_when_vllm_serve_does_not_run():
    report = CallbackModule()
    report.v2_runner_on_ok(result("Read each node's live state", dict(changed=False, endpoint=dict(probe=PASSED))))
    assert report._hosts["spark-1"]["probe"] == PASSED


def test_vllm_serve_after_a_failed_stage_probe_has_the_last_word():
    report = CallbackModule()
    report.v2_runner_on_ok(result("Read each node's live state", dict(changed=False, endpoint=dict(probe=FAILED))))
    # vllm_serve's endpoint is its URL, not a probe.
    report.v2_runner_on_ok(result("Serve", dict(changed=True, endpoint="http://127.0.0.1:8000/v1", probe=PASSED)))
    assert report._hosts["spark-1"]["probe"] == PASSED and report._hosts["spark-1"]["changed"] == 1
