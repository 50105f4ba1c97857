# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bounded NCCL collective test: launch line, result parsing, bandwidth and verdict (private).

Bandwidths follow nccl-tests (doc/PERFORMANCE.md there): algbw = size / time, with size the
per-rank buffer for all-reduce and the gathered output for all-gather, and
busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for all-gather (n ranks), so that
busbw is comparable with the link's speed whatever the rank count.
"""

from __future__ import annotations

import json
import re

from ansible_collections.dgx_spark.vllm.plugins.module_utils._nccl_payload import MAX_BYTES, RESULT_MARKER

PAYLOAD_NAME = "dgx_spark_nccl_payload.py"
OPS = ("all_reduce", "all_gather")
# NVIDIA's gate for two DGX Sparks over one 200G CX-7 port (both twins): 175 Gb/s.
DEFAULT_THRESHOLD_GBPS = 21.875
DEFAULT_SIZES = (8 << 20, 64 << 20, 256 << 20)

_VIA = re.compile(r"\bvia (\S+)")
_NETWORK = re.compile(r"Using network (\S+)")
_IB_USING = re.compile(r"NET/IB ?: Using (.*?)(?:;|$)")
_SOCK_USING = re.compile(r"NET/Socket ?: Using (.*)$")
_DEVICE = re.compile(r"\[\d+\]([^\s:\[]+)")
_VERSION = re.compile(r"NCCL version (\S+)")
_NNODES = re.compile(r"nNodes (\d+)")


def bus_factor(op, ranks):
    if ranks < 1:
        raise ValueError("ranks must be at least 1")
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op == "all_gather":
        return float(ranks - 1) / ranks
    raise ValueError("unknown collective %r" % op)


def bandwidth(row, ranks):
    """Add algbw/busbw in GB/s (10^9 bytes, as nccl-tests) to one payload result row."""
    out = dict(row)
    algbw = row["bytes"] / row["seconds"] / 1e9 if row["seconds"] > 0 else 0.0
    out["algbw_gbps"] = round(algbw, 3)
    out["busbw_gbps"] = round(algbw * bus_factor(row["op"], ranks), 3)
    return out


def parse_payload_output(text):
    """The payload's JSON line (the last one printed), or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(RESULT_MARKER):
            found = json.loads(line[len(RESULT_MARKER) :])
    return found


def _device_names(listing):
    return sorted(set(_DEVICE.findall(listing)))


def parse_transport(log):
    """What NCCL chose, from its NCCL_DEBUG=INFO lines."""
    vias, networks, ib, sockets, nnodes = set(), set(), set(), set(), set()
    version = None
    for line in log.splitlines():
        if "NCCL INFO" not in line:
            continue
        for via in _VIA.findall(line):
            vias.add(via)
        for regex, bucket in ((_NETWORK, networks), (_NNODES, nnodes)):
            match = regex.search(line)
            if match:
                bucket.add(match.group(1))
        match = _IB_USING.search(line)
        if match:
            ib.update(_device_names(match.group(1)))
        match = _SOCK_USING.search(line)
        if match:
            sockets.update(_device_names(match.group(1)))
        match = _VERSION.search(line)
        if match:
            version = match.group(1)
    kinds = set()
    for via in vias:
        # "NET/IB/0/GDRDMA" -> NET/IB, "P2P/CUMEM" -> P2P, "SHM/direct/direct" -> SHM
        parts = via.split("/")
        kinds.add("/".join(parts[:2]) if parts[0] == "NET" else parts[0])
    return dict(
        transports=sorted(kinds),
        channels=sorted(vias),
        networks=sorted(networks),
        ib_devices=sorted(ib),
        socket_interfaces=sorted(sockets),
        nnodes=max((int(n) for n in nnodes), default=None),
        nccl_version=version,
    )


