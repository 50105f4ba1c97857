# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Collective bandwidth payload, run inside the runtime image by torch.distributed.run (private).

This file is not imported by modules: nccl_test copies its text to the node and runs it as a
script, one process per GPU. It needs only the standard library and PyTorch, measures raw times,
checks result values, and prints one JSON line on global rank 0. Bandwidth arithmetic is done by
the module (``_nccl_test.py``), so it stays unit-testable without torch or GPUs.

With ``--library`` it instead reports, as raw facts, which libnccl the image's Python loads (no GPU
needed); ``_nccl_library.py`` classifies them.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import os
import re
import socket
import sys

RESULT_MARKER = "NCCL_TEST_RESULT "
# Per-rank buffer ceiling: a 16 GB test exhausted a Spark's unified memory and froze the node.
MAX_BYTES = 1 << 30
ELEMENT_BYTES = 4  # float32; small integers stay exact, so results can be compared exactly
# libnccl.so, libnccl.so.2, libnccl.so.2.27.3; not the libnccl-net.so plugins.
NCCL_FILE = re.compile(r"libnccl\.so(\.\d+)*$")
# vLLM's pynccl opens this name (or VLLM_NCCL_SO_PATH) with ctypes.
NCCL_SONAME = "libnccl.so.2"


def _emit(payload):
    sys.stdout.write(RESULT_MARKER + json.dumps(payload, sort_keys=True) + "\n")
    sys.stdout.flush()


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--library", action="store_true", help="only report which libnccl is loaded")
    parser.add_argument("--sizes", help="comma-separated sizes in bytes (required without --library)")
    parser.add_argument("--ops", default="all_reduce,all_gather")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=300, help="seconds for NCCL init and each collective")
    return parser.parse_args(argv)


def mapped_nccl():
    """Every libnccl file mapped into this process, as the kernel names it (the resolved path)."""
    paths = []
    with open("/proc/self/maps", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if NCCL_FILE.search(os.path.basename(path)) and path not in paths:
                paths.append(path)
    return paths


def _same_files(paths, files):
    """The paths that are one of files, through symbolic links (libnccl.so.2 -> libnccl.so.2.27.3)."""
    real = {os.path.realpath(f) for f in files}
    return [p for p in paths if os.path.realpath(p) in real]


def _pip_owners(paths):
    """Installed distributions that ship a libnccl file: name, version, files; loaded: those in paths."""
    try:
        from importlib import metadata  # noqa: PLC0415 - Python 3.8 and later
    except ImportError:
        return []
    owners = []
    for dist in metadata.distributions():
        if "libnccl" not in (dist.read_text("RECORD") or ""):
            continue
        files = [str(dist.locate_file(f)) for f in dist.files or () if NCCL_FILE.search(f.name)]
        owners.append(
            {
                "name": dist.metadata["Name"],
                "version": dist.version,
                "files": files,
                "loaded": _same_files(paths, files),
            }
        )
    return owners


def _dpkg_owners(paths, info_dir="/var/lib/dpkg/info", status="/var/lib/dpkg/status"):
    """Debian packages with nccl in their name (cheap to find) and their libnccl files; loaded: those in paths."""
    owners = []
    for listing in sorted(glob.glob(os.path.join(info_dir, "*nccl*.list"))):
        with open(listing, encoding="utf-8", errors="replace") as handle:
            files = [line.strip() for line in handle if NCCL_FILE.search(os.path.basename(line.strip()))]
        name = os.path.basename(listing)[: -len(".list")].split(":")[0]
        owners.append({"name": name, "files": files, "loaded": _same_files(paths, files)})
    if owners and os.path.exists(status):
        versions = {}
        with open(status, encoding="utf-8", errors="replace") as handle:
            for block in handle.read().split("\n\n"):
                fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != " ")
                versions[fields.get("Package")] = fields.get("Version")
        for owner in owners:
            owner["version"] = versions.get(owner["name"])
    return owners


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _nccl_in(lib):
    """ncclGetVersion as found through a ctypes handle: the file it lives in (dladdr) and its version code."""
    function = lib.ncclGetVersion
    code = ctypes.c_int()
    function(ctypes.byref(code))
    found = {"version_code": code.value}
    info = _DlInfo()
    try:
        if ctypes.CDLL(None).dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            found["file"] = os.path.realpath(info.dli_fname.decode())
    except AttributeError:  # dladdr lives in libdl before glibc 2.34
        pass
    return found


