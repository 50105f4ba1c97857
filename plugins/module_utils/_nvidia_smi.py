# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run and parse nvidia-smi for the GPU modules (private).

Only the CSV query interface and ``--version`` are parsed: the human tables change between
drivers. GB10 (DGX Spark) has unified memory, so memory fields read ``[N/A]`` there; every
value that nvidia-smi cannot report becomes None instead of an error.
"""

from __future__ import annotations

import re

# Always present in drivers this collection supports (checked on 580.159.04).
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "pstate",
    "clocks.gr",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.gr",
    "clocks.max.mem",
    "memory.total",
    "memory.used",
    "compute_cap",
)
# Newer fields; dropped and retried when an older driver rejects them.
OPTIONAL_GPU_FIELDS = ("addressing_mode",)

INT_FIELDS = frozenset(
    ("index", "clocks.gr", "clocks.sm", "clocks.mem", "clocks.max.gr", "clocks.max.mem", "memory.total", "memory.used")
)
# nvidia-smi spells "cannot report this" several ways; brackets appear with nounits.
_MISSING = re.compile(
    r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|Requested functionality.*)\]?$", re.I
)
NO_DEVICES = "No devices were found"
# nvidia-smi exits 6 when -i names no GPU or the node has none, 9 when the driver is not loaded.
RC_NOT_FOUND = 6


class NvidiaSmiError(Exception):
    """nvidia-smi ran but did not answer; the message says what it printed."""


def clean(value):
    """One CSV cell: stripped string, or None when nvidia-smi cannot report it."""
    value = value.strip()
    if not value or _MISSING.match(value):
        return None
    return value


def to_int(value):
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_csv(text, fields):
    """Rows of ``--format=csv,noheader,nounits`` output as dicts keyed by field name."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [clean(cell) for cell in line.split(",")]
        if len(cells) != len(fields):
            raise NvidiaSmiError("expected %d fields, got %d in %r" % (len(fields), len(cells), line))
        rows.append(dict(zip(fields, cells)))
    return rows


def gpu_record(row):
    """Normalise one --query-gpu row into the facts the modules return."""
    out = {}
    for field, value in row.items():
        key = field.replace(".", "_")
        out[key] = to_int(value) if field in INT_FIELDS else value
    persistence = row.get("persistence_mode")
    out["persistence_mode"] = None if persistence is None else persistence.lower() == "enabled"
    # Unified memory (GB10): no framebuffer to report, or the GPU shares the CPU's page tables.
    out["unified_memory"] = out.get("memory_total") is None or (row.get("addressing_mode") or "").upper() == "ATS"
    out.setdefault("addressing_mode", None)
    return out


def parse_version(text):
    """``nvidia-smi --version`` (or the summary table header) into driver/CUDA/NVML versions."""
    found = {}
    for key, pattern in (
        ("driver_version", r"DRIVER version\s*:\s*(\S+)|Driver Version:\s*(\S+)"),
        ("cuda_version", r"CUDA Version\s*:\s*(\S+)"),
        ("nvml_version", r"NVML version\s*:\s*(\S+)"),
    ):
        match = re.search(pattern, text, re.I)
        found[key] = next((g for g in match.groups() if g), None) if match else None
    return found


def parse_supported_graphics(text):
    """``--query-supported-clocks=gpu_uuid,memory,graphics`` into {uuid: sorted graphics MHz}."""
    clocks = {}
    for row in parse_csv(text, ("gpu_uuid", "memory", "graphics")):
        mhz = to_int(row["graphics"])
        if row["gpu_uuid"] and mhz is not None:
            clocks.setdefault(row["gpu_uuid"], set()).add(mhz)
    return {uuid: sorted(values) for uuid, values in clocks.items()}


