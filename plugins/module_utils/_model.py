# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model directory checks, manifests and page-cache dropping (private; used by model_files).

A shard's expected size comes from its own safetensors header: 8 bytes (little-endian header
length N), N bytes of JSON, then the tensor data up to the largest `data_offsets` end. A shard cut
short by an interrupted download or copy is found without hashing 119 GB.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"
SAMPLE_BYTES = 1 << 20
# Hub download bookkeeping (huggingface_hub local_dir mode); not part of the model.
SKIP_DIRS = {".cache", ".git"}


def safetensors_expected_size(path):
    """(expected size, problem) from the file's header; problem is None when the header reads."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                return None, "shorter than a safetensors header"
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * 1024 * 1024:
                return None, "header length %d is not plausible" % length
            header = handle.read(length)
    except OSError as exc:
        return None, str(exc)
    if len(header) < length:
        return None, "header cut short"
    try:
        meta = json.loads(header)
    except ValueError:
        return None, "header is not JSON"
    end = 0
    for name, info in meta.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        offsets = info.get("data_offsets") or [0, 0]
        end = max(end, int(offsets[1]))
    return 8 + length + end, None


def verify(path):
    """Completeness report of a model directory."""
    report = dict(state="missing", layout=None, shards=0, missing=[], short=[], problems=[])
    if not os.path.isdir(path):
        report["problems"].append("%s is not a directory" % path)
        return report
    if not os.path.isfile(os.path.join(path, CONFIG)):
        report["missing"].append(CONFIG)
    index_path = os.path.join(path, INDEX)
    if os.path.isfile(index_path):
        report["layout"] = "sharded"
        try:
            with open(index_path, encoding="utf-8") as handle:
                weight_map = json.load(handle).get("weight_map") or {}
        except (OSError, ValueError) as exc:
            weight_map = {}
            report["problems"].append("%s is not readable JSON: %s" % (INDEX, exc))
        if not weight_map and not report["problems"]:
            report["problems"].append("%s has an empty weight_map" % INDEX)
        shards = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(path, SINGLE)):
        report["layout"] = "single"
        shards = [SINGLE]
    else:
        report["missing"].append("%s (or %s)" % (INDEX, SINGLE))
        shards = []
    report["shards"] = len(shards)
    for shard in shards:
        shard_path = os.path.join(path, shard)
        if not os.path.isfile(shard_path):
            report["missing"].append(shard)
            continue
        expected, problem = safetensors_expected_size(shard_path)
        size = os.path.getsize(shard_path)
        if problem:
            report["short"].append(dict(file=shard, size=size, expected=None, problem=problem))
        elif size < expected:
            report["short"].append(dict(file=shard, size=size, expected=expected))
    any_file = bool(os.listdir(path))
    if report["missing"] or report["short"] or report["problems"]:
        report["state"] = "incomplete" if any_file else "missing"
    else:
        report["state"] = "complete"
    return report


def fingerprint(path, size, mode):
    if mode == "size":
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if mode == "sha256" or size <= 2 * SAMPLE_BYTES:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
            return ("sha256:" if mode == "sha256" else "sample:") + digest.hexdigest()
        # Cheap fingerprint: size, first and last MiB. Catches truncation and a different revision.
        digest.update(str(size).encode())
        digest.update(handle.read(SAMPLE_BYTES))
        handle.seek(size - SAMPLE_BYTES)
        digest.update(handle.read(SAMPLE_BYTES))
    return "sample:" + digest.hexdigest()


def manifest(path, mode):
    """Sorted [{path, size, fingerprint}] of the regular files under path, and its digest."""
    entries = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            size = os.path.getsize(full)
            entries.append(dict(path=os.path.relpath(full, path), size=size, fingerprint=fingerprint(full, size, mode)))
    entries.sort(key=lambda e: e["path"])
    blob = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return entries, hashlib.sha256(blob).hexdigest()


def drop_page_cache(control="/proc/sys/vm/drop_caches"):
    """Flush dirty pages and drop the page cache; report instead of failing when not allowed."""
    os.sync()
    try:
        with open(control, "w", encoding="ascii") as handle:
            handle.write("3\n")
    except OSError as exc:
        return dict(dropped=False, reason="could not write %s: %s" % (control, exc.strerror or exc))
    return dict(dropped=True, reason="")


def itemized_changes(rsync_output):
    """Lines of `rsync --itemize-changes` that are real transfers or creations."""
    changes = []
    for line in rsync_output.splitlines():
        code = line[:11]
        if len(code) == 11 and code[0] in "<>ch." and code[1] in "fdLDS" and (code[0] != "." or "+" in code):
            changes.append(line)
    return changes
