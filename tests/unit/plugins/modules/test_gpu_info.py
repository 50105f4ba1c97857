"""gpu_info on recorded nvidia-smi output (H200 real, GB10 built from documentation)."""

from __future__ import annotations

from _gpu_fakes import FakeSmi
from ansible_collections.dgx_spark.vllm.plugins.modules import gpu_info
from module_runner import fixture_text, run_module


def test_two_h200_recorded(monkeypatch):
    FakeSmi("h200-x2").install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed and not result["changed"]
    assert result["gpu_count"] == 2
    assert result["driver_version"] == "580.159.04" and result["cuda_version"] == "13.0"
    first = result["gpus"][0]
    assert first["uuid"] == "GPU-60367d48-cdd7-fc60-0415-36e532f1397c"
    assert first["name"] == "NVIDIA H200" and first["index"] == 0
    assert first["persistence_mode"] is True
    assert first["clocks_max_gr"] == 1980 and first["memory_total"] == 143771
    assert result["unified_memory"] is False and first["addressing_mode"] == "None"


def test_gb10_unified_memory_is_null_not_zero(monkeypatch):
    FakeSmi("gb10").install(monkeypatch)
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed
    gpu = result["gpus"][0]
    assert gpu["name"] == "NVIDIA GB10" and gpu["compute_cap"] == "12.1"
    assert gpu["memory_total"] is None and gpu["memory_used"] is None and gpu["clocks_mem"] is None
    assert gpu["unified_memory"] is True and result["unified_memory"] is True
    assert gpu["persistence_mode"] is False


def test_no_nvidia_smi_is_an_answer(monkeypatch):
    smi = FakeSmi().install(monkeypatch, present=False)
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed
    assert result["gpu_count"] == 0 and result["gpus"] == []
    assert "not installed" in result["reason"] and result["nvidia_smi"] is None
    assert smi.calls == []


def test_no_devices_recorded(monkeypatch):
    smi = FakeSmi().install(monkeypatch)
    smi.answers["--query-gpu"] = (6, fixture_text("nvidia_smi", "h200-x2", "gpus_bad_index.out"), "")
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed and result["gpu_count"] == 0
    assert result["reason"] == "nvidia-smi lists no GPU on this node"


def test_driver_not_loaded(monkeypatch):
    smi = FakeSmi().install(monkeypatch)
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    smi.answers["--query-gpu"] = (9, message, "")
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed and result["gpu_count"] == 0
    assert result["reason"].startswith("the NVIDIA driver is not loaded")


def test_unexpected_error_fails_with_output(monkeypatch):
    smi = FakeSmi().install(monkeypatch)
    smi.answers["--query-gpu"] = (15, "", "Unknown Error\n")
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert failed and "exited 15" in result["msg"] and "Unknown Error" in result["msg"]


def test_older_driver_without_addressing_mode(monkeypatch):
    smi = FakeSmi().install(monkeypatch)
    bad_field = fixture_text("nvidia_smi", "h200-x2", "gpus_bad_field.out").replace("no_such_field", "addressing_mode")
    original = smi.answer

    def answer(args, **kwargs):
        if any(a.startswith("--query-gpu=") and a.endswith(",addressing_mode") for a in args):
            smi.calls.append(list(args))
            return 2, bad_field, ""
        return original(args, **kwargs)

    smi.answer = answer
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed and result["gpu_count"] == 2
    assert result["gpus"][0]["addressing_mode"] is None
    assert sum(1 for c in smi.calls if c[1].startswith("--query-gpu=")) == 2


def test_cuda_version_from_table_when_version_flag_is_missing(monkeypatch):
    smi = FakeSmi().install(monkeypatch)
    smi.answers["--version"] = (2, "Invalid combination of input arguments.\n", "")
    header = "| NVIDIA-SMI 535.86.05   Driver Version: 535.86.05    CUDA Version: 12.2     |\n"
    original = smi.answer
    smi.answer = lambda args, **kw: (0, header, "") if args[1:] == [] else original(args, **kw)
    failed, result = run_module(monkeypatch, gpu_info, {})
    assert not failed and result["cuda_version"] == "12.2" and result["driver_version"] == "535.86.05"