def library_facts():
    """Which libnccl this Python loads, as torch and vLLM's pynccl load it: raw facts, no judgement."""
    facts = {"python": sys.version.split()[0], "env": {}}
    for name in ("VLLM_NCCL_SO_PATH", "LD_LIBRARY_PATH", "LD_PRELOAD"):
        if os.environ.get(name):
            facts["env"][name] = os.environ[name]
    try:
        import torch  # noqa: PLC0415 - only inside the runtime image
    except ImportError as exc:
        facts["torch_error"] = str(exc)
    else:
        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        try:
            # The nccl.h torch was compiled with, not the library loaded now.
            facts["torch_built_with_nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # a CPU build has no NCCL binding at all
            facts["torch_nccl_error"] = "%s: %s" % (type(exc).__name__, exc)
    facts["mapped_after_torch"] = mapped_nccl()
    # What the process's global symbol scope answers (LD_PRELOAD first): what torch's calls bind to.
    try:
        facts["global"] = _nccl_in(ctypes.CDLL(None))
    except AttributeError as exc:
        facts["global"] = {"error": str(exc)}
    name = os.environ.get("VLLM_NCCL_SO_PATH") or NCCL_SONAME
    try:
        # As vLLM's pynccl opens it; a library of that soname already loaded is returned as is.
        facts["dlopen"] = _nccl_in(ctypes.CDLL(name))
    except (OSError, AttributeError) as exc:
        facts["dlopen"] = {"error": str(exc)}
    facts["dlopen"]["name"] = name
    facts["mapped"] = mapped_nccl()
    facts["pip"] = _pip_owners(facts["mapped"])
    facts["dpkg"] = _dpkg_owners(facts["mapped"])
    return facts


def _check(torch, tensor, expected, what):
    """Return None if every element equals its expected value, else a short description."""
    bad = torch.ne(tensor, expected)
    count = int(bad.sum().item())
    if count == 0:
        return None
    first = int(torch.nonzero(bad)[0].item())
    return "%s: %d of %d elements wrong (first at %d: %r, expected %r)" % (
        what,
        count,
        tensor.numel(),
        first,
        tensor.view(-1)[first].item(),
        expected.view(-1)[first].item() if hasattr(expected, "view") else expected,
    )


class Bench:
    """One rank's view of the run."""

    def __init__(self, torch, dist, args):
        self.torch = torch
        self.dist = dist
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device())

    def _time(self, step):
        torch = self.torch
        for _step in range(self.args.warmup):
            step()
        torch.cuda.synchronize()
        self.dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _step in range(self.args.iters):
            step()
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000.0 / self.args.iters
        # The collective is finished only when its slowest rank is: report the maximum.
        slowest = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(slowest, op=self.dist.ReduceOp.MAX)
        return float(slowest.item())

    def all_reduce(self, size):
        torch = self.torch
        numel = size // ELEMENT_BYTES
        buf = torch.full((numel,), float(self.rank + 1), dtype=torch.float32, device=self.device)
        expected = float(self.world * (self.world + 1) // 2)
        self.dist.all_reduce(buf)
        error = _check(torch, buf, expected, "all_reduce sum")
        seconds = self._time(lambda: self.dist.all_reduce(buf))
        # Timed iterations grow the values; refill and check once more after the timing.
        buf.fill_(float(self.rank + 1))
        self.dist.all_reduce(buf)
        error = error or _check(torch, buf, expected, "all_reduce sum after timing")
        return numel * ELEMENT_BYTES, seconds, error

    def all_gather(self, size):
        torch = self.torch
        per_rank = size // ELEMENT_BYTES // self.world
        src = torch.full((per_rank,), float(self.rank + 1), dtype=torch.float32, device=self.device)
        out = torch.empty((per_rank * self.world,), dtype=torch.float32, device=self.device)
        expected = torch.arange(1, self.world + 1, dtype=torch.float32, device=self.device)
        expected = expected.repeat_interleave(per_rank)
        seconds = self._time(lambda: self.dist.all_gather_into_tensor(out, src))
        error = _check(torch, out, expected, "all_gather chunks")
        # nccl-tests counts the gathered (output) size for all-gather.
        return per_rank * self.world * ELEMENT_BYTES, seconds, error


def _gather_ranks(dist, torch):
    me = {
        "rank": dist.get_rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(),
        "device": torch.cuda.get_device_name(),
    }
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, me)
    return ranks


def run(argv=None):
    args = _parse_args(argv)
    if args.library:
        _emit({"library": library_facts()})
        return 0
    sizes = [int(s) for s in (args.sizes or "").split(",") if s]
    if not sizes:
        _emit({"failed": True, "reason": "--sizes is required"})
        return 2
    too_big = [s for s in sizes if s > MAX_BYTES or s < 1]
    if too_big:
        _emit({"failed": True, "reason": "sizes out of range 1..%d bytes: %s" % (MAX_BYTES, too_big)})
        return 2
    try:
        import torch  # noqa: PLC0415 - only inside the runtime image
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError as exc:
        _emit({"skipped": True, "reason": "PyTorch is not importable in this image: %s" % exc})
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        _emit({"skipped": True, "reason": "no CUDA device visible to PyTorch (torch %s)" % torch.__version__})
        return 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl",
        timeout=datetime.timedelta(seconds=args.timeout),
        device_id=torch.device("cuda", local_rank),
    )
    bench = Bench(torch, dist, args)
    results = []
    errors = []
    for op in [o for o in args.ops.split(",") if o]:
        for size in sizes:
            nbytes, seconds, error = getattr(bench, op)(size)
            results.append({"op": op, "bytes": nbytes, "seconds": seconds, "correct": error is None})
            if error:
                errors.append(error)
    ranks = _gather_ranks(dist, torch)
    if bench.rank == 0:
        _emit(
            {
                "world_size": bench.world,
                "ranks": ranks,
                "results": results,
                "errors": errors,
                "warmup": args.warmup,
                "iters": args.iters,
                "torch": torch.__version__,
                "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
            }
        )
    dist.destroy_process_group()
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(run())
