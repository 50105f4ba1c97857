# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pipelined chain copy of a model directory or an image to the workers (private; model_files, vllm_image).

The head streams one copy (a tar of the files some worker lacks, or `docker save` of the image) to the
first worker. Each worker takes what it needs (`tar -x` of its files, or `docker load`) and passes the same
bytes on to the next worker over SSH as they arrive. So the head sends one copy whatever the number of
workers, and the last worker ends about one hop's latency after the first. Worker-to-worker SSH uses the
head's key through agent forwarding (no key is copied to a worker) and the head's known host keys, passed
along in the hop's spec (nothing learned on first use). Each hop's spec reaches it as the first line of its
stdin, before the stream: a command line holds at most 128 KiB, and a spec for hundreds of files and
several hops is larger.

This file is also the relay. The head sends this file's own source to each hop (`python3 -c`), so a
worker needs python3, ssh and tar (or docker) only. Keep it standard-library only.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

CHUNK = 1 << 20
# What the head runs besides the source of the stream (tar or docker).
BINARIES = ("ssh", "ssh-agent", "ssh-add", "ssh-keygen")
BOOT = 'import base64,sys;exec(compile(base64.b64decode(sys.argv[1]),"dgx_spark_model_relay","exec"))'
# The forwarded key is needed only while the hops connect (all do at the start): it leaves the agent after
# this long even if the module is killed before it stops the agent.
KEY_SECONDS_BASE, KEY_SECONDS_PER_HOP = 60, 15
# tar reads the names NUL-separated and never as options (a file named "-C" or holding a newline).
NAME_LIST = ["--null", "--verbatim-files-from", "-T"]
# Detects a hop whose link or node died mid-stream instead of waiting on it forever.
# No connection sharing: a multiplexed master would forward its own agent, not the private one.
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"]
SSH_OPTIONS += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]


def needed(head_entries, target_entries):
    """Paths (in the head's order) whose size or fingerprint differs on the target, or that it lacks."""
    if target_entries is None:
        return [e["path"] for e in head_entries]
    theirs = {e["path"]: (e["size"], e.get("fingerprint")) for e in target_entries}
    return [e["path"] for e in head_entries if theirs.get(e["path"]) != (e["size"], e.get("fingerprint"))]


def extra(head_entries, target_entries):
    """Paths the target holds that the head does not (an older revision's shards): removed there."""
    ours = {e["path"] for e in head_entries}
    return [e["path"] for e in target_entries or [] if e["path"] not in ours]


def plan(head_entries, targets):
    """(hops, files): the targets that differ, each with its `extract` and `remove` lists, and the union sent."""
    hops = []
    for target in targets:
        extract, remove = needed(head_entries, target.get("manifest")), extra(head_entries, target.get("manifest"))
        if extract or remove:
            hops.append(dict(target, extract=extract, remove=remove))
    wanted = {path for hop in hops for path in hop["extract"]}
    return hops, [e["path"] for e in head_entries if e["path"] in wanted]


def encode(value):
    return base64.b64encode(value if isinstance(value, bytes) else json.dumps(value).encode("utf-8")).decode("ascii")


def hop_command(source_b64):
    """The remote command line for one hop: this file's source, base64 (no quoting); the spec comes on stdin."""
    return "python3 -c '%s' %s" % (BOOT, source_b64)


def header(spec):
    """The hop's spec as one line (JSON escapes any newline in a name), sent ahead of the tar stream."""
    return json.dumps(spec).encode("utf-8") + b"\n"


def name_list(workdir, paths):
    listing = os.path.join(workdir, "files")
    with open(listing, "wb") as handle:
        handle.write(b"".join(path.encode("utf-8") + b"\0" for path in paths))
    return listing


HOP_KEYS = ("host", "address", "path", "extract", "remove", "load")


def hop_spec(hops, index=0):
    """What hop `index` needs: its sink (path, extract and remove; or load) and the rest of the chain."""
    spec = {key: hops[index][key] for key in HOP_KEYS if key in hops[index]}
    return dict(spec, rest=[hop_spec(hops, index + 1)] if index + 1 < len(hops) else [])


def hosts_after(spec):
    """The hosts the stream goes on to from this hop, in order."""
    names, level = [], spec["rest"]
    while level:
        names.append(level[0]["host"])
        level = level[0]["rest"]
    return names


# Settings every hop shares, sent once per hop rather than nested in each level.
COMMON = ("user", "known_hosts", "connect_timeout", "idle_timeout")


def destination(user, address):
    # The relay runs alone on a worker (no _ssh there); ssh, unlike rsync, takes an IPv6 address bare.
    return "%s@%s" % (user, address)


