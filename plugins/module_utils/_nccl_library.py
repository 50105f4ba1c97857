# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which NCCL library a runtime image loads: pip or system build, from the payload's raw facts (private).

The payload (``_nccl_payload.py --library``) imports torch, opens ``libnccl.so.2`` as vLLM's pynccl
does and reports the files mapped into the process with their pip and dpkg owners. Two builds can
carry the same version number and behave differently, so the file and its owner are what count;
nothing here guesses: no facts, no library.
"""

from __future__ import annotations

import os
import re

BUILDS = ("pip", "system", "static", "other")
_PIP_DIRS = ("/site-packages/", "/dist-packages/")
_SYSTEM_DIRS = ("/usr/lib/", "/usr/lib64/", "/lib/", "/lib64/", "/usr/local/cuda")
_RUNTIME_FILE = re.compile(r"libnccl\.so\.\d")


def decode_version(code):
    """ncclGetVersion's integer as text: 22703 -> 2.27.3 (NCCL 2.9 and later), 2708 -> 2.7.8 (older)."""
    if code >= 10000:
        return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)
    return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)


def _owner(facts, path):
    """(build, package, package version) of one loaded file: its owner first, then where it lies."""
    owners = [(build, o) for kind, build in (("pip", "pip"), ("dpkg", "system")) for o in facts.get(kind, ())]
    # The package that lists the file itself before one that reaches it through a link (libnccl-dev).
    for build, owner in sorted(owners, key=lambda item: path not in item[1].get("files", ())):
        if path in owner.get("loaded", ()):
            return build, "%s %s" % (owner["name"], owner.get("version") or "?"), owner.get("version")
    if any(d in path for d in _PIP_DIRS):
        return "pip", "no installed distribution lists it", None
    if path.startswith(_SYSTEM_DIRS):
        return "system", "no package owns it", None
    return "other", "neither pip nor a package owns it", None


def _library(facts, path):
    """One loaded file: build, owner and version (measured through ncclGetVersion where it was called)."""
    build, package, package_version = _owner(facts, path)
    measured = [f["version_code"] for f in (facts.get("dlopen"), facts.get("global")) if f and f.get("file") == path]
    if measured:
        version, version_from = decode_version(measured[0]), "ncclGetVersion"
    elif package_version:
        # Not called here: its package's version (2.28.3-1+cuda13.0 -> 2.28.3).
        version, version_from = package_version.split("-")[0], "package"
    else:
        version, version_from = "?", None
    return dict(
        path=path, name=os.path.basename(path), version=version, version_from=version_from, build=build, package=package
    )


def _torch_file(facts):
    """The file torch's NCCL calls bind to: the global scope's (LD_PRELOAD) or torch's one dependency."""
    found = (facts.get("global") or {}).get("file")
    after_torch = facts.get("mapped_after_torch") or []
    return found or (after_torch[0] if len(after_torch) == 1 else None)


def _not_loaded(facts):
    """Other NCCL builds installed in the image that this process did not load.

    A package with only the unversioned libnccl.so (the linker's development link) is no build of its own.
    """
    return [
        "%s %s (%s)" % (owner["name"], owner.get("version") or "?", kind)
        for kind in ("pip", "dpkg")
        for owner in facts.get(kind, ())
        if not owner.get("loaded") and any(_RUNTIME_FILE.search(f) for f in owner.get("files", ()))
    ]


def _unavailable_reason(facts):
    parts = []
    if facts.get("torch_error"):
        parts.append("PyTorch is not importable (%s)" % facts["torch_error"])
    elif not facts.get("torch_cuda"):
        parts.append("torch %s is a CPU build" % facts.get("torch", "?"))
    elif facts.get("torch_nccl_error"):
        parts.append("torch %s has no NCCL (%s)" % (facts.get("torch"), facts["torch_nccl_error"]))
    dlopen = facts.get("dlopen") or {}
    if dlopen.get("error"):
        parts.append("no %s can be loaded: %s" % (dlopen.get("name", "libnccl"), dlopen["error"]))
    return "; ".join(parts) or "no libnccl is mapped into the process"


def _said(library):
    return "%s %s (%s %s) %s" % (
        library["name"],
        library["version"],
        library["build"],
        library["package"],
        library["path"],
    )


def describe(facts):
    """The loaded library, classified, with a one-line description (``line``) for reports.

    The library is the file vLLM's pynccl gets (``libnccl.so.2`` or ``VLLM_NCCL_SO_PATH`` through
    ctypes); when torch's own calls bind to another file, that one is named too (``torch_library``):
    then two NCCL builds run in one process.
    """
    if not facts:
        return dict(available=False, build=None, builds=[], reason="not read", line="not read")
    mapped = list(facts.get("mapped") or [])
    built_with = facts.get("torch_built_with_nccl")
    result = dict(torch=facts.get("torch"), torch_cuda=facts.get("torch_cuda"), mapped=mapped, torch_library=None)
    if not mapped and built_with:
        # torch names an NCCL while no libnccl file is mapped: it is linked into libtorch.
        result.update(available=True, build="static", builds=["static"], path=None, version=built_with)
        result["line"] = "NCCL %s (static: linked into torch %s, no libnccl file)" % (built_with, facts.get("torch"))
        return result
    if not mapped:
        reason = _unavailable_reason(facts)
        result.update(available=False, build=None, builds=[], path=None, version=None, reason=reason)
        result["line"] = "not available: %s" % reason
        return result
    path = (facts.get("dlopen") or {}).get("file") or _torch_file(facts) or mapped[0]
    library = _library(facts, path)
    notes = []
    if facts.get("env", {}).get("VLLM_NCCL_SO_PATH"):
        notes.append("VLLM_NCCL_SO_PATH=%s" % facts["env"]["VLLM_NCCL_SO_PATH"])
    torch_file = _torch_file(facts)
    builds = {library["build"]}
    if torch_file and torch_file != path:
        result["torch_library"] = _library(facts, torch_file)
        builds.add(result["torch_library"]["build"])
        notes.append("torch's own NCCL calls use another: %s" % _said(result["torch_library"]))
    elif not torch_file and facts.get("torch_cuda") and not facts.get("mapped_after_torch"):
        notes.append("torch %s maps no libnccl of its own" % facts.get("torch"))
    unused = [p for p in mapped if p not in (path, torch_file)]
    if unused:
        notes.append("also mapped, unused: %s" % ", ".join(unused))
    idle = _not_loaded(facts)
    if idle:
        notes.append("installed, not loaded: %s" % ", ".join(idle))
    result.update(library, available=True, builds=sorted(builds), notes=notes)
    result["line"] = "; ".join([_said(library), *notes])
    return result


def summary_line(pairs, recorded=False):
    """One line for the deploy summary from (node, library or None) pairs; equal libraries say 'same'."""
    said, first_of, unavailable, unread = [], {}, {}, []
    for node, library in pairs:
        if not library:
            unread.append(node)
        elif not library.get("available"):
            unavailable.setdefault(library.get("reason") or library.get("line"), []).append(node)
        else:
            key = (library.get("build"), library.get("path"), library.get("version"), library.get("package"))
            said.append("%s %s" % (node, "same" if key in first_of else library["line"]))
            first_of.setdefault(key, node)
    said += ["not available on %s (%s)" % (", ".join(nodes), why) for why, nodes in unavailable.items()]
    if unread:
        said.append("not read on %s (the validate stage did not run)" % ", ".join(unread))
    line = "; ".join(said) or "no nodes"
    return line + (" [as recorded by the last validate run, not re-read]" if recorded and not unread else "")
