"""The NCCL library read, on the payload's output recorded on an H200 (pip and system builds side by side)
and in the lab's CPU runtime image (none); the payload's own helpers on fixture trees."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.dgx_spark.vllm.plugins.filter.nccl_library_line import FilterModule
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_library as nl
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nccl_payload as payload
from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_test import parse_payload_output
from module_runner import fixture_text

PIP = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
SYSTEM = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"


def facts(name):
    return parse_payload_output(fixture_text("nccl_library", name + ".out"))["library"]


def library(name):
    return nl.describe(facts(name))


@pytest.mark.parametrize(("code", "text"), [(22809, "2.28.9"), (21903, "2.19.3"), (2708, "2.7.8")])
def test_decode_version(code, text):
    assert nl.decode_version(code) == text


@pytest.mark.parametrize("name", ["default", "default_after_init", "ld_library_path_system"])
def test_h200_loads_the_pip_wheel(name):
    found = library(name)
    assert found["available"] and found["build"] == "pip" and found["builds"] == ["pip"]
    assert found["path"] == PIP and found["version"] == "2.28.9" and found["version_from"] == "ncclGetVersion"
    assert found["package"] == "nvidia-nccl-cu13 2.28.9"
    # The OS's libnccl2 (2.28.3) is in the image too and not loaded; libnccl-dev's link alone is no build.
    assert found["line"] == (
        "libnccl.so.2 2.28.9 (pip nvidia-nccl-cu13 2.28.9) %s; installed, not loaded: libnccl2 2.28.3-1+cuda13.0 (dpkg)"
        % PIP
    )


def test_after_nccl_ran_the_same_file_is_loaded():
    """NCCL's own log line in the recording names the version the plain read reports."""
    assert "NCCL INFO NCCL version 2.28.9+cuda13.0" in fixture_text("nccl_library", "default_after_init.out")
    assert library("default_after_init")["line"] == library("default")["line"]


@pytest.mark.parametrize("name", ["ld_preload_system", "ld_preload_system_after_init"])
def test_preloaded_system_library_wins(name):
    found = library(name)
    assert found["build"] == "system" and found["builds"] == ["system"] and found["path"] == SYSTEM
    assert found["version"] == "2.28.3" and found["package"] == "libnccl2 2.28.3-1+cuda13.0"
    assert found["line"].endswith("; also mapped, unused: %s" % PIP)


def test_preloaded_system_library_is_what_nccl_ran():
    assert "NCCL INFO NCCL version 2.28.3+cuda13.0" in fixture_text("nccl_library", "ld_preload_system_after_init.out")


def test_vllm_nccl_so_path_gives_two_builds_in_one_process():
    found = library("vllm_nccl_so_path_system")
    assert found["path"] == SYSTEM and found["builds"] == ["pip", "system"]
    torch_library = found["torch_library"]
    assert torch_library["path"] == PIP and torch_library["build"] == "pip"
    # Not called through ncclGetVersion in this process: the wheel's version, said as such.
    assert torch_library["version"] == "2.28.9" and torch_library["version_from"] == "package"
    assert "torch's own NCCL calls use another: libnccl.so.2 2.28.9 (pip nvidia-nccl-cu13 2.28.9)" in found["line"]
    # torch's process group ran the wheel's NCCL, as its log says.
    text = fixture_text("nccl_library", "vllm_nccl_so_path_system_after_init.out")
    assert "NCCL INFO NCCL version 2.28.9+cuda13.0" in text


def test_lab_cpu_image_has_none():
    found = library("lab_runtime")
    assert not found["available"] and found["builds"] == [] and found["path"] is None
    assert found["line"] == (
        "not available: torch 2.13.0+cpu is a CPU build; no libnccl.so.2 can be loaded: "
        "libnccl.so.2: cannot open shared object file: No such file or directory"
    )


def test_static_nccl_in_torch():
    found = nl.describe(dict(torch="2.1.0+cu121", torch_cuda="12.1", torch_built_with_nccl="2.18.1", mapped=[]))
    assert found["build"] == "static" and found["line"] == (
        "NCCL 2.18.1 (static: linked into torch 2.1.0+cu121, no libnccl file)"
    )


def test_no_torch_and_unowned_file():
    found = nl.describe(
        dict(torch_error="No module named 'torch'", mapped=["/opt/nccl/lib/libnccl.so.2"], dlopen={"name": "x"})
    )
    assert found["build"] == "other" and found["version"] == "?"
    assert nl.describe(dict(torch_error="No module named 'torch'", mapped=[]))["line"] == (
        "not available: PyTorch is not importable (No module named 'torch')"
    )


def test_nothing_read():
    assert nl.describe(None)["line"] == "not read"


