"""vllm_probe against the lab engine's recorded answers, over a fake open_url."""

from __future__ import annotations

import io
import json
import os

from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_probe
from module_runner import FIXTURES, run_module

with open(os.path.join(FIXTURES, "vllm_api", "lab-0.32.0-tp2-ray.json"), encoding="utf-8") as handle:
    RECORDED = json.load(handle)
SERVED = RECORDED["models"]["data"][0]["id"]


class Resp(io.BytesIO):
    def getcode(self):
        return 200


def engine(hang=False):
    asked = []

    def open_url(url, method="GET", data=None, headers=None, timeout=None, use_proxy=True):  # noqa: PLR0917
        path = url.split("8000", 1)[1]
        asked.append((method, path, dict(headers or {}), timeout))
        if path == "/health":
            return Resp(b"")
        if path == "/v1/completions" and hang:
            raise TimeoutError("timed out")
        key = {"/v1/models": "models", "/version": "version", "/v1/completions": "completion"}[path]
        return Resp(json.dumps(RECORDED[key]).encode())

    return open_url, asked


ARGS = dict(url="http://198.18.100.11:8000/", served_model_name=SERVED, api_key="s3cret", timeout=20)


def test_a_serving_endpoint_is_reported_with_the_key_in_the_header_only(monkeypatch):
    open_url, asked = engine()
    monkeypatch.setattr(vllm_probe, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_probe, ARGS)
    assert not failed and not res["changed"] and res["probe"]["ok"]
    assert res["probe"]["engine_version"] == RECORDED["version"]["version"]
    assert [a[1] for a in asked] == ["/health", "/v1/models", "/version", "/v1/completions"]
    assert all(a[2]["Authorization"] == "Bearer s3cret" for a in asked)
    assert "s3cret" not in json.dumps(res)


def test_a_hung_engine_is_a_result_or_with_fail_on_failure_a_failure(monkeypatch):
    open_url, _asked = engine(hang=True)
    monkeypatch.setattr(vllm_probe, "open_url", open_url)
    failed, res = run_module(monkeypatch, vllm_probe, ARGS)
    assert not failed and not res["probe"]["ok"] and res["probe"]["step"] == "completion"
    failed, res = run_module(monkeypatch, vllm_probe, dict(ARGS, fail_on_failure=True))
    assert failed and "failed at completion" in res["msg"] and "the engine hangs" in res["msg"]


def test_a_zero_timeout_is_refused(monkeypatch):
    failed, res = run_module(monkeypatch, vllm_probe, dict(ARGS, timeout=0))
    assert failed and "timeout and max_tokens must be 1 or more" in res["msg"]
