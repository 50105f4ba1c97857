# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Collective bandwidth payload, run inside the runtime image by torch.distributed.run (private).

This file is not imported by modules: nccl_test copies its text to the node and runs it as a
script, one process per GPU. It needs only the standard library and PyTorch, measures raw times,
checks result values, and prints one JSON line on global rank 0. Bandwidth arithmetic is done by
the module (``_nccl_test.py``), so it stays unit-testable without torch or GPUs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys

RESULT_MARKER = "NCCL_TEST_RESULT "
# Per-rank buffer ceiling: a 16 GB test exhausted a Spark's unified memory and froze the node.
MAX_BYTES = 1 << 30
ELEMENT_BYTES = 4  # float32; small integers stay exact, so results can be compared exactly


def _emit(payload):
    sys.stdout.write(RESULT_MARKER + json.dumps(payload, sort_keys=True) + "\n")
    sys.stdout.flush()


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--ops", default="all_reduce,all_gather")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=300, help="seconds for NCCL init and each collective")
    return parser.parse_args(argv)


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
    sizes = [int(s) for s in args.sizes.split(",") if s]
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