def pairs(*names):
    return [("spark-%d" % (i + 1), library(n) if n else None) for i, n in enumerate(names)]


def test_summary_says_same_for_equal_libraries():
    line = nl.summary_line(pairs("default", "default_after_init"))
    assert line.startswith("spark-1 libnccl.so.2 2.28.9 (pip nvidia-nccl-cu13 2.28.9) %s;" % PIP)
    assert line.endswith("; spark-2 same")


def test_summary_names_a_node_that_differs():
    line = nl.summary_line(pairs("default", "ld_preload_system"))
    assert "; spark-2 libnccl.so.2.28.3 2.28.3 (system libnccl2 2.28.3-1+cuda13.0)" in line


def test_summary_groups_nodes_without_a_library():
    assert nl.summary_line(pairs("lab_runtime", "lab_runtime")) == (
        "not available on spark-1, spark-2 (torch 2.13.0+cpu is a CPU build; no libnccl.so.2 can be loaded: "
        "libnccl.so.2: cannot open shared object file: No such file or directory)"
    )


def test_summary_from_the_record_says_so_and_unread_nodes_are_named():
    assert nl.summary_line(pairs("lab_runtime"), recorded=True).endswith(
        "[as recorded by the last validate run, not re-read]"
    )
    assert nl.summary_line(pairs(None, None)) == "not read on spark-1, spark-2 (the validate stage did not run)"


def test_filter_takes_lists_as_jinja_zip_gives_them():
    line = FilterModule().filters()["nccl_library_line"]([["spark-1", library("default")]], recorded=False)
    assert line.startswith("spark-1 libnccl.so.2 2.28.9")


def test_payload_reads_this_python():
    """The read itself, here (no torch, no libnccl): facts that say so, never a guess."""
    found = nl.describe(payload.library_facts())
    assert not found["available"] and found["line"].startswith("not available: PyTorch is not importable")


def test_payload_dpkg_owners(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnccl.so.2.28.3").write_text("")
    os.symlink("libnccl.so.2.28.3", str(lib / "libnccl.so.2"))
    os.symlink("libnccl.so.2", str(lib / "libnccl.so"))
    info = tmp_path / "info"
    info.mkdir()
    (info / "libnccl2:amd64.list").write_text("/.\n%s/libnccl.so.2.28.3\n%s/libnccl.so.2\n" % (lib, lib))
    (info / "libnccl-dev:amd64.list").write_text("%s/libnccl.so\n/usr/include/nccl.h\n" % lib)
    status = tmp_path / "status"
    status.write_text(
        "Package: libnccl-dev\nVersion: 2.28.3-1+cuda13.0\nDescription: x\n continued: line\n\n"
        "Package: libnccl2\nStatus: install ok installed\nVersion: 2.28.3-1+cuda13.0\n"
    )
    loaded = str(lib / "libnccl.so.2.28.3")
    owners = payload._dpkg_owners([loaded], info_dir=str(info), status=str(status))
    assert [(o["name"], o["version"], o["loaded"]) for o in owners] == [
        ("libnccl-dev", "2.28.3-1+cuda13.0", [loaded]),
        ("libnccl2", "2.28.3-1+cuda13.0", [loaded]),
    ]


def test_payload_maps_match_only_nccl_itself():
    assert payload.NCCL_FILE.search("libnccl.so.2.28.3") and payload.NCCL_FILE.search("libnccl.so")
    assert not payload.NCCL_FILE.search("libnccl-net.so") and not payload.NCCL_FILE.search("libnccl_static.a")


@pytest.mark.parametrize("name", ["device_mod_nccl_library_only", "device_mod_nccl_test_library"])
def test_module_on_the_h200_reported_what_the_payload_recording_says(name):
    """nccl_test itself on the H200 (host mode): the library only, and beside a one-rank test."""
    result = json.loads(fixture_text("device_modules", name + ".json"))
    assert result["library"]["line"] == library("default")["line"]
    assert result["skipped"] == (name == "device_mod_nccl_library_only")
    if not result["skipped"]:
        # NCCL's own log line in the same run agrees with the library read before it.
        assert result["transport"]["nccl_version"].split("+")[0] == result["library"]["version"]


def test_lab_module_result_gives_the_lab_summary_line():
    """nccl_test on both lab nodes (run_test false), as the lab returned it: the summary line the lab prints."""
    results = json.loads(fixture_text("nccl_library", "lab_module.json"))
    assert all(r["library"] == library("lab_runtime") for r in results.values())
    assert nl.summary_line(sorted((node, r["library"]) for node, r in results.items())) == (
        "not available on spark-1, spark-2 (torch 2.13.0+cpu is a CPU build; no libnccl.so.2 can be loaded: "
        "libnccl.so.2: cannot open shared object file: No such file or directory)"
    )
