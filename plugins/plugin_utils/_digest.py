# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side digests (private): the files of a role, of the deploy's code or of a build context, and this
collection's version."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os

# The collection's root: plugins/plugin_utils/ is two levels below it.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def file_digests(root, patterns=("**/*",)):
    """[relative path, SHA-256] of every file under root matching patterns, sorted; [] when root is not a directory."""
    paths = {
        path
        for pattern in patterns
        for path in glob.glob(os.path.join(glob.escape(root), pattern), recursive=True)
        if os.path.isfile(path) and "__pycache__" not in path
    }
    out = []
    for path in sorted(paths):
        with open(path, "rb") as handle:
            out.append([os.path.relpath(path, root), hashlib.sha256(handle.read()).hexdigest()])
    return out


def tree_digest(root):
    """One SHA-256 over every file under root (names and contents); '' for an empty root."""
    if not root:
        return ""
    return hashlib.sha256(repr(file_digests(root)).encode("utf-8")).hexdigest()


@functools.cache
def collection_version():
    """This collection's version (galaxy.yml in a checkout, MANIFEST.json when installed): new code, new digest."""
    manifest = os.path.join(COLLECTION_ROOT, "MANIFEST.json")
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as handle:
            return json.load(handle)["collection_info"]["version"]
    with open(os.path.join(COLLECTION_ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("version:"):
                return line.split(":", 1)[1].strip().strip("\"'")
    return None