def not_reached(hosts, why):
    return [dict(host=h, ok=False, bytes=0, files=0, seconds=0.0, error=why) for h in hosts]


def finish_downstream(down, err_file, next_hosts, sent=0):
    """Reports of the rest of the chain: its own JSON line, or why the stream to it ended (with the `sent` bytes
    passed into it: a hop whose node died reports nothing itself)."""
    out = down.stdout.read()
    down.wait()
    err_file.seek(0)
    err = err_file.read().decode("utf-8", "replace").strip()
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        reports = json.loads(lines[-1])
        if isinstance(reports, list) and len(reports) == len(next_hosts):
            return reports
    except (IndexError, ValueError):
        pass
    first, rest = next_hosts[0], next_hosts[1:]
    why = "the stream to %s ended (ssh rc %d): %s" % (first, down.returncode, err[-300:] or "no answer")
    reports = not_reached([first], why) + not_reached(rest, "not reached: the stream to %s ended" % first)
    reports[0]["bytes"] = sent
    return reports


def start_downstream(spec, source_b64, ssh, workdir, err_file):
    """ssh to the next hop, with the head's host keys for its address and the forwarded agent; its spec sent."""
    rest = dict(spec["rest"][0], **{key: spec[key] for key in COMMON})
    known = os.path.join(workdir, "known_hosts")
    with open(known, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in spec["known_hosts"].get(rest["address"], [])))
    argv = [ssh, *forward(rest), "-T", *SSH_OPTIONS, "-o", "ConnectTimeout=%d" % spec["connect_timeout"]]
    argv += ["-o", "UserKnownHostsFile=%s" % known, "-o", "GlobalKnownHostsFile=/dev/null"]
    argv += ["-o", "StrictHostKeyChecking=yes"]
    argv += [destination(spec["user"], rest["address"]), hop_command(source_b64)]
    down = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_file)
    return down, write(down.stdin, header(rest))


def forward(spec):
    """-A only for a hop that connects on to another: the last one needs no agent."""
    return ["-A"] if spec["rest"] else []


class Stall:
    """Kills `procs` when a watched step makes no progress for `seconds` (None: never). A frozen engine or disk
    holds the stream while SSH's keepalives still answer."""

    def __init__(self, seconds, procs):
        self.seconds, self.procs, self.since, self.fired = seconds, procs, None, False
        self.done = threading.Event()
        if seconds:
            threading.Thread(target=self.watch, daemon=True).start()

    def begin(self):
        self.since = time.monotonic()

    def end(self):
        self.since = None

    def watch(self):
        while not self.done.wait(0.5):
            since = self.since
            if since is not None and time.monotonic() - since > self.seconds:
                self.fired = True
                for proc in self.procs:
                    with contextlib.suppress(OSError):
                        proc.kill()
                return

    def stop(self):
        self.done.set()


def remove_extra(spec):
    """Delete the files the head does not hold, inside the model directory only."""
    root = os.path.realpath(spec["path"])
    for rel in spec["remove"]:
        full = os.path.realpath(os.path.join(root, rel))
        if full.startswith(root + os.sep) and os.path.isfile(full):
            os.remove(full)


def start_sink(spec, workdir, err_file):
    """docker load (an image hop), or tar -x of this hop's files; None when it lacks none (tar given no names
    would write every one)."""
    if spec.get("load"):
        return subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=err_file, stderr=err_file)
    os.makedirs(spec["path"], exist_ok=True)
    remove_extra(spec)
    if not spec["extract"]:
        return None
    listing = name_list(workdir, spec["extract"])
    argv = ["tar", "-x", "-f", "-", "-C", spec["path"], "--no-same-owner", *NAME_LIST, listing]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err_file)


def write(pipe, chunk):
    """False when the reader is gone; the stream goes on to the others."""
    try:
        pipe.write(chunk)
        return True
    except OSError:
        return False


