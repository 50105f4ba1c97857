#!/usr/bin/env python
"""Run the deploy playbook once, in enforce or drift mode, never two at a time, and leave a JSON report.

The systemd service of the reconverge role runs this; cron users and tests run it by hand.
Exit codes: 0 in sync, 10 drift found (drift mode), 11 repaired (enforce mode), 20 failed,
75 busy (another run held the lock past --lock-wait).
"""

import argparse
import datetime
import errno
import fcntl
import json
import os
import subprocess
import sys
import time

EXIT_IN_SYNC = 0
EXIT_DRIFT = 10
EXIT_REPAIRED = 11
EXIT_FAILED = 20
EXIT_BUSY = 75


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["enforce", "drift"], default="enforce")
    parser.add_argument("--inventory", required=True, help="inventory path (the real pair's: inventories/spark)")
    parser.add_argument("--playbook", required=True, help="the deploy playbook")
    parser.add_argument("--state-dir", default="/var/lib/dgx-spark/reconverge", help="reports and the lock live here")
    parser.add_argument("--keep", type=int, default=20, help="reports to keep (older ones are pruned)")
    parser.add_argument(
        "--lock-wait", type=float, default=0.0, help="seconds to wait for a running run, then exit busy"
    )
    parser.add_argument("--ansible-playbook", default="ansible-playbook", help="ansible-playbook executable")
    parser.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = parser.parse_args(argv)
    if args.keep < 1:
        parser.error("--keep must be at least 1 (the report of this run is always kept)")
    if args.lock_wait < 0:
        parser.error("--lock-wait must be 0 or more seconds")
    return args


def take_lock(path, wait):
    """Return an open, exclusively locked file, or None when another run keeps it past `wait` seconds."""
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole run
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            handle.seek(0)
            handle.truncate()
            handle.write("%d\n" % os.getpid())
            handle.flush()
            return handle
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                handle.close()
                return None
            time.sleep(0.2)


def prune(state_dir, keep):
    reports = sorted(name for name in os.listdir(state_dir) if name.startswith("report-") and name.endswith(".json"))
    for name in reports[:-keep]:
        os.unlink(os.path.join(state_dir, name))


def outcome(mode, rc, hosts):
    failed = rc != 0 or any(h["failed"] or h["unreachable"] for h in hosts.values())
    changed = any(h["changed"] for h in hosts.values())
    if failed:
        return "failed", EXIT_FAILED
    if not changed:
        return "in_sync", EXIT_IN_SYNC
    return ("drift", EXIT_DRIFT) if mode == "drift" else ("repaired", EXIT_REPAIRED)


def now():
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.state_dir, mode=0o750, exist_ok=True)
    lock = take_lock(os.path.join(args.state_dir, "lock"), args.lock_wait)
    if lock is None:
        print("reconverge: busy: another run holds %s/lock; exit %d" % (args.state_dir, EXIT_BUSY), file=sys.stderr)
        return EXIT_BUSY

    started = now()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    raw = os.path.join(args.state_dir, ".run-%s.json" % stamp)
    cmd = [args.ansible_playbook, "-i", args.inventory, args.playbook]
    if args.mode == "drift":
        cmd += ["--check", "--diff"]
    cmd += args.extra
    env = dict(os.environ, DGX_SPARK_RUN_REPORT=raw)
    enabled = [c for c in env.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",") if c]
    env["ANSIBLE_CALLBACKS_ENABLED"] = ",".join([*enabled, "dgx_spark.vllm.run_report"])
    print("reconverge: %s run: %s" % (args.mode, " ".join(cmd)), flush=True)
    rc = subprocess.call(cmd, env=env)

    try:
        with open(raw, encoding="utf-8") as handle:
            hosts = json.load(handle)["hosts"]
        os.unlink(raw)
    except (OSError, ValueError):
        hosts = {}
    status, code = outcome(args.mode, rc, hosts)
    report = {
        "start": started,
        "end": now(),
        "mode": args.mode,
        "inventory": args.inventory,
        "playbook": args.playbook,
        "status": status,
        "exit_code": code,
        "ansible_rc": rc,
        "hosts": hosts,
    }
    if rc != 0 and not hosts:
        report["error"] = "ansible-playbook exited %d before reporting any host" % rc
    path = os.path.join(args.state_dir, "report-%s.json" % stamp)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
    prune(args.state_dir, args.keep)
    for name, host in sorted(hosts.items()):
        print(
            "reconverge: %s ok=%d changed=%d failed=%d %s"
            % (name, host["ok"], host["changed"], host["failed"], "; ".join(host["changed_tasks"]))
        )
        probe = host.get("probe")
        if probe:
            said = "passed" if probe.get("ok") else "FAILED at %s: %s" % (probe.get("step"), probe.get("why"))
            # The warm check (one completion) asks no /version: its engine is the one on record.
            warm = probe.get("ok") and probe.get("health") is None
            engine = "as recorded" if warm else probe.get("engine_version")
            print(
                "reconverge: %s serving probe %s (completion %ss, %s tokens, engine %s)"
                % (name, said, probe.get("latency_s"), probe.get("tokens"), engine)
            )
    print("reconverge: %s (exit %d), report %s" % (status, code, path), flush=True)
    lock.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
