# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runtime images: graft Dockerfiles, verification in a throwaway container, copies between engines (private)."""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import re
import socket
import tarfile
import uuid

try:
    from docker.errors import DockerException, ImageNotFound, NotFound
except ImportError:  # pragma: no cover - _docker.docker_client reports the missing library
    DockerException = ImageNotFound = NotFound = Exception

INPUTS_LABEL = "dgx_spark.vllm.inputs"
REGISTRY_DIST = "vllm_image_graft_registry"
GRAFT_DIR = "/opt/dgx-spark-graft"  # where a graft's own files land in the image
VERIFY_BEGIN = "---- vllm_image verification ----"
VERIFY_END = "---- end vllm_image verification ----"

# Runs inside the image under test with its own Python (3.8+); prints one JSON document.
VERIFY_SCRIPT = r"""
import json, os, subprocess, sys, tempfile
out = {"python": sys.version.split()[0]}
proc = subprocess.run([sys.executable, "-m", "pip", "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
out["pip_check"] = {"rc": proc.returncode, "lines": proc.stdout.decode("utf-8", "replace").splitlines()}
for name in ("vllm", "transformers", "ray"):
    try:
        mod = __import__(name)
        out[name] = {"version": getattr(mod, "__version__", None), "error": None}
    except Exception as exc:
        out[name] = {"version": None, "error": "%s: %s" % (type(exc).__name__, exc)}
if out["ray"]["error"] is None:
    # Ray's own test of ray[default] (what `ray start` asks before it starts the agents minimal).
    try:
        from ray._private.utils import get_dashboard_dependency_error
        missing = get_dashboard_dependency_error()
        out["ray_agent_error"] = None if missing is None else "%s: %s" % (type(missing).__name__, missing)
    except Exception as exc:
        out["ray_agent_error"] = "%s: %s" % (type(exc).__name__, exc)
out["archs"] = None
if out["vllm"]["error"] is None:
    try:
        try:
            from vllm.plugins import load_general_plugins
            load_general_plugins()
        except ImportError:
            pass
        from vllm import ModelRegistry
        out["archs"] = sorted(ModelRegistry.get_supported_archs())
    except Exception as exc:
        out["archs_error"] = "%s: %s" % (type(exc).__name__, exc)
config = os.environ.get("VLLM_IMAGE_MODEL_CONFIG")
out["autoconfig"] = None
if config and out["transformers"]["error"] is None:
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as handle:
        handle.write(config)
    try:
        from transformers import AutoConfig
        loaded = AutoConfig.from_pretrained(folder, local_files_only=True)
        out["autoconfig"] = {"ok": True, "class": type(loaded).__name__, "error": None}
    except Exception as exc:
        out["autoconfig"] = {"ok": False, "class": None, "error": "%s: %s" % (type(exc).__name__, exc)}
print("%BEGIN%")
print(json.dumps(out, sort_keys=True))
print("%END%")
""".replace("%BEGIN%", VERIFY_BEGIN).replace("%END%", VERIFY_END)

REGISTRY_INSTALLER = r"""
# Installs the grafted registry entries as a vLLM general plugin (entry point group
# vllm.general_plugins): vLLM registers them with ModelRegistry at start.
import json, os, sysconfig
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "entries.json")) as handle:
    entries = json.load(handle)
lib = sysconfig.get_paths()["purelib"]
name = "%DIST%"
with open(os.path.join(lib, name + ".py"), "w") as handle:
    handle.write("# Registry entries grafted by dgx_spark.vllm.vllm_image.\n")
    handle.write("ENTRIES = %r\n\n\ndef register():\n" % (entries,))
    handle.write("    from vllm import ModelRegistry\n\n    for arch, cls in ENTRIES.items():\n")
    handle.write("        ModelRegistry.register_model(arch, cls)\n")
info = os.path.join(lib, name + "-1.0.dist-info")
os.makedirs(info, exist_ok=True)
files = {
    "METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: 1.0\nSummary: grafted vLLM registry entries\n" % name,
    "entry_points.txt": "[vllm.general_plugins]\n%s = %s:register\n" % (name, name),
    "INSTALLER": "dgx_spark.vllm\n",
    "RECORD": "",
}
for fname, text in files.items():
    with open(os.path.join(info, fname), "w") as handle:
        handle.write(text)
""".replace("%DIST%", REGISTRY_DIST)


class ImageError(Exception):
    """A failure to report with the parameter or cause named."""