class NvidiaSmi:
    """The node's nvidia-smi, run with the C locale and a list of arguments."""

    def __init__(self, module, executable=None):
        self.module = module
        self.path = executable or module.get_bin_path("nvidia-smi", required=False)

    @property
    def present(self):
        return bool(self.path)

    def run(self, args, check=True):
        rc, out, err = self.module.run_command([self.path, *args], environ_update={"LC_ALL": "C"})
        if check and rc != 0:
            raise NvidiaSmiError(
                "nvidia-smi %s exited %d: %s" % (" ".join(args), rc, (err or out).strip() or "no output")
            )
        return rc, out, err

    def query_gpus(self, index=None):
        """Every GPU (or one) as a dict; [] when the node has none."""
        fields = GPU_FIELDS + OPTIONAL_GPU_FIELDS
        selector = ["-i", str(index)] if index is not None else []
        while True:
            rc, out, err = self.run(
                [*selector, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"], False
            )
            text = (out + err).strip()
            if rc == 0:
                return [gpu_record(row) for row in parse_csv(out, fields)]
            if NO_DEVICES in text or rc == RC_NOT_FOUND:
                return []
            if "is not a valid field" in text and fields != GPU_FIELDS:
                fields = GPU_FIELDS
                continue
            raise NvidiaSmiError("nvidia-smi --query-gpu exited %d: %s" % (rc, text or "no output"))

    def versions(self):
        rc, out, _err = self.run(["--version"], check=False)
        found = parse_version(out) if rc == 0 else {}
        if not found.get("cuda_version"):
            # Older drivers lack --version: the summary header names both.
            _rc, table, _err = self.run([], check=False)
            found = parse_version(table)
        return found

    def supported_graphics_clocks(self):
        rc, out, _err = self.run(
            ["--query-supported-clocks=gpu_uuid,memory,graphics", "--format=csv,noheader,nounits"], check=False
        )
        if rc != 0:
            return {}
        return parse_supported_graphics(out)

    def set_persistence(self, index, enabled):
        return self.run(["-i", str(index), "-pm", "1" if enabled else "0"])

    def lock_graphics_clocks(self, index, min_mhz, max_mhz):
        return self.run(["-i", str(index), "-lgc", "%d,%d" % (min_mhz, max_mhz)])

    def reset_graphics_clocks(self, index):
        return self.run(["-i", str(index), "-rgc"])


# --- State the driver forgets at reboot (used by gpu_clocks) -------------------------------
# nvidia-smi cannot report a locked clock range (checked on 580.159.04: no query field, nothing
# in -q), so gpu_clocks keeps a record of what it applied, valid for one boot only.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def read_boot_id():
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def render_unit(smi_path, gpus, marker_path):
    """A oneshot unit that reapplies persistence mode and locked clocks at boot, or None if nothing to do.

    gpus: [{"uuid", "persistence_mode", "locked_clocks": {"min_mhz", "max_mhz"} or None}].
    """
    commands = []
    for gpu in gpus:
        if gpu["persistence_mode"]:
            commands.append("ExecStart=%s -i %s -pm 1" % (smi_path, gpu["uuid"]))
        if gpu["locked_clocks"]:
            commands.append(
                "ExecStart=%s -i %s -lgc %d,%d"
                % (smi_path, gpu["uuid"], gpu["locked_clocks"]["min_mhz"], gpu["locked_clocks"]["max_mhz"])
            )
    if not commands:
        return None
    if any(gpu["locked_clocks"] for gpu in gpus):
        # Tells gpu_clocks that the recorded lock was applied again in this boot.
        commands.append("ExecStartPost=/bin/sh -c 'cat %s > %s'" % (BOOT_ID_PATH, marker_path))
    return "\n".join(
        [
            "# Managed by dgx_spark.vllm.gpu_clocks; edits are overwritten.",
            "# The driver forgets persistence mode and locked clocks at reboot: this reapplies them.",
            "[Unit]",
            "Description=dgx_spark.vllm GPU persistence mode and locked graphics clocks",
            "After=nvidia-persistenced.service",
            "ConditionPathExists=%s" % smi_path,
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            *commands,
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )
