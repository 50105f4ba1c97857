"""Every `ray start` flag, Ray environment variable and Ray Python API the collection uses, against real Ray."""

from __future__ import annotations

import json

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_env, _ray

BASE = dict(
    ray_port=6379,
    node_ip="198.18.100.11",
    gpus=1,
    declared_gpus=None,
    num_cpus=None,
    include_dashboard=False,
    dashboard_host="198.18.100.11",
    dashboard_port=8265,
    head_address="198.18.100.11",
)

# Click parses every option before it runs the eager --help: an option Ray does not have fails with
# "No such option" (exit 2) before help is printed.
CLICK_PARSE = r"""
import json, sys
from click.testing import CliRunner
from ray.scripts.scripts import start
runs = []
for argv in json.loads(sys.argv[1]):
    res = CliRunner().invoke(start, argv + ["--help"])
    runs.append({"argv": argv, "exit": res.exit_code, "out": res.output[-400:]})
print(json.dumps(runs))
"""


def _argvs():
    head = dict(BASE, role="head")
    head_dash = dict(head, include_dashboard=True, num_cpus=2, metrics_export_port=8080)
    worker = dict(BASE, role="worker", node_ip="198.18.100.12", declared_gpus=1)
    return [_ray.ray_start_argv(p)[2:] for p in (head, head_dash, worker)]


def test_every_ray_start_flag_parses_in_real_ray(in_image_json):
    argvs = _argvs()
    assert [a for argv in argvs for a in argv if a.startswith("--metrics-export")] == ["--metrics-export-port=8080"]
    runs = in_image_json(CLICK_PARSE, json.dumps(argvs))
    for run in runs:
        assert run["exit"] == 0, "ray start refused %s: %s" % (run["argv"], run["out"])
        assert "Show this message and exit." in run["out"]


def test_an_unknown_ray_start_flag_is_refused(in_image_json):
    # The check above can fail: real Ray refuses what it does not know.
    runs = in_image_json(CLICK_PARSE, json.dumps([["--head", "--num-gpu=1"]]))
    assert runs[0]["exit"] == 2
    assert "No such option" in runs[0]["out"]


API = r"""
import inspect, json, ray
init = inspect.signature(ray.init).parameters
print(json.dumps({
    "version": ray.__version__,
    "init": sorted(init),
    "nodes": callable(ray.nodes),
    "cluster_resources": callable(ray.cluster_resources),
}))
"""


def test_ray_python_api_the_wait_uses(in_image_json):
    api = in_image_json(API)
    assert api["version"] == "2.60.0"
    # _ray.RAY_QUERY: ray.init(address="auto", logging_level, log_to_driver), ray.nodes(), ray.cluster_resources()
    for name in ("address", "logging_level", "log_to_driver"):
        assert name in api["init"], name
    assert "ray.init(address='auto'" in _ray.RAY_QUERY
    assert api["nodes"] and api["cluster_resources"]


RAY_CONFIG = r"""
import glob, json, os, ray
lib = glob.glob(os.path.join(os.path.dirname(ray.__file__), "_raylet*.so"))[0]
data = open(lib, "rb").read()
print(json.dumps({name: name.encode() in data for name in __import__("sys").argv[1:]}))
"""


@pytest.mark.parametrize(
    "variable",
    sorted(
        k
        for k in _nccl_env.build_env(
            [{"name": "enp1s0f1np1", "address": "198.18.100.11/24"}], "198.18.100.11", allow_socket_fallback=True
        )[0]
        if k.startswith("RAY_")
    ),
)
def test_ray_config_variables_exist_in_real_ray(in_image_json, variable):
    # RAY_<name> overrides the raylet's compiled-in config entry <name> (ray_config_def.h).
    found = in_image_json(RAY_CONFIG, variable[len("RAY_") :])
    assert found[variable[len("RAY_") :]], "%s: Ray %s has no config entry of that name" % (variable, "2.60.0")
