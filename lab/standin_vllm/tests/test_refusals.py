"""What the stand-in refuses at start, as vLLM would, and the configurable load delay."""

import json
import time

from conftest import start_server


def test_unsupported_architecture_refused(ray_cluster, model_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    srv = start_server(tmp_path, ray_cluster, [str(other)])
    assert srv.proc.wait(timeout=30) != 0
    assert "Model architectures ['FooForCausalLM'] are not supported for now. Supported architectures:" in srv.output()


def test_more_gpus_than_cluster_refused(ray_cluster, model_dir, tmp_path):
    srv = start_server(tmp_path, ray_cluster, [model_dir, "--tensor-parallel-size", "4"])
    assert srv.proc.wait(timeout=60) != 0
    assert "exceeds the total number of available GPUs (2)" in srv.output()


def test_load_delay_holds_the_port(ray_cluster, model_dir, tmp_path):
    started = time.monotonic()
    srv = start_server(tmp_path, ray_cluster, [model_dir, "--served-model-name", "m"], delay="3")
    try:
        assert srv.proc.poll() is None, srv.output()
        assert time.monotonic() - started >= 3
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=30)
