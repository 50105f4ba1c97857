"""vllm_bench_report: a first run writes a report and a plot; a second compares with the first."""

from __future__ import annotations

import json
import os

from ansible_collections.dgx_spark.vllm.plugins.modules import vllm_bench_report
from module_runner import run_module
from recorded_bench import REPORT_ARGS

ARGS = REPORT_ARGS


def stamps(monkeypatch, *times):
    """The UTC stamps of successive runs."""
    left = list(times)
    monkeypatch.setattr(vllm_bench_report, "utc_stamp", lambda: left.pop(0))


def test_first_run_writes_report_and_plot_then_second_compares(monkeypatch, tmp_path):
    stamps(monkeypatch, "20261201T010000Z", "20261201T010100Z")
    args = dict(ARGS, report_dir=str(tmp_path / "reports"))
    failed, first = run_module(monkeypatch, vllm_bench_report, args)
    assert not failed and first["changed"] and first["previous"] is None and first["comparison"] == []
    assert os.path.basename(first["report"]) == "20261201T010000Z-tiny.json"
    assert first["plot"].endswith("20261201T010000Z-tiny.png") and os.path.getsize(first["plot"]) > 1000
    assert first["table"][2].startswith("CPU figures")

    failed, second = run_module(monkeypatch, vllm_bench_report, args)
    assert not failed and second["previous"] == first["report"]
    # The same recorded figures: no change, no regression.
    assert second["regressions"] == [] and {r["delta_pct"] for r in second["comparison"]} <= {0.0, None}
    with open(second["report"], encoding="utf-8") as handle:
        saved = json.load(handle)
    assert saved["comparison"]["previous"] == "20261201T010000Z-tiny.json"
    assert saved["plot"] == "20261201T010100Z-tiny.png" and saved["engine"]["cpu_build"] is True


def test_check_mode_writes_nothing(monkeypatch, tmp_path):
    stamps(monkeypatch, "20261201T010000Z")
    failed, result = run_module(
        monkeypatch, vllm_bench_report, dict(ARGS, report_dir=str(tmp_path), _ansible_check_mode=True)
    )
    assert not failed and result["changed"] and os.listdir(str(tmp_path)) == []


def test_two_runs_in_one_second_keep_both(monkeypatch, tmp_path):
    stamps(monkeypatch, "20261201T010000Z", "20261201T010000Z")
    args = dict(ARGS, report_dir=str(tmp_path), plot=False)
    run_module(monkeypatch, vllm_bench_report, args)
    _failed, second = run_module(monkeypatch, vllm_bench_report, args)
    assert os.path.basename(second["report"]) == "20261201T010000Z-tiny-2.json" and second["plot"] is None


def test_not_a_bench_result_is_refused(monkeypatch, tmp_path):
    failed, result = run_module(
        monkeypatch, vllm_bench_report, dict(ARGS, report_dir=str(tmp_path), bench={"changed": False})
    )
    assert failed and result["msg"] == "bench: not a vllm_bench result (no image_id, engine, points)."
