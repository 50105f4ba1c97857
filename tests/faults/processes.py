"""Run inside a node's container: `pid:start time:state` of each process whose title starts with argv[1]
(vLLM names its engine core VLLM::EngineCore and its Ray actors ray::RayWorkerProc; the start time tells a
reused PID from the old process), `pid:-:gone` for one that exits while read. A signal name as argv[2] is
sent to them first. Shared by the fault suite (labkit.processes) and Molecule's reconverge verify."""

import contextlib
import os
import signal
import sys
import time


def titled(prefix):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                if handle.read().startswith(prefix):
                    pids.append(pid)
        except OSError:
            pass  # exited before it was read: not there
    return pids


def seen(pid):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            fields = handle.read().rsplit(") ", 1)[1].split()
    except OSError:
        return "%s:-:gone" % pid
    return "%s:%s:%s" % (pid, fields[19], fields[0])


pids = titled(sys.argv[1].encode())
if len(sys.argv) > 2:
    for pid in pids:
        with contextlib.suppress(OSError):  # exited since it was listed
            os.kill(int(pid), getattr(signal, "SIG" + sys.argv[2]))
    time.sleep(0.5)
print(" ".join(seen(pid) for pid in pids))