def likely_cause(transport, nnodes, expected_hcas=2):
    """The most likely reason for low bus bandwidth, from what NCCL chose."""
    kinds = transport["transports"]
    if "NET/Socket" in kinds:
        return (
            "NCCL used TCP sockets (NET/Socket over %s), not RDMA: check NCCL_IB_HCA names the RDMA devices, "
            "NCCL_IB_DISABLE is not 1 and /dev/infiniband is passed into the container"
            % (", ".join(transport["socket_interfaces"]) or "an unknown interface")
        )
    if "NET/IB" in kinds and len(transport["ib_devices"]) < expected_hcas:
        return "NCCL used only %d RDMA device (%s); a Spark's 200G port needs both CX-7 twins in NCCL_IB_HCA" % (
            len(transport["ib_devices"]),
            ", ".join(transport["ib_devices"]) or "unknown",
        )
    if "NET/IB" in kinds:
        return (
            "RDMA (NET/IB on %s) is in use but slow: check MTU 9000 on every rail (fabric_check), "
            "the RoCE v2 NCCL_IB_GID_INDEX and the link speed" % ", ".join(transport["ib_devices"])
        )
    if nnodes > 1:
        return "no network transport appears in the NCCL log; was NCCL_DEBUG=INFO passed through?"
    return "single node (%s): the GPUs' own link is slower than the threshold" % (
        ", ".join(kinds) or "transport unknown"
    )


def verdict(payload, log, threshold_gbps, threshold_op, nnodes):
    """Bandwidth table, peaks and pass/fail with a cause, from the payload's JSON and the NCCL log."""
    world = payload["world_size"]
    rows = [bandwidth(row, world) for row in payload["results"]]
    peaks = {}
    for row in rows:
        peaks[row["op"]] = max(peaks.get(row["op"], 0.0), row["busbw_gbps"])
    transport = parse_transport(log)
    problems = list(payload.get("errors") or [])
    if problems:
        problems.insert(0, "result values are wrong, so no bandwidth is trusted")
    measured = peaks.get(threshold_op)
    if measured is None:
        problems.append("threshold_op %s was not run (ops: %s)" % (threshold_op, ", ".join(sorted(peaks))))
    elif measured < threshold_gbps:
        problems.append(
            "%s peak bus bandwidth %.3f GB/s is below the threshold %.3f GB/s; likely cause: %s"
            % (threshold_op, measured, threshold_gbps, likely_cause(transport, nnodes))
        )
    return dict(
        results=rows,
        peak_busbw_gbps=peaks,
        transport=transport,
        passed=not problems,
        problems=problems,
        world_size=world,
        ranks=payload.get("ranks", []),
        nccl_version=payload.get("nccl") or transport["nccl_version"],
        torch_version=payload.get("torch"),
    )


def launch_args(params, gpus_per_node, payload_path):
    """Arguments after the Python interpreter: torch.distributed.run, one process per GPU."""
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes=%d" % params["nnodes"],
        "--nproc-per-node=%d" % gpus_per_node,
        "--node-rank=%d" % params["node_rank"],
        "--master-addr=%s" % params["master_addr"],
        "--master-port=%d" % params["master_port"],
        payload_path,
        "--sizes=%s" % ",".join(str(s) for s in params["sizes"]),
        "--ops=%s" % ",".join(params["ops"]),
        "--warmup=%d" % params["warmup"],
        "--iters=%d" % params["iters"],
        "--timeout=%d" % params["timeout"],
    ]


def check_params(params):
    """Messages for bad input, each naming the parameter and the fix."""
    errors = []
    for size in params["sizes"]:
        if size < 1 << 10 or size > MAX_BYTES:
            errors.append(
                "sizes: %d bytes is outside 1024..%d (1 GiB per rank); large tests exhaust a Spark's unified memory"
                % (size, MAX_BYTES)
            )
    if params["node_rank"] >= params["nnodes"]:
        errors.append("node_rank (%d) must be below nnodes (%d)" % (params["node_rank"], params["nnodes"]))
    if params["threshold_op"] not in params["ops"]:
        errors.append("threshold_op %s is not in ops %s; add it to ops" % (params["threshold_op"], params["ops"]))
    for key in ("warmup", "iters", "timeout"):
        if params[key] < (0 if key == "warmup" else 1):
            errors.append("%s must be positive, got %d" % (key, params[key]))
    return errors
