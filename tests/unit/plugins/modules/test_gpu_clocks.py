"""gpu_clocks: every decision path, on recorded nvidia-smi output and files in tmp_path."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from _gpu_fakes import FakeSmi
from ansible_collections.dgx_spark.vllm.plugins.modules import gpu_clocks
from module_runner import run_module

UUID0 = "GPU-60367d48-cdd7-fc60-0415-36e532f1397c"


@pytest.fixture
def node(monkeypatch, tmp_path):
    boot = {"id": "boot-1"}
    monkeypatch.setattr(gpu_clocks, "read_boot_id", lambda: boot["id"])
    monkeypatch.setattr(gpu_clocks, "systemd_running", lambda: False)
    paths = dict(
        unit_path=str(tmp_path / "systemd" / "dgx-spark-gpu-clocks.service"),
        state_file=str(tmp_path / "state" / "gpu-clocks.json"),
    )
    return boot, paths, tmp_path


def lock(paths, **extra):
    args = dict(paths, clocks="locked", min_mhz=1000, max_mhz=1980)
    args.update(extra)
    return {k: v for k, v in args.items() if v is not None}


def wants(paths):
    return os.path.join(os.path.dirname(paths["unit_path"]), "multi-user.target.wants", "dgx-spark-gpu-clocks.service")


def test_check_mode_reports_and_changes_nothing(monkeypatch, node):
    _boot, paths, tmp = node
    smi = FakeSmi().install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, _ansible_check_mode=True, _ansible_diff=True))
    assert not failed and result["changed"]
    assert result["commands"] == ["nvidia-smi -i 0 -lgc 1000,1980", "nvidia-smi -i 1 -lgc 1000,1980"]
    assert smi.changes() == []
    assert list(tmp.iterdir()) == []
    assert result["diff"]["before"]["gpus"][0]["locked_clocks"] is None
    assert result["diff"]["after"]["gpus"][0]["locked_clocks"] == {"min_mhz": 1000, "max_mhz": 1980}
    assert "-lgc 1000,1980" in result["diff"]["after"]["unit"] and result["diff"]["before"]["unit"] == ""


def test_lock_writes_unit_and_record_then_is_idempotent(monkeypatch, node):
    _boot, paths, _tmp = node
    smi = FakeSmi().install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, persistence_mode=True))
    assert not failed and result["changed"]
    assert [c[1:] for c in smi.changes()] == [["-i", "0", "-lgc", "1000,1980"], ["-i", "1", "-lgc", "1000,1980"]]
    unit = pathlib.Path(paths["unit_path"]).read_text(encoding="utf-8")
    assert "ExecStart=/usr/bin/nvidia-smi -i %s -pm 1" % UUID0 in unit
    assert "ExecStart=/usr/bin/nvidia-smi -i %s -lgc 1000,1980" % UUID0 in unit
    assert os.readlink(wants(paths)) == paths["unit_path"]
    record = json.loads(pathlib.Path(paths["state_file"]).read_text(encoding="utf-8"))
    assert record["gpus"][UUID0] == {"min_mhz": 1000, "max_mhz": 1980}
    assert pathlib.Path(paths["state_file"] + ".boot").read_text(encoding="utf-8").strip() == "boot-1"
    assert result["unit_present"] and result["unit_enabled"] and not result["systemd_running"]

    smi.calls.clear()
    failed, again = run_module(monkeypatch, gpu_clocks, lock(paths, persistence_mode=True))
    assert not failed and not again["changed"] and again["commands"] == [] and smi.changes() == []


def test_reboot_forgets_the_lock(monkeypatch, node):
    boot, paths, _tmp = node
    smi = FakeSmi().install(monkeypatch)
    run_module(monkeypatch, gpu_clocks, lock(paths))
    boot["id"] = "boot-2"
    smi.calls.clear()
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths))
    assert not failed and result["changed"]
    assert len(smi.changes()) == 2


def test_persistence_on_is_read_back(monkeypatch, node):
    _boot, paths, _tmp = node
    smi = FakeSmi("gb10").install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, dict(paths, persistence_mode=True))
    assert not failed and result["changed"]
    assert smi.changes()[0][1:] == ["-i", "0", "-pm", "1"]
    assert result["gpus"][0]["persistence_mode"] is True
    assert "-pm 1" in pathlib.Path(paths["unit_path"]).read_text(encoding="utf-8")


def test_read_back_differs_fails(monkeypatch, node):
    _boot, paths, _tmp = node
    smi = FakeSmi("gb10").install(monkeypatch)
    smi.ignore_pm = True
    failed, result = run_module(monkeypatch, gpu_clocks, dict(paths, persistence_mode=True))
    assert failed and "read back after acting differs" in result["msg"]


def test_reset_removes_lock_and_unit(monkeypatch, node):
    _boot, paths, _tmp = node
    smi = FakeSmi().install(monkeypatch)
    run_module(monkeypatch, gpu_clocks, lock(paths))
    smi.calls.clear()
    failed, result = run_module(monkeypatch, gpu_clocks, dict(paths, clocks="reset", _ansible_diff=True))
    assert not failed and result["changed"]
    assert [c[-1] for c in smi.changes()] == ["-rgc", "-rgc"]
    assert not os.path.exists(paths["unit_path"]) and not os.path.lexists(wants(paths))
    assert result["diff"]["after"]["unit"] == "" and all(g["locked_clocks"] is None for g in result["gpus"])
    smi.calls.clear()
    failed, again = run_module(monkeypatch, gpu_clocks, dict(paths, clocks="reset"))
    assert not failed and not again["changed"] and smi.changes() == []


def test_persist_false_removes_the_unit(monkeypatch, node):
    _boot, paths, _tmp = node
    FakeSmi().install(monkeypatch)
    run_module(monkeypatch, gpu_clocks, lock(paths))
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, persist=False))
    assert not failed and result["changed"] and not result["unit_present"]
    assert not os.path.exists(paths["unit_path"])


def test_systemd_reload_when_systemd_runs(monkeypatch, node):
    _boot, paths, _tmp = node
    monkeypatch.setattr(gpu_clocks, "systemd_running", lambda: True)
    smi = FakeSmi().install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths))
    assert not failed and result["systemd_running"]
    assert ["/usr/bin/systemctl", "daemon-reload"] in smi.calls


def test_one_gpu_selected(monkeypatch, node):
    _boot, paths, _tmp = node
    smi = FakeSmi().install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, gpus=[1]))
    assert not failed and [g["index"] for g in result["gpus"]] == [1]
    assert [c[1:3] for c in smi.changes()] == [["-i", "1"]]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (dict(min_mhz=1980, max_mhz=1000), "min_mhz (1980) is greater than max_mhz (1000)"),
        (dict(gpus=[7]), "gpus: no GPU with index 7"),
        (dict(max_mhz=3000), "max_mhz (3000) is above the highest graphics clock GPU 0 supports (1980 MHz)"),
        (dict(min_mhz=100), "min_mhz (100) is below the lowest graphics clock GPU 0 supports"),
        (dict(min_mhz=0), "min_mhz must be a positive clock"),
        (dict(max_mhz=None), "missing: max_mhz"),
    ],
)
def test_bad_input_changes_nothing(monkeypatch, node, extra, words):
    _boot, paths, tmp = node
    smi = FakeSmi().install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, **extra))
    assert failed and words in result["msg"]
    assert smi.changes() == [] and list(tmp.iterdir()) == []


def test_ceiling_from_max_clock_when_supported_list_missing(monkeypatch, node):
    _boot, paths, _tmp = node
    FakeSmi("gb10").install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, max_mhz=2500))
    assert failed and "above the highest graphics clock GPU 0 supports (1980 MHz)" in result["msg"]
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths, min_mhz=100))
    assert not failed and result["changed"]


def test_nvidia_smi_refuses(monkeypatch, node):
    _boot, paths, tmp = node
    smi = FakeSmi().install(monkeypatch)
    smi.answers["-lgc"] = (4, "Unable to set locked GPU clocks: Insufficient Permissions\n", "")
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths))
    assert failed and result["msg"].startswith("GPU 0: nvidia-smi -i 0 -lgc 1000,1980 exited 4")
    assert "Insufficient Permissions" in result["msg"] and list(tmp.iterdir()) == []


@pytest.mark.parametrize(("present", "words"), [(False, "not installed"), (True, "lists no GPU")])
def test_no_gpu_fails(monkeypatch, node, present, words):
    _boot, paths, _tmp = node
    smi = FakeSmi().install(monkeypatch, present=present)
    smi.answers["--query-gpu"] = (6, "No devices were found\n", "")
    failed, result = run_module(monkeypatch, gpu_clocks, dict(paths, persistence_mode=True))
    assert failed and words in result["msg"]


def test_corrupt_record_is_ignored(monkeypatch, node):
    _boot, paths, _tmp = node
    FakeSmi().install(monkeypatch)
    os.makedirs(os.path.dirname(paths["state_file"]))
    pathlib.Path(paths["state_file"]).write_text(encoding="utf-8", data="{not json")
    pathlib.Path(paths["state_file"] + ".boot").write_text(encoding="utf-8", data="boot-1\n")
    failed, result = run_module(monkeypatch, gpu_clocks, lock(paths))
    assert not failed and result["changed"]
    assert json.loads(pathlib.Path(paths["state_file"]).read_text(encoding="utf-8"))["gpus"][UUID0]["max_mhz"] == 1980


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        (dict(max_mhz=3000), {"bad_param": "max_mhz", "limit": 1980, "gpu": 0}),
        (dict(gpus=[7]), {"bad_param": "gpus"}),
    ],
)
def test_refusal_names_the_parameter_for_the_role(monkeypatch, node, extra, fields):
    # The gpu role words the refusal in its own variables (gpu_clocks_max_mhz) from these fields.
    _boot, paths, _tmp = node
    FakeSmi().install(monkeypatch)
    args = dict(lock(paths, **extra), _ansible_check_mode=True)
    failed, result = run_module(monkeypatch, gpu_clocks, args)
    assert failed
    assert {key: result[key] for key in fields} == fields
