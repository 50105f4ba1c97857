"""The expressions whose order matters keep it under any string hash seed.

Ansible's union, difference and intersect filters go through a set: the order of their result moves with
PYTHONHASHSEED, that is from one ansible-playbook run to the next. Each expression is read from its file and
rendered by Ansible's own Templar in processes with different seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
STAGES = [
    "preflight",
    "gpu",
    "fabric",
    "runtime_image",
    "validate",
    "model",
    "ray_cluster",
    "vllm_server",
    "monitoring",
]
NODES = ["trio-1", "trio-2", "trio-3", "trio-4"]
GROUPS = {"spark": NODES, "spark_head": NODES[:1], "spark_workers": NODES[1:]}
SEEDS = range(8)

RENDER = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
print(json.dumps([Templar(loader=DataLoader(), variables=v).template(trust_as_template(e))
                  for e, v in json.load(sys.stdin)]))
"""


def load(path):
    return yaml.safe_load((ROOT / path).read_text())


def task(path, name):
    tasks = load(path)
    tasks = tasks[0]["tasks"] if "hosts" in tasks[0] else tasks
    return next(t for t in tasks if t["name"] == name)


def render_with_seeds(cases):
    """Each (expression, variables) rendered under every seed: one list of results per seed."""
    runs = []
    for seed in SEEDS:
        out = subprocess.run(
            [sys.executable, "-c", RENDER],
            input=json.dumps(cases),
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=str(seed)),
            check=True,
        )
        runs.append(json.loads(out.stdout))
    return runs


def expressions():
    from_first = task("playbooks/deploy.yml", "Work out which stages run")["vars"]["_deploy_from_first"]
    node_rank = task("roles/validate/tasks/main.yml", next(t["name"] for t in load("roles/validate/tasks/main.yml")))
    node_rank = node_rank["dgx_spark.vllm.nccl_test"]["node_rank"]
    peers_described = task("roles/fabric/tasks/stage.yml", "Describe the stage for the deploy's stage record")
    peers_pinged = task("roles/fabric/tasks/main.yml", "Check | DF ping at MTU-28 to every other host on each rail")
    fabric = {"groups": GROUPS, "fabric_peer_group": "spark", "inventory_hostname": "trio-2"}
    return [
        # Which group holds the last stage that runs decides where the plan is recorded.
        (from_first, {"_deploy_stages": STAGES, "_deploy_run_from": 0, "_deploy_touched": []}, STAGES),
        (
            from_first,
            {"_deploy_stages": STAGES, "_deploy_run_from": 6, "_deploy_touched": ["fabric"]},
            ["fabric", "ray_cluster", "vllm_server", "monitoring"],
        ),
        (load("roles/vllm_server/vars/main.yml")["_vllm_server_ranks"], {"groups": GROUPS}, NODES),
        *[(node_rank, {"groups": GROUPS, "inventory_hostname": node}, rank) for rank, node in enumerate(NODES)],
        (peers_described["vars"]["_fabric_peers"], fabric, ["trio-1", "trio-3", "trio-4"]),
        (
            peers_pinged["vars"]["_fabric_peers"],
            dict(fabric, ansible_play_hosts_all=NODES),
            ["trio-1", "trio-3", "trio-4"],
        ),
    ]


# What the test guards against: if Ansible's filters kept order, it would guard nothing.
SET_FILTERS = [
    ("{{ stages | union(['x']) }}", {"stages": STAGES}),
    ("{{ stages | difference(['x']) }}", {"stages": STAGES}),
    ("{{ stages | intersect(stages) }}", {"stages": STAGES}),
]


@pytest.fixture(scope="module")
def rendered():
    """The expressions, then SET_FILTERS, rendered under every seed (one process per seed)."""
    cases = expressions()
    return cases, render_with_seeds([(expr, variables) for expr, variables, _want in cases] + SET_FILTERS)


def test_order_does_not_move_with_the_hash_seed(rendered):
    cases, runs = rendered
    for i, (expr, _variables, want) in enumerate(cases):
        got = [run[i] for run in runs]
        assert got == [want] * len(got), "%s gave %s" % (expr.strip(), got)


def test_the_set_filters_do_move_with_it(rendered):
    cases, runs = rendered
    for i, (expr, _variables) in enumerate(SET_FILTERS, start=len(cases)):
        assert len({json.dumps(run[i]) for run in runs}) > 1, expr
