# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model and image distribution to 1, 2 and 3 workers (2, 3 and 4 nodes): head-sends-all (star) against the
chain, side by side in one run, on the distribution lab (benchmarks/distribution/inventory: dist-1 .. dist-4).

    .venv/bin/ansible-playbook -i benchmarks/distribution/inventory playbooks/lab.yml
    .venv/bin/python benchmarks/distribution.py [--runs 3] [--shards 16] [--shard-mb 16] [--rate-mbit 400]
        [--what model,image] [--image-runs 1] [--image-rate-mbit 2000]
    .venv/bin/ansible-playbook -i benchmarks/distribution/inventory playbooks/lab.yml -e lab_state=absent

Every node's first-rail egress is held to --rate-mbit by a token bucket (tc tbf), as a port would: on one
machine the nodes' bridges otherwise run at memory speed, and the CPU, not the head's port, would be what
runs out. The model is a synthetic one of --shards safetensors shards (the lab model's config.json and
tokenizer beside them, so the deploy's layout and memory checks read a real config), written on the head.
For each run, each topology and each worker count: the model (or the runtime image's in-service tag, and so
the image) is removed from that many workers (the others keep theirs and are not sent anything), then
`deploy-qwen35.yml --tags model` (or `--tags runtime_image`) runs, after one deploy of every node stage made
the records those runs take their facts from. Measured: the copy task's wall time on the controller
(bench_timer) and the bytes the head's first rail sent (/sys/class/net/<rail>/statistics/tx_bytes). The
deploy's own checks (every node's manifest equals the head's; every node's image ID equals the head's) must
pass. The image is the lab's real runtime image (4.6 GB): fewer runs and a faster egress by default. Prints
the tables; writes the raw runs to benchmarks/results/distribution-<time>.json. Timings are measured, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
INVENTORY = os.path.join(BENCH, "distribution", "inventory")
sys.path.insert(0, os.path.join(ROOT, "tests", "faults"))
os.environ.setdefault("DGX_SPARK_LAB_INVENTORY", INVENTORY)
import labkit  # noqa: E402 - the path above first

LAB = labkit.read_inventory(INVENTORY)
HEAD, WORKERS = LAB["nodes"][0], LAB["nodes"][1:]
RAIL = LAB["head_rail"]
MODEL = "/var/lib/dgx-spark/models/distribution-bench"
TOPOLOGIES = ("star", "chain")
IN_SERVICE = labkit.IN_SERVICE
# What is copied: the deploy stage that copies it, its copy task, its topology variable.
KINDS = {
    "model": dict(stage="model", task="Copy the model from the head over the fabric", var="model_sync_topology"),
    "image": dict(
        stage="runtime_image",
        task="Image | Obtain, verify, promote on the build host; stream to the other nodes",
        var="runtime_image_copy_topology",
    ),
}
# The node stages, run once first: a --tags run of one stage takes the others' facts from their records.
NODE_STAGES = "preflight,gpu,fabric,runtime_image,validate,model"

# Written on the head: shards with a valid safetensors header (one U8 tensor each) and their index.
WRITE_MODEL = r"""
import json, os, shutil, struct, sys
src, dst, shards, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
for name in os.listdir(src):
    if name.endswith((".json", ".jinja")) and name != "model.safetensors.index.json":
        shutil.copy(os.path.join(src, name), dst)
weight_map = {}
for i in range(1, shards + 1):
    file = "model-%05d-of-%05d.safetensors" % (i, shards)
    tensor = "w%d" % i
    header = json.dumps({tensor: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    with open(os.path.join(dst, file), "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        for _ in range(size >> 20):
            out.write(os.urandom(1 << 20))
    weight_map[tensor] = file
with open(os.path.join(dst, "model.safetensors.index.json"), "w") as out:
    json.dump({"metadata": {"total_size": shards * size}, "weight_map": weight_map}, out)
"""


def log(msg):
    sys.stderr.write("%s %s\n" % (time.strftime("%H:%M:%S"), msg))


node = labkit.node


def shape(rate_mbit):
    for name in LAB["nodes"]:
        if rate_mbit:
            node(
                name,
                "tc",
                "qdisc",
                "replace",
                "dev",
                RAIL,
                "root",
                "tbf",
                "rate",
                "%dmbit" % rate_mbit,
                "burst",
                "256kb",
                "latency",
                "400ms",
            )
        else:
            node(name, "tc", "qdisc", "del", "dev", RAIL, "root", check=False)


def tx_bytes():
    return int(node(HEAD, "cat", "/sys/class/net/%s/statistics/tx_bytes" % RAIL))


def deploy(*extra):
    with tempfile.TemporaryDirectory() as tmp:
        timer = os.path.join(tmp, "timer.json")
        env = dict(
            ANSIBLE_CALLBACK_PLUGINS=os.path.join(BENCH, "callback_plugins"),
            ANSIBLE_CALLBACKS_ENABLED="bench_timer",
            BENCH_TIMER_OUT=timer,
        )
        res = labkit.playbook(labkit.DEPLOY, *extra, timeout=900, inventory=INVENTORY, extra_env=env)
        if res.rc != 0:
            raise RuntimeError("deploy %s: rc %s\n%s" % (" ".join(extra), res.rc, res.out[-3000:]))
        with open(timer, encoding="utf-8") as handle:
            return json.load(handle), res.seconds


def copy_task(timer, kind):
    """The head's copy task: its wall time and the module's own report (synced, sent_bytes, peers)."""
    for task in timer["tasks"]:
        if task["task"].endswith(KINDS[kind]["task"]) and task["host"] == HEAD and task["status"] in ("ok", "changed"):
            return round(task["end"] - task["start"], 2), task["result"]
    return None, {}


def remove_copy(kind, name):
    if kind == "model":
        node(name, "rm", "-rf", MODEL)
    else:
        # Only the in-service tag names the image on a worker here (nothing serves): its layers go too.
        node(name, "docker", "rmi", IN_SERVICE, check=False)


def one(kind, topology, workers, extra):
    for name in workers:
        remove_copy(kind, name)
    before = tx_bytes()
    timer, wall = deploy("--tags", KINDS[kind]["stage"], "-e", "%s=%s" % (KINDS[kind]["var"], topology), *extra)
    sent = tx_bytes() - before
    seconds, result = copy_task(timer, kind)
    return dict(
        kind=kind,
        topology=topology,
        workers=len(workers),
        seconds=seconds,
        head_sent=sent,
        wall=round(wall, 2),
        synced=result.get("synced"),
        module_sent=result.get("sent_bytes"),
        peers=result.get("peers"),
    )


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(doc, kind="model"):
    runs, size = [r for r in doc["runs"] if r.get("kind", "model") == kind], doc["%s_bytes" % kind]
    if not runs:
        return ""
    if kind == "model":
        what = "%d MiB in %d shards" % (size >> 20, doc["shards"])
    else:
        what = "the lab's runtime image, %.2f GB as docker save streams it" % (size / 1e9)
    rate = doc.get("%s_rate_mbit" % kind, doc.get("rate_mbit"))
    lines = [
        "%s distribution: %s, node egress %s Mbit/s (tc tbf), %d runs, medians (min-max)"
        % (kind.capitalize(), what, rate or "unlimited", doc.get("%s_repeat" % kind, doc.get("repeat"))),
        "",
        "| nodes | workers | star s | chain s | star / 1 worker | chain / 1 worker | head sent: star | chain |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {t: med([r["seconds"] for r in runs if r["topology"] == t and r["workers"] == 1]) for t in TOPOLOGIES}

    def cell(t, n, key):
        values = [r[key] for r in runs if r["topology"] == t and r["workers"] == n and r[key] is not None]
        if not values:
            return "-", None
        m = statistics.median(values)
        if key == "head_sent":
            return "%.2f copies" % (m / size), m
        return "%.1f (%.1f-%.1f)" % (m, min(values), max(values)), m

    for n in sorted({r["workers"] for r in runs}):
        star, star_m = cell("star", n, "seconds")
        chain, chain_m = cell("chain", n, "seconds")
        ratios = ["%.2fx" % (m / base[t]) if m and base[t] else "-" for t, m in (("star", star_m), ("chain", chain_m))]
        lines.append(
            "| %d | %d | %s | %s | %s | %s | %s | %s |"
            % (
                n + 1,
                n,
                star,
                chain,
                ratios[0],
                ratios[1],
                cell("star", n, "head_sent")[0],
                cell("chain", n, "head_sent")[0],
            )
        )
    lines += ["", "Target (issue 17): chain to 3 workers <= 1.5x chain to 1 worker; the head sends about one copy."]
    return "\n".join(lines)


def image_bytes():
    """The bytes one copy of the image streams: docker save's tar of it, counted on the head."""
    return int(node(HEAD, "sh", "-c", "docker save %s | wc -c" % IN_SERVICE))


def measure(doc, kind, repeat, extra, out):
    for run in range(repeat):
        for n in range(1, len(WORKERS) + 1):
            # Alternate which topology goes first, so neither always runs on a warmer machine.
            for topology in TOPOLOGIES if (run + n) % 2 == 0 else TOPOLOGIES[::-1]:
                record = one(kind, topology, WORKERS[:n], extra)
                record["run"] = run
                doc["runs"].append(record)
                log(
                    "run %d %s %s to %d: %s s, head sent %.1f MiB"
                    % (run + 1, kind, topology, n, record["seconds"], record["head_sent"] / 2**20)
                )
                with open(out, "w", encoding="utf-8") as handle:
                    json.dump(doc, handle, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mb", type=int, default=16)
    parser.add_argument("--rate-mbit", type=int, default=400, help="each node's egress; 0 leaves it unlimited")
    parser.add_argument("--what", default="model,image", help="model, image or both")
    parser.add_argument("--image-runs", type=int, default=1)
    parser.add_argument("--image-rate-mbit", type=int, default=2000, help="each node's egress for the image rows")
    parser.add_argument("--table", help="print a written result's tables again")
    args = parser.parse_args()
    if args.table:
        with open(args.table, encoding="utf-8") as handle:
            doc = json.load(handle)
        print("\n\n".join(filter(None, (table(doc, kind) for kind in KINDS))))
        return
    kinds = [k for k in args.what.split(",") if k]
    if set(kinds) - set(KINDS):
        parser.error("--what: model, image or both, not %s" % args.what)
    size = args.shard_mb << 20
    log("the synthetic model on %s" % HEAD)
    node(HEAD, "python3", "-c", WRITE_MODEL, LAB["model_path"], MODEL, str(args.shards), str(size))
    extra = ("-e", "model_path=" + MODEL, "-e", "validate_nccl=false")
    # Every worker holds the model and the image first: each case removes them from exactly the workers it
    # measures. The records this run makes are what the --tags runs take the other stages' facts from.
    log("every node stage on %s" % ", ".join(LAB["nodes"]))
    deploy("--tags", NODE_STAGES, "-e", "model_sync_topology=chain", *extra)
    doc = dict(
        started=datetime.now(UTC).isoformat(),
        shards=args.shards,
        model_bytes=args.shards * size,
        image_bytes=image_bytes() if "image" in kinds else None,
        rate_mbit=args.rate_mbit,
        model_rate_mbit=args.rate_mbit,
        image_rate_mbit=args.image_rate_mbit,
        repeat=args.runs,
        model_repeat=args.runs,
        image_repeat=args.image_runs,
        runs=[],
    )
    out = os.path.join(BENCH, "results", "distribution-%s.json" % datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        for kind in kinds:
            shape(args.rate_mbit if kind == "model" else args.image_rate_mbit)
            measure(doc, kind, args.runs if kind == "model" else args.image_runs, extra, out)
    finally:
        shape(0)
    print("\n\n".join(filter(None, (table(doc, kind) for kind in kinds))))
    log("raw runs: %s" % out)


if __name__ == "__main__":
    main()
