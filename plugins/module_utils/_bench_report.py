# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark reports on the control node: the figures of each point of a `vllm bench serve` sweep, the
comparison with the previous report of the same shape, the printed table and the latency plot (private)."""

from __future__ import annotations

import glob
import json
import math
import os
import traceback

from ansible_collections.dgx_spark.vllm.plugins.module_utils._vllm_bench import load_text, plain_number

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a control node
    from matplotlib import pyplot

    HAS_MATPLOTLIB = True
    MATPLOTLIB_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - reported through fail_json
    HAS_MATPLOTLIB = False
    MATPLOTLIB_IMPORT_ERROR = traceback.format_exc()

FORMAT = 1

# The compared figures: key in a point, column heading, whether a higher value is better.
METRICS = [
    ("input_tokens_per_s", "in tok/s", True),
    ("output_tokens_per_s", "out tok/s", True),
    ("ttft_p50_ms", "TTFT p50", False),
    ("ttft_p99_ms", "TTFT p99", False),
    ("itl_p50_ms", "ITL p50", False),
    ("itl_p99_ms", "ITL p99", False),
    ("failed", "failed", False),
]

# What a report's shape holds; two reports compare when these and the model are equal.
SHAPE_KEYS = ("name", "dataset", "input_len", "output_len", "num_prompts", "load")

LOAD_HEADING = {"concurrency": "conc", "request_rate": "req/s"}


def point_figures(raw):
    """One point's figures from a `vllm bench serve` result JSON (its p50/p99 keys, tokens and duration)."""
    duration = raw.get("duration") or 0.0

    def per_s(total):
        return round(total / duration, 2) if duration else 0.0

    figures = {
        "completed": int(raw.get("completed", 0)),
        "failed": int(raw.get("failed", 0)),
        # A result file lists one error per request ('' when it succeeded); the distinct ones are kept.
        "errors": sorted({e for e in raw.get("errors") or [] if e})[:5],
        "duration_s": round(duration, 3),
        "request_throughput": round(raw.get("request_throughput", 0.0), 3),
        "input_tokens_per_s": per_s(raw.get("total_input_tokens", 0)),
        "output_tokens_per_s": per_s(raw.get("total_output_tokens", 0)),
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for pct in ("50", "99"):
            key = "p%s_%s_ms" % (pct, metric)
            if key in raw:
                value = raw[key]
                finite = isinstance(value, (int, float)) and math.isfinite(value)
                figures["%s_p%s_ms" % (metric, pct)] = round(value, 2) if finite else None
    return figures


def hardware_note(engine):
    """What the figures are figures of, said in every report and plot."""
    packages = engine.get("packages") or {}
    named = ", ".join("%s %s" % kv for kv in sorted(packages.items())) or "vLLM %s" % engine.get("version")
    if engine.get("cpu_build"):
        return "CPU figures: the engine is a CPU build of vLLM (%s); not GPU figures" % named
    return "GPU figures: %s" % named


def build_report(p, stamp):
    """The report of one run: shape, engine, image, model, endpoint, one entry per point."""
    bench = p["bench"]
    points = []
    for point in bench["points"]:
        figures = point_figures(point["result"])
        figures["load"] = plain_number(point["load"])
        points.append(figures)
    return {
        "format": FORMAT,
        "time": stamp,
        "shape": dict(p["shape"], points=[plain_number(v) for v in p["shape"]["points"]]),
        "model": p["model"],
        "endpoint": p["endpoint"],
        "engine": dict(bench["engine"]),
        "image": {"ref": p["image"], "id": bench["image_id"]},
        "hardware_note": hardware_note(bench["engine"]),
        "context": dict(p["context"]),
        "sweep_seconds": bench.get("seconds"),
        "points": points,
    }


def same_shape(a, b):
    """Whether two reports ran the same shape against the same model."""
    return a.get("model") == b.get("model") and all(
        a.get("shape", {}).get(k) == b.get("shape", {}).get(k) for k in SHAPE_KEYS
    )


def previous_report(report_dir, report):
    """(path, report) of the newest earlier report of the same shape in report_dir, or (None, None)."""
    found = []
    for path in glob.glob(os.path.join(report_dir, "*.json")):
        try:
            with open(path, encoding="utf-8") as handle:
                other = json.load(handle)
        except (OSError, ValueError):
            continue  # not ours, or half written
        ours = isinstance(other, dict) and other.get("format") == FORMAT and same_shape(other, report)
        if ours and other.get("time", "") < report["time"]:
            found.append((other["time"], path, other))
    if not found:
        return None, None
    _time, path, other = max(found, key=lambda item: item[0])
    return path, other


def compare(previous, report, threshold):
    """Per point and metric: before, now, change in percent, and whether it is worse beyond threshold percent.

    Failed requests: any increase is a regression (no percentage of zero)."""
    before = {float(p["load"]): p for p in previous["points"]}
    rows = []
    for point in report["points"]:
        old = before.get(float(point["load"]))
        if old is None:
            continue
        for key, heading, higher_better in METRICS:
            if key not in point or key not in old:
                continue
            was, now = old[key], point[key]
            delta = round((now - was) / was * 100.0, 1) if was else None
            if key == "failed":
                worse = now > was
            elif delta is None:
                worse = False
            else:
                worse = (-delta if higher_better else delta) > threshold
            rows.append(
                dict(
                    load=point["load"],
                    metric=key,
                    heading=heading,
                    before=was,
                    now=now,
                    delta_pct=delta,
                    regression=worse,
                )
            )
    return rows


def _cell(value, width):
    if value is None:
        return "-".rjust(width)
    text = ("%.1f" % value) if isinstance(value, float) else str(value)
    return text.rjust(width)


def table(report, comparison=None, previous_name=None, threshold=None):
    """The lines the playbook prints: what ran, the figures per point, and the change against the previous run."""
    shape = report["shape"]
    load = shape["load"]
    lines = [
        "shape %s: %s prompts, %s tokens in, %s out, %s per point; %s %s"
        % (
            shape["name"],
            shape["dataset"],
            shape["input_len"],
            shape["output_len"],
            shape["num_prompts"],
            load.replace("_", " "),
            ", ".join(load_text(v) for v in shape["points"]),
        ),
        "model %s at %s; vLLM %s, image %s"
        % (report["model"], report["endpoint"], report["engine"].get("version"), report["image"]["id"][:19]),
        report["hardware_note"],
        "",
    ]
    head = LOAD_HEADING.get(load, load)
    columns = [(k, h) for k, h, _better in METRICS if k != "failed"]
    lines.append("%6s %9s " % (head, "ok/failed") + " ".join("%9s" % h for _k, h in columns) + "  (latency in ms)")
    for point in report["points"]:
        done = "%s/%s" % (point["completed"], point["failed"])
        lines.append(
            "%6s %9s " % (load_text(point["load"]), done) + " ".join(_cell(point.get(k), 9) for k, _h in columns)
        )
    errors = sorted({e for point in report["points"] for e in point["errors"]})
    if errors:
        lines.append("request errors: " + " | ".join(e[:200] for e in errors[:3]))
    lines.append("")
    if comparison is None:
        lines.append("no earlier report of this shape and model: nothing to compare")
        return lines
    lines.append("change against %s (worse by more than %s%% is a regression, marked !):" % (previous_name, threshold))
    lines.append("%6s " % head + " ".join("%9s" % h for _k, h, _b in METRICS))
    by_load = {}
    for row in comparison:
        by_load.setdefault(float(row["load"]), {})[row["metric"]] = row
    for load_value, rows in by_load.items():
        cells = []
        for key, _h, _b in METRICS:
            row = rows.get(key)
            if row is None:
                cells.append("-".rjust(9))
            elif key == "failed":
                cells.append(("%+d" % (row["now"] - row["before"]) + ("!" if row["regression"] else " ")).rjust(9))
            else:
                text = "n/a" if row["delta_pct"] is None else "%+.1f%%" % row["delta_pct"]
                cells.append((text + ("!" if row["regression"] else " ")).rjust(9))
        lines.append("%6s " % load_text(load_value) + " ".join(cells))
    regressions = regression_lines(comparison, load)
    lines.append("regressions: %s" % (len(regressions) or "none"))
    lines += ["  " + line for line in regressions]
    return lines


def regression_lines(comparison, load):
    """One phrase per regression: where, what, before -> now."""
    return [
        "%s %s %s: %s -> %s%s"
        % (
            load.replace("_", " "),
            load_text(row["load"]),
            row["heading"],
            row["before"],
            row["now"],
            "" if row["delta_pct"] is None else " (%+.1f%%)" % row["delta_pct"],
        )
        for row in comparison
        if row["regression"]
    ]


# The plotted latencies: key, label, line style, marker.
PLOTTED = [
    ("ttft_p50_ms", "TTFT p50", "-", "o"),
    ("ttft_p99_ms", "TTFT p99", "--", "s"),
    ("itl_p50_ms", "ITL p50", "-", "o"),
    ("itl_p99_ms", "ITL p99", "--", "s"),
]


def plot(report, previous, path):
    """A PNG of latency against load (TTFT and inter-token latency, p50 and p99); the previous run in grey."""
    shape = report["shape"]
    fig, ax = pyplot.subplots(figsize=(7.0, 4.2), dpi=100)
    try:
        colours = {"ttft": "tab:blue", "itl": "tab:orange"}
        for run, faded in ((previous, True), (report, False)):
            if run is None:
                continue
            loads = [float(p["load"]) for p in run["points"]]
            for key, label, style, marker in PLOTTED:
                values = [p.get(key) for p in run["points"]]
                if any(v is None for v in values):
                    continue
                ax.plot(
                    loads,
                    values,
                    style,
                    marker=marker,
                    markersize=4,
                    color="0.7" if faded else colours[key.split("_", maxsplit=1)[0]],
                    label=None if faded else label,
                    linewidth=1 if faded else 1.6,
                )
        loads = [float(p["load"]) for p in report["points"]]
        if len(loads) > 1 and min(loads) > 0 and max(loads) / min(loads) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(loads)
        ax.set_xticklabels([load_text(v) for v in loads])
        concurrency = shape["load"] == "concurrency"
        ax.set_xlabel("requests in flight (max concurrency)" if concurrency else "requests per second")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if previous is not None:
            handles.append(pyplot.Line2D([], [], color="0.7"))
            labels.append("previous run (%s)" % previous["time"])
        ax.legend(handles, labels, fontsize=8, loc="upper left")
        what = (report["model"], shape["name"], shape["input_len"], shape["output_len"], shape["num_prompts"])
        title = "%s, shape %s: %s in / %s out tokens, %s prompts per point" % what
        ax.set_title(title + "\n" + report["hardware_note"], fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        pyplot.close(fig)


def report_stem(report):
    """File name (without extension) of a report: its time then its shape, so names sort by time."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in report["shape"]["name"])
    return "%s-%s" % (report["time"], safe)


def dumps(report):
    """The report file's text (strict JSON: a figure that is not a number is null)."""
    return json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n"