def canonical_hash(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def tree_hash(path):
    """Hash of every file's relative path and content under path (a build context)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def read_model_config(model_dir):
    """Text and architecture list of model_dir/config.json; ImageError naming model_dir otherwise."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ImageError("model_dir: %s has no config.json (is the model downloaded on this node?)" % model_dir)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        archs = json.loads(text).get("architectures") or []
    except ValueError as exc:
        raise ImageError("model_dir: %s is not valid JSON (%s)" % (path, exc)) from exc
    if not archs:
        raise ImageError("model_dir: %s names no architectures" % path)
    return text, archs


def normalize_files(files):
    """graft.files entries -> list of (src, dest); a plain string copies to the same path."""
    out = []
    for item in files or []:
        if isinstance(item, str):
            src, dest = item, item
        else:
            src, dest = item.get("src"), item.get("dest") or item.get("src")
        if not src or not src.startswith("/"):
            raise ImageError("graft.files: %r is not an absolute path in the donor image" % (src,))
        out.append((src, dest))
    return out


def graft_dockerfile(graft):
    """The multi-stage Dockerfile of a graft: base, plus files from donor, pip requirements, registry entries."""
    python = graft.get("python") or "python3"
    lines = [
        "# Generated by dgx_spark.vllm.vllm_image (graft). Verified before it is promoted.",
        "FROM %s AS donor" % graft["donor"],
        "FROM %s" % graft["base"],
    ]
    for src, dest in normalize_files(graft.get("files")):
        lines.append("COPY --from=donor %s" % json.dumps([src, dest]))
    if graft.get("pip_requirements"):
        cmd = [python, "-m", "pip", "install", "--no-cache-dir", *graft["pip_requirements"]]
        lines.append("RUN %s" % json.dumps(cmd))
    if graft.get("registry"):
        lines.append("COPY %s %s" % (REGISTRY_DIST, GRAFT_DIR))
        lines.append("RUN %s" % json.dumps([python, GRAFT_DIR + "/install.py"]))
    return "\n".join(lines) + "\n"


def registry_entries(graft):
    entries = {}
    for item in graft.get("registry") or []:
        arch, cls = item.get("architecture"), item.get("class")
        if not arch or not cls or ":" not in cls:
            raise ImageError("graft.registry: %r needs architecture and class as 'module:Class'" % (item,))
        entries[arch] = cls
    return entries


def graft_context(graft):
    """In-memory tar of the graft build context (Dockerfile and the registry plugin installer)."""
    buf = io.BytesIO()
    files = {"Dockerfile": graft_dockerfile(graft)}
    entries = registry_entries(graft)
    if entries:
        files["%s/install.py" % REGISTRY_DIST] = REGISTRY_INSTALLER
        files["%s/entries.json" % REGISTRY_DIST] = json.dumps(entries, sort_keys=True, indent=2)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def parse_verification(output):
    """The JSON document between the markers of VERIFY_SCRIPT's output."""
    start = output.rfind(VERIFY_BEGIN)
    end = output.rfind(VERIFY_END)
    if start < 0 or end < start:
        raise ImageError("verification printed no result; output ends:\n%s" % output[-2000:])
    return json.loads(output[start + len(VERIFY_BEGIN) : end].strip())


_PIP_CONFLICT = re.compile(r"^(?P<pkg>\S+) (?P<version>\S+) has requirement (?P<req>.+), but you have (?P<have>.+)\.$")


def pip_conflicts(lines):
    """pip check lines that report a problem, those naming vllm first."""
    bad = [line for line in lines if "has requirement" in line or "requires" in line or "is not supported" in line]
    return sorted(bad, key=lambda line: not line.lower().startswith("vllm "))


def evaluate(result, architectures, require_ray=True, require_ray_agent=False):
    """Verification facts and the causes that block promotion (Ray only where the cluster runs on it; Ray's
    metrics agent, ray[default], only where every node's Ray metrics are asked for)."""
    causes = []
    conflicts = pip_conflicts(result["pip_check"]["lines"]) if result["pip_check"]["rc"] else []
    if result["pip_check"]["rc"] and not conflicts:
        conflicts = result["pip_check"]["lines"][-3:]
    causes.extend("pip check: %s" % line for line in conflicts)
    for name in ("vllm", "transformers"):
        if result[name]["error"]:
            causes.append("import %s failed: %s" % (name, result[name]["error"]))
    # Older recorded outputs have no "ray" entry; vLLM images from 0.18 on ship without Ray.
    ray = result.get("ray", {"version": None, "error": None})
    if ray["error"] and require_ray:
        causes.append(
            "import ray failed: %s (the Ray cluster runs inside this image: add Ray with a build or graft that "
            "pip-installs ray, or serve with vllm_server_backend mp, which needs no Ray)" % ray["error"]
        )
    agent_error = result.get("ray_agent_error")
    if require_ray_agent and not ray["error"] and agent_error:
        causes.append(
            "Ray %s here is plain ray, without the metrics agent that ray_cluster_metrics_export_port asks for "
            "(%s): install ray[default] (the vllm-ray build: RAY_PACKAGE: ray[default] in runtime_image_build.args), "
            "or unset ray_cluster_metrics_export_port" % (ray["version"], agent_error)
        )
    archs = result.get("archs")
    if result.get("archs_error"):
        causes.append("vllm.ModelRegistry.get_supported_archs() failed: %s" % result["archs_error"])
    supported, closest = None, []
    if archs is not None and architectures:
        supported = any(arch in archs for arch in architectures)
        if not supported:
            for arch in architectures:
                closest.extend(c for c in difflib.get_close_matches(arch, archs, n=3, cutoff=0.6) if c not in closest)
            causes.append(
                "architecture %s is not in vllm.ModelRegistry.get_supported_archs() of vllm %s; closest registered: %s"
                % (", ".join(architectures), result["vllm"]["version"], ", ".join(closest) or "none")
            )
    auto = result.get("autoconfig")
    if auto and not auto["ok"]:
        causes.append(
            "transformers %s cannot load the model config with AutoConfig: %s"
            % (result["transformers"]["version"], auto["error"])
        )
    facts = {
        "python": result.get("python"),
        "pip_check": result["pip_check"]["lines"],
        "vllm_version": result["vllm"]["version"],
        "transformers_version": result["transformers"]["version"],
        "ray_version": ray["version"],
        "ray_agent": None if "ray_agent_error" not in result else not agent_error,
        "architectures": list(architectures or []),
        "architecture_supported": supported,
        "closest_architectures": closest,
        "autoconfig_class": auto["class"] if auto else None,
        "registered_architectures": len(archs) if archs is not None else None,
    }
    return facts, causes


def image_or_none(client, ref):
    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


def image_id(client, ref):
    image = image_or_none(client, ref)
    return image.id if image is not None else None


def run_verification(client, image, python, config_text, timeout):
    """Run VERIFY_SCRIPT in a throwaway container, entrypoint overridden, no network; return its output."""
    name = "vllm-image-verify-%s" % uuid.uuid4().hex[:10]
    env = {"VLLM_IMAGE_MODEL_CONFIG": config_text} if config_text else {}
    container = client.containers.create(
        image, entrypoint=[python, "-c", VERIFY_SCRIPT], command=[], environment=env, name=name, network_disabled=True
    )
    try:
        container.start()
        status = container.wait(timeout=timeout)
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    if VERIFY_BEGIN not in output:
        raise ImageError(
            "verification container exited %s without a result (is %s the image's Python?):\n%s"
            % (status.get("StatusCode"), python, output[-2000:])
        )
    return output


def missing_donor_paths(client, donor, paths):
    """Paths of graft.files absent from the donor image (checked in a created, never started container)."""
    container = client.containers.create(donor, entrypoint=["/bin/true"], command=[])
    missing = []
    try:
        for path in paths:
            try:
                stream, _stat = client.api.get_archive(container.id, path)
                getattr(stream, "close", lambda: None)()
            except NotFound:
                missing.append(path)
    finally:
        container.remove(force=True)
    return missing


class _Counter:
    """Iterates a docker save stream, counting bytes as they go to docker load."""

    def __init__(self, stream):
        self.stream = stream
        self.bytes = 0

    def __iter__(self):
        for chunk in self.stream:
            self.bytes += len(chunk)
            yield chunk


class CopyBroken(ImageError):
    """The stream between two engines broke; bytes_sent says how far it got, timed_out whether an engine
    stayed silent for the client's whole timeout (rather than hanging up)."""

    def __init__(self, cause, bytes_sent, timed_out=False):
        super().__init__(cause)
        self.bytes_sent = bytes_sent
        self.timed_out = timed_out


def _timed_out(exc):
    """Whether exc, or what it wraps (requests wraps urllib3 wraps socket), is a read or connect timeout."""
    seen = []
    while isinstance(exc, BaseException) and exc not in seen:
        seen.append(exc)
        if isinstance(exc, (socket.timeout, TimeoutError)) or type(exc).__name__ in ("ReadTimeoutError", "ReadTimeout"):
            return True
        wrapped = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        exc = exc.__cause__ or exc.__context__ or (wrapped[0] if wrapped else None)
    return False


def stream_image(source, target, ref):
    """docker save REF on source piped into docker load on target; returns the bytes moved."""
    counter = _Counter(())
    try:
        # docker save answers only once the engine has written the whole image to its temporary directory.
        counter.stream = source.api.get_image(ref, chunk_size=1 << 20)
        for event in target.api.load_image(iter(counter)):
            if isinstance(event, dict) and event.get("error"):
                raise ImageError("docker load failed: %s" % event["error"])
    except ImageError:
        raise
    # A peer's engine that stops mid-copy surfaces as a broken pipe (OSError) or a client error; an engine
    # silent for the client's timeout as a requests timeout (an OSError too).
    except (OSError, DockerException) as exc:
        raise CopyBroken("%s: %s" % (type(exc).__name__, exc), counter.bytes, _timed_out(exc)) from exc
    return counter.bytes


def build_image(client, tag, labels, buildargs=None, timeout=None, **source):
    """docker build; ImageError with the log tail on failure. source: path+dockerfile or fileobj (a tar)."""
    kwargs = {"tag": tag, "labels": labels, "buildargs": buildargs or {}, "rm": True, "forcerm": True}
    if timeout:
        kwargs["timeout"] = timeout
    if "fileobj" in source:
        kwargs.update(fileobj=source["fileobj"], custom_context=True)
    else:
        kwargs.update(path=source["path"], dockerfile=source.get("dockerfile") or "Dockerfile")
    try:
        image = client.images.build(**kwargs)[0]
    except DockerException as exc:
        detail = "".join(item.get("stream", "") for item in getattr(exc, "build_log", []) or [])
        raise ImageError("docker build of %s failed: %s\n%s" % (tag, exc, detail[-3000:])) from exc
    return image