def relay(spec, source, source_b64, ssh="ssh"):
    """Write this hop's files (or load its image) from `source` while passing every byte on; the chain's reports."""
    started = time.monotonic()
    me = dict(host=spec["host"], ok=False, bytes=0, files=len(spec.get("extract", [])), seconds=0.0, error="")
    next_hosts = hosts_after(spec)
    with tempfile.TemporaryDirectory(prefix="dgx-spark-relay-") as workdir, contextlib.ExitStack() as stack:
        down_err = stack.enter_context(tempfile.TemporaryFile(dir=workdir))
        sink_err = stack.enter_context(tempfile.TemporaryFile(dir=workdir))
        down, down_open = start_downstream(spec, source_b64, ssh, workdir, down_err) if spec["rest"] else (None, False)
        try:
            sink = start_sink(spec, workdir, sink_err)
        except OSError as exc:
            why = "cannot start docker load" if spec.get("load") else "cannot write %s" % spec["path"]
            sink, me["error"] = None, "%s: %s" % (why, exc)
        else:
            me["ok"] = sink is None
        sink_open = sink is not None
        # Only this hop's own sink is watched: a stalled upstream is the hop before's to find.
        stall = Stall(spec.get("idle_timeout"), [sink] if sink is not None else [])
        passed = 0
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                break
            me["bytes"] += len(chunk)
            # Downstream first, so the next node starts on a chunk before this disk takes it (the writes are in
            # turn: a disk slower than the link here holds the rest back too).
            down_open = down_open and write(down.stdin, chunk)
            passed += len(chunk) if down_open else 0
            stall.begin()
            sink_open = sink_open and write(sink.stdin, chunk)
            stall.end()
            if (sink is not None or me["error"]) and not (sink_open or down_open):
                # This hop's sink died (or never started) and no hop after it takes the rest: stop reading, so
                # the head learns of it now and not after the whole stream.
                break
        stall.stop()
        for proc in (sink, down):
            if proc is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        if sink is not None:
            rc = sink.wait()
            sink_err.seek(0)
            problem = sink_err.read().decode("utf-8", "replace").strip()
            me["ok"] = rc == 0
            what = "docker load" if spec.get("load") else "tar -x into %s" % spec["path"]
            if stall.fired:
                me["error"] = "%s took no bytes for %g s (a frozen engine or disk): stopped; the stream went on" % (
                    what,
                    spec["idle_timeout"],
                )
            elif rc != 0:
                me["error"] = "%s failed (rc %d): %s" % (what, rc, problem[-300:] or "no message")
        me["seconds"] = round(time.monotonic() - started, 2)
        reports = finish_downstream(down, down_err, next_hosts, passed) if down else []
    return [me, *reports]


def main():
    source_b64 = sys.argv[1]
    spec = json.loads(sys.stdin.buffer.readline())
    reports = relay(spec, sys.stdin.buffer, source_b64)
    sys.stdout.write(json.dumps(reports) + "\n")
    sys.stdout.flush()


# The head's side -------------------------------------------------------------------------------------


def own_source():
    """This file's text, to send to each hop (a module's module_utils sit in a zip: ask the loader)."""
    return inspect.getsource(sys.modules[__name__])


GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


def known_host_lines(ssh_keygen, known_hosts_files, addresses):
    """{address: [known_hosts lines]} from the head's files (hashed entries too), for the hops' checks."""
    lines = {}
    for address in addresses:
        lines[address] = []
        for known_hosts in filter(os.path.isfile, known_hosts_files):
            found = subprocess.run([ssh_keygen, "-F", address, "-f", known_hosts], capture_output=True, check=False)
            text = found.stdout.decode("utf-8", "replace")
            lines[address] += [line for line in text.splitlines() if line and not line.startswith("#")]
    return lines


class Agent:
    """A private ssh-agent holding the head's key for the copy's length: forwarded, never copied."""

    def __init__(self, agent, add, key, workdir, seconds):
        self.sock = os.path.join(workdir, "agent.sock")
        argv = [agent, "-D", "-a", self.sock]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # It prints its SSH_AUTH_SOCK line once it listens (or its error, and exits).
        said = self.proc.stdout.readline().decode("utf-8", "replace").strip()
        if not said.startswith("SSH_AUTH_SOCK="):
            self.stop()
            raise RuntimeError("ssh-agent did not start (%s)" % (said or "rc %s" % self.proc.poll()))
        added = subprocess.run([add, "-q", "-t", str(seconds), key], env=self.env(), capture_output=True, check=False)
        if added.returncode != 0:
            self.stop()
            raise RuntimeError("ssh-add %s failed: %s" % (key, added.stderr.decode("utf-8", "replace").strip()))

    def env(self):
        return dict(os.environ, SSH_AUTH_SOCK=self.sock, LC_ALL="C")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def unknown_hosts(hops, known_hosts):
    """The relayed hops whose address the head has no host key for: their relays would have to trust on first use."""
    return ["%s (%s)" % (h["host"], h["address"]) for h in hops[1:] if not known_hosts.get(h["address"])]


def tar_source(tar, path, files):
    """The model's stream: tar -c of `files` under `path` (send's `source`)."""

    def argv(workdir):
        return [tar, "-c", "-f", "-", "-C", path, *NAME_LIST, name_list(workdir, files)], "tar -c of " + path

    return argv


def image_source(docker, docker_host, ref):
    """The image's stream: docker save of `ref` from the engine at `docker_host` (send's `source`)."""
    return lambda _workdir: ([docker, "-H", docker_host, "save", ref], "docker save of " + ref)


