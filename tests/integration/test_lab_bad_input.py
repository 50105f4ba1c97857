"""Bad lab input: one line naming the cause, and nothing created on the real Docker engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults"))

import labkit as lab

PLAYBOOK = os.path.join(lab.ROOT, "playbooks", "lab.yml")


def engine_snapshot():
    """The lab's containers, networks, volumes and images on the engine (other users' objects left out)."""

    def names(*args):
        out = subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout
        return sorted(n for n in out.split() if n.startswith(("dgx-spark-lab", "spark-", "Spark_")))

    return {
        "containers": names("ps", "-a", "--format", "{{.Names}}"),
        "networks": names("network", "ls", "--format", "{{.Name}}"),
        "volumes": names("volume", "ls", "--format", "{{.Name}}"),
        "images": names("images", "--format", "{{.Repository}}:{{.Tag}}"),
    }


def run_lab(extra_vars, tmp_path):
    """playbooks/lab.yml on the lab's inventory with bad extra vars, through the suites' runner (labkit)."""
    state_dir = tmp_path / "lab-state"
    extra = dict(extra_vars, lab_state_dir=str(state_dir))
    return lab.playbook(PLAYBOOK, "-e", json.dumps(extra), timeout=300), state_dir


@pytest.fixture(scope="module")
def docker_engine():
    if subprocess.run(["docker", "version"], capture_output=True, check=False).returncode != 0:
        pytest.fail("no Docker engine answers: run scripts/ensure-docker.sh first")


CASES = [
    ({"lab_nodes": ["Spark_1", "spark-2"]}, "lab_nodes", "not valid hostnames"),
    ({"lab_management_subnet": "10.20.0.0/24"}, "lab_management_subnet", "outside 198.18.0.0/15"),
    (
        {"lab_fabric_networks": [{"interface": "enp1s0f1np1", "subnet": "192.0.2.0/24"}]},
        "lab_fabric_networks",
        "outside 198.18.0.0/15",
    ),
    ({"lab_docker_host": "unix:///nonexistent/docker.sock"}, "lab_docker_host", "not reachable"),
]


@pytest.mark.parametrize(("extra_vars", "parameter", "cause"), CASES, ids=[c[1] + "-" + c[2] for c in CASES])
def test_bad_lab_input_is_refused_and_creates_nothing(docker_engine, tmp_path, extra_vars, parameter, cause):
    before = engine_snapshot()
    proc, state_dir = run_lab(extra_vars, tmp_path)
    after = engine_snapshot()

    assert proc.rc != 0 and not proc.timed_out, proc.out
    failure_lines = [line for line in proc.lines if line.startswith("fatal:") or "msg:" in line]
    message = next((line for line in proc.lines if parameter + ":" in line and cause in line), None)
    assert message is not None, "no single line names %s and '%s':\n%s" % (parameter, cause, "\n".join(failure_lines))
    assert before == after
    assert not state_dir.exists()
