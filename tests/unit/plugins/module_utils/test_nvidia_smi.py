"""Parsing of recorded nvidia-smi output (H200 real, GB10 built from documentation)."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.vllm.plugins.module_utils import _nvidia_smi as smi
from module_runner import fixture_text

FIELDS = smi.GPU_FIELDS + smi.OPTIONAL_GPU_FIELDS


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        (" 345 ", "345"),
        ("[N/A]", None),
        ("N/A", None),
        ("[Not Supported]", None),
        ("Not Supported", None),
        ("[Unknown Error]", None),
        ("", None),
        ("Enabled", "Enabled"),
    ],
)
def test_clean(cell, value):
    assert smi.clean(cell) == value


def test_parse_recorded_h200():
    rows = smi.parse_csv(fixture_text("nvidia_smi", "h200-x2", "gpus.out"), FIELDS)
    records = [smi.gpu_record(r) for r in rows]
    assert [r["index"] for r in records] == [0, 1]
    assert records[1]["pci_bus_id"] == "00000000:00:07.0"
    assert records[0]["clocks_mem"] == 3201 and records[0]["memory_used"] == 0
    assert records[0]["unified_memory"] is False


def test_parse_gb10_built():
    record = smi.gpu_record(smi.parse_csv(fixture_text("nvidia_smi", "gb10", "gpus.out"), FIELDS)[0])
    assert record["memory_total"] is None and record["clocks_max_mem"] is None
    assert record["addressing_mode"] == "ATS" and record["unified_memory"] is True


def test_ats_alone_means_unified():
    row = dict.fromkeys(FIELDS, "1")
    row.update(persistence_mode="Disabled", addressing_mode="ATS")
    assert smi.gpu_record(row)["unified_memory"] is True
    row["addressing_mode"] = "HMM"
    assert smi.gpu_record(row)["unified_memory"] is False


def test_field_count_mismatch_raises():
    with pytest.raises(smi.NvidiaSmiError, match="expected 3 fields, got 2"):
        smi.parse_csv("0, GPU-x\n", ("index", "uuid", "name"))


def test_version_recorded():
    found = smi.parse_version(fixture_text("nvidia_smi", "h200-x2", "version.out"))
    assert found == {"driver_version": "580.159.04", "cuda_version": "13.0", "nvml_version": "580.159"}


def test_version_missing():
    assert smi.parse_version("garbage") == {"driver_version": None, "cuda_version": None, "nvml_version": None}


def test_supported_graphics_recorded():
    clocks = smi.parse_supported_graphics(fixture_text("nvidia_smi", "h200-x2", "supported_clocks.out"))
    assert sorted(clocks) == ["GPU-2e17cee8-ebf5-aec9-655a-92ed47ab3aca", "GPU-60367d48-cdd7-fc60-0415-36e532f1397c"]
    values = clocks["GPU-60367d48-cdd7-fc60-0415-36e532f1397c"]
    assert values[-1] == 1980 and values[0] < 400 and values == sorted(set(values))


def test_render_unit_nothing_to_do():
    gpus = [dict(uuid="GPU-a", persistence_mode=False, locked_clocks=None)]
    assert smi.render_unit("/usr/bin/nvidia-smi", gpus, "/m") is None


def test_render_unit_persistence_only_has_no_marker():
    unit = smi.render_unit("/usr/bin/nvidia-smi", [dict(uuid="GPU-a", persistence_mode=True, locked_clocks=None)], "/m")
    assert "ExecStart=/usr/bin/nvidia-smi -i GPU-a -pm 1" in unit and "ExecStartPost" not in unit
    assert "WantedBy=multi-user.target" in unit and "Type=oneshot" in unit


def test_render_unit_lock_renews_marker():
    gpus = [dict(uuid="GPU-a", persistence_mode=False, locked_clocks=dict(min_mhz=900, max_mhz=1200))]
    unit = smi.render_unit("/usr/bin/nvidia-smi", gpus, "/var/lib/x.boot")
    assert "-i GPU-a -lgc 900,1200" in unit and "> /var/lib/x.boot'" in unit and "-pm" not in unit


class _Module:
    def __init__(self, replies):
        self.replies = replies
        self.calls = []

    def get_bin_path(self, name, required=False):
        return "/usr/bin/" + name

    def run_command(self, args, environ_update=None):
        self.calls.append((args, environ_update))
        return self.replies.pop(0)


def test_runner_uses_c_locale_and_list_args():
    module = _Module([(0, fixture_text("nvidia_smi", "h200-x2", "version.out"), "")])
    runner = smi.NvidiaSmi(module)
    assert runner.versions()["cuda_version"] == "13.0"
    args, env = module.calls[0]
    assert args == ["/usr/bin/nvidia-smi", "--version"] and env == {"LC_ALL": "C"}


def test_runner_commands_and_errors():
    module = _Module([(0, "", ""), (0, "", ""), (0, "", ""), (4, "", "Insufficient Permissions\n")])
    runner = smi.NvidiaSmi(module, "/opt/nvidia-smi")
    runner.set_persistence(1, True)
    runner.lock_graphics_clocks(0, 1000, 1980)
    runner.reset_graphics_clocks(0)
    with pytest.raises(smi.NvidiaSmiError, match="exited 4: Insufficient Permissions"):
        runner.set_persistence(0, False)
    assert [c[0][1:] for c in module.calls] == [
        ["-i", "1", "-pm", "1"],
        ["-i", "0", "-lgc", "1000,1980"],
        ["-i", "0", "-rgc"],
        ["-i", "0", "-pm", "0"],
    ]


def test_supported_clocks_not_supported_is_empty():
    assert smi.NvidiaSmi(_Module([(2, "Not Supported\n", "")])).supported_graphics_clocks() == {}


def test_query_one_gpu_and_bad_field_retry():
    bad = fixture_text("nvidia_smi", "h200-x2", "gpus_bad_field.out")
    rows = fixture_text("nvidia_smi", "h200-x2", "gpus.out").splitlines()[1].rsplit(", ", 1)[0] + "\n"
    module = _Module([(2, bad, ""), (0, rows, "")])
    gpus = smi.NvidiaSmi(module).query_gpus(index=1)
    assert module.calls[0][0][1:3] == ["-i", "1"] and gpus[0]["index"] == 1
    assert "addressing_mode" not in module.calls[1][0][3]


def test_query_bad_field_without_optional_fields_raises():
    bad = fixture_text("nvidia_smi", "h200-x2", "gpus_bad_field.out")
    module = _Module([(2, bad, ""), (2, bad, "")])
    with pytest.raises(smi.NvidiaSmiError, match="is not a valid field"):
        smi.NvidiaSmi(module).query_gpus()