def send(source, hops, *, bins, ssh_argv, user, key, known_hosts, fallback, connect_timeout=5, idle_timeout=None):
    """Stream `source` (tar_source, image_source) down the chain `hops`; one report per hop (host, ok, bytes,
    files, seconds, error) and source_error.

    ssh_argv: the head's ssh command line up to the destination (_ssh.client_argv). Raises RuntimeError, before
    anything starts, when the head knows no host key for a relayed hop (`fallback`: the setting that avoids it).
    idle_timeout: seconds without a byte moving before the stream is stopped (here); a hop stops a sink that takes
    nothing for half of it, so the others still get the stream; None waits as long as the stream lasts.
    `stalled` says when this node stopped it."""
    files_known = [known_hosts or os.path.expanduser("~/.ssh/known_hosts"), GLOBAL_KNOWN_HOSTS]
    lines = known_host_lines(bins["ssh-keygen"], files_known, [h["address"] for h in hops[1:]])
    unknown = unknown_hosts(hops, lines)
    if unknown:
        raise RuntimeError(
            "no host key for %s in %s: a worker passes the stream on only to a host key the head knows. Run the "
            "preflight stage (it records each worker's host key on the head) or set %s"
            % (", ".join(unknown), " or ".join(files_known), fallback)
        )
    spec = dict(hop_spec(hops), user=user, known_hosts=lines, connect_timeout=connect_timeout)
    # A hop stops its own frozen sink in half the time, before this node would stop the whole stream.
    spec["idle_timeout"] = idle_timeout / 2.0 if idle_timeout else None
    source_b64 = encode(own_source().encode("utf-8"))
    with tempfile.TemporaryDirectory(prefix="dgx-spark-chain-") as workdir, contextlib.ExitStack() as stack:
        seconds = KEY_SECONDS_BASE + KEY_SECONDS_PER_HOP * len(hops)
        agent = Agent(bins["ssh-agent"], bins["ssh-add"], key, workdir, seconds)
        stack.callback(agent.stop)
        source_err = stack.enter_context(tempfile.TemporaryFile(dir=workdir))
        ssh_err = stack.enter_context(tempfile.TemporaryFile(dir=workdir))
        ssh = [*ssh_argv, *forward(spec), "-T", *SSH_OPTIONS, destination(user, hops[0]["address"])]
        ssh.append(hop_command(source_b64))
        source_argv, what = source(workdir)
        first, producer = start_first(ssh, source_argv, header(spec), env=agent.env(), errors=(ssh_err, source_err))
        stall = Stall(idle_timeout, [first, producer] if producer else [first])
        pumped = pump(producer, first, stall) if producer else 0
        stall.stop()
        reports = finish_downstream(first, ssh_err, [h["host"] for h in hops], pumped)
        rc = producer.wait() if producer else 0
        source_err.seek(0)
        problem = source_err.read().decode("utf-8", "replace").strip()
    # A source killed by SIGPIPE after a hop stopped reading is that hop's failure, already reported.
    cut_off = (rc == -13 and not all(r["ok"] for r in reports)) or stall.fired
    source_error = "" if rc == 0 or cut_off else "%s failed (rc %d): %s" % (what, rc, problem[-300:])
    stalled = "no byte moved for %d s: the stream was stopped" % idle_timeout if stall.fired else ""
    return dict(reports=reports, source_error=source_error, stalled=stalled)


def start_first(ssh_argv, source_argv, spec_line, *, env, errors):
    """The first hop's ssh, fed the spec line, and the source (its stream goes through pump): (ssh, source;
    None when ssh died first)."""
    ssh_err, source_err = errors
    first = subprocess.Popen(ssh_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=ssh_err, env=env)
    try:
        if not (write(first.stdin, spec_line) and flush(first.stdin)):
            return first, None
        return first, subprocess.Popen(source_argv, stdout=subprocess.PIPE, stderr=source_err)
    except OSError:
        first.kill()
        first.wait()
        raise


def flush(pipe):
    try:
        pipe.flush()
        return True
    except OSError:
        return False


def pump(producer, first, stall):
    """Pass the source's stream to the first hop; the bytes it took (what the head sent, counted here because a
    hop whose node dies mid-stream reports nothing). Any step without progress is watched, a source that sends
    nothing included (docker save stages the whole image first: the timeout must allow for that)."""
    sent = 0
    while True:
        stall.begin()
        chunk = producer.stdout.read(CHUNK)
        if not chunk or not write(first.stdin, chunk):
            break
        sent += len(chunk)
    # A source still writing gets SIGPIPE rather than blocking on a pipe nobody reads.
    producer.stdout.close()
    with contextlib.suppress(OSError):
        first.stdin.close()
    return sent


if __name__ == "__main__" and len(sys.argv) == 2:
    main()
