# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN for nvidia-smi in the lab: there is no GPU here.

Answers the subset of nvidia-smi that dgx_spark.vllm calls, in the format of real output recorded
on an NVIDIA driver 580.159.04 (recordings/h200-x2/), presenting one GB10 per node as a DGX Spark
does (gb10.json; README.md says where each value comes from). Persistence mode and the locked
graphics clock range are kept in a JSON file: $NVIDIA_SMI_SIM_STATE, default
/var/lib/nvidia-smi-sim/state.json. Standard library only.
"""

import json
import os
import socket
import sys
import uuid

HERE = os.path.dirname(os.path.realpath(__file__))
STATE = os.environ.get("NVIDIA_SMI_SIM_STATE", "/var/lib/nvidia-smi-sim/state.json")
RECORDED = os.path.join(HERE, "recordings", "h200-x2")
# Real exit codes: 2 invalid argument, 4 insufficient permissions, 6 not found.
RC_ARG, RC_PERM, RC_NOT_FOUND = 2, 4, 6


def load(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as handle:
        return json.load(handle)


def gpus():
    profile = load("gb10.json")
    host = os.environ.get("NVIDIA_SMI_SIM_HOST") or socket.gethostname()
    out = []
    for index in range(int(profile.get("count", 1))):
        gpu = dict(profile["fields"])
        gpu["index"] = str(index)
        # A stable UUID per node and index, so the two lab nodes differ as real GPUs do.
        gpu["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "%s/%d" % (host, index)))
        out.append(gpu)
    return profile, out


def read_state():
    try:
        with open(STATE, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"persistence": {}, "locked": {}}


def write_state(state):
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    tmp = STATE + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
    os.replace(tmp, STATE)


def live(gpu, profile, state):
    """Fields that depend on the simulated state."""
    gpu = dict(gpu)
    on = state["persistence"].get(gpu["uuid"], profile.get("persistence_default", False))
    gpu["persistence_mode"] = "Enabled" if on else "Disabled"
    lock = state["locked"].get(gpu["uuid"])
    if lock:
        # An idle GPU with a locked range runs at the range's floor.
        gpu["clocks.gr"] = gpu["clocks.sm"] = str(lock[0])
    return gpu


def select(all_gpus, ident):
    if ident is None:
        return all_gpus
    return [g for g in all_gpus if ident in (g["index"], g["uuid"], g["pci.bus_id"])]


def fail(message, rc):
    sys.stdout.write(message + "\n")
    sys.exit(rc)


def query_gpu(chosen, fields, fmt, profile, state):
    flags = fmt.split(",")
    if "csv" not in flags:
        fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", RC_ARG)
    rows = []
    if "noheader" not in flags:
        rows.append(", ".join(profile["headers"].get(f, f) for f in fields))
    for plain in chosen:
        gpu = live(plain, profile, state)
        cells = []
        for f in fields:
            value = gpu[f]
            unit = profile["units"].get(f)
            if "nounits" not in flags and unit and not value.startswith("["):
                value = "%s %s" % (value, unit)
            cells.append(value)
        rows.append(", ".join(cells))
    sys.stdout.write("\n".join(rows) + "\n")


def supported_clocks(chosen):
    # The recorded list of one real GPU, shown for each simulated GPU (see README.md).
    with open(os.path.join(RECORDED, "supported_clocks.out"), encoding="utf-8") as handle:
        lines = [line.split(", ", 1)[1] for line in handle.read().splitlines() if line]
    for gpu in chosen:
        for line in lines:
            sys.stdout.write("%s, %s\n" % (gpu["uuid"], line))


def change(chosen, what, value, state):
    if os.geteuid() != 0:
        bus = chosen[0]["pci.bus_id"]
        fail(
            "Unable to set %s for GPU %s: Insufficient Permissions\nTerminating early due to previous errors."
            % (what, bus),
            RC_PERM,
        )
    for gpu in chosen:
        bus = gpu["pci.bus_id"]
        if what == "persistence mode":
            state["persistence"][gpu["uuid"]] = value
            sys.stdout.write("%s persistence mode for GPU %s.\n" % ("Enabled" if value else "Disabled", bus))
        elif value is None:
            state["locked"].pop(gpu["uuid"], None)
        else:
            state["locked"][gpu["uuid"]] = list(value)
            sys.stdout.write(
                'GPU clocks set to "(gpuClkMin %d, gpuClkMax %d)" for GPU %s\n' % (value[0], value[1], bus)
            )
    write_state(state)
    sys.stdout.write("All done.\n")


def parse(argv):
    opts = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if "=" in arg and arg.startswith("--"):
            key, value = arg.split("=", 1)
            opts[key] = value
        elif arg in ("-i", "--id", "-pm", "-lgc", "--lock-gpu-clocks", "--persistence-mode", "-f"):
            if i + 1 >= len(argv):
                fail("Option %s requires an argument." % arg, RC_ARG)
            opts[arg] = argv[i + 1]
            i += 1
        else:
            opts[arg] = True
        i += 1
    return opts


def main(argv):
    profile, all_gpus = gpus()
    opts = parse(argv)
    state = read_state()
    ident = opts.get("-i", opts.get("--id"))
    chosen = select(all_gpus, ident)
    if "--version" in opts:
        with open(os.path.join(RECORDED, "version.out"), encoding="utf-8") as handle:
            text = handle.read()
        for real, sim in profile["version_replace"].items():
            text = text.replace(real, sim)
        sys.stdout.write(text)
        return 0
    if not chosen:
        fail("No devices were found", RC_NOT_FOUND)
    if "-L" in opts or "--list-gpus" in opts:
        for gpu in chosen:
            sys.stdout.write("GPU %s: %s (UUID: %s)\n" % (gpu["index"], gpu["name"], gpu["uuid"]))
        return 0
    if "--query-gpu" in opts:
        fields = [f.strip() for f in opts["--query-gpu"].split(",") if f.strip()]
        fields = [profile["aliases"].get(f, f) for f in fields]
        for f in fields:
            if f not in chosen[0]:
                fail('Field "%s" is not a valid field to query.' % f, RC_ARG)
        query_gpu(chosen, fields, opts.get("--format", ""), profile, state)
        return 0
    if "--query-supported-clocks" in opts:
        supported_clocks(chosen)
        return 0
    pm = opts.get("-pm", opts.get("--persistence-mode"))
    if pm is not None:
        if pm not in ("0", "1", "ENABLED", "DISABLED"):
            fail('Invalid value "%s" for persistence mode.' % pm, RC_ARG)
        change(chosen, "persistence mode", pm in ("1", "ENABLED"), state)
        return 0
    lgc = opts.get("-lgc", opts.get("--lock-gpu-clocks"))
    if lgc is not None:
        parts = lgc.split(",")
        try:
            low, high = int(parts[0]), int(parts[-1])
        except ValueError:
            fail("Invalid clock value: %s" % lgc, RC_ARG)
        if low > high:
            fail("Invalid clock range: min %d is greater than max %d" % (low, high), RC_ARG)
        change(chosen, "locked GPU clocks", (low, high), state)
        return 0
    if "-rgc" in opts or "--reset-gpu-clocks" in opts:
        change(chosen, "locked GPU clocks", None, state)
        return 0
    fail(
        "nvidia-smi simulator (dgx_spark.vllm lab stand-in): %s is not simulated. See %s/README.md"
        % (" ".join(argv) or "the summary table", HERE),
        RC_ARG,
    )
    return RC_ARG


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
