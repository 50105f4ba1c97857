"""A real local Ray cluster (2 declared GPUs) and a stand-in server process for the tests.

Run with a venv that has ray and pytest (e.g. /tmp/standin-venv):
    /tmp/standin-venv/bin/python -m pytest -q lab/standin_vllm/tests
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, SRC)
sys.path.insert(0, os.path.dirname(SRC))  # lab/, for make_model


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env(**extra):
    out = dict(os.environ, PYTHONPATH=SRC, RAY_USAGE_STATS_ENABLED="0", VLLM_STANDIN_NODE_NAME="lab-node")
    out.update(extra)
    return out


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = free_port()
    temp = str(tmp_path_factory.mktemp("ray"))
    subprocess.run(
        [ray_bin, "start", "--head", "--port", str(port), "--num-gpus", "2", "--num-cpus", "2",
         "--include-dashboard=false", "--temp-dir", temp, "--disable-usage-stats"],
        check=True, env=env(), capture_output=True,
    )  # fmt: skip
    yield "127.0.0.1:%d" % port
    subprocess.run([ray_bin, "stop", "--force"], env=env(), capture_output=True, check=False)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    import make_model  # noqa: PLC0415 - lab/ is put on the path above

    return make_model.make_model(str(tmp_path_factory.mktemp("model") / "qwen35"))


def http(method, url, body=None, key=None, timeout=30):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - loopback only
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Server:
    def __init__(self, proc, port, log):
        self.proc, self.port, self.log = proc, port, log
        self.url = "http://127.0.0.1:%d" % port

    def output(self):
        with open(self.log, encoding="utf-8") as handle:
            return handle.read()


def start_server(tmp_path, address, args, delay="0", wait=90):
    port = free_port()
    log = str(tmp_path / ("serve-%d.log" % port))
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.cli", "serve", *args, "--port", str(port), "--host", "127.0.0.1"],
            stdout=out, stderr=subprocess.STDOUT,
            env=env(RAY_ADDRESS=address, VLLM_STANDIN_LOAD_DELAY=delay),
        )  # fmt: skip
    server = Server(proc, port, log)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return server
        try:
            if http("GET", server.url + "/health", timeout=2)[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError("stand-in did not become healthy:\n" + server.output())
