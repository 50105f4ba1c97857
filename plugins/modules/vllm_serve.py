#!/usr/bin/python
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`vllm serve` inside the Ray head container, verified through its HTTP endpoints."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_serve
short_description: Run vllm serve on the Ray head and verify the endpoint
description:
  - Starts C(vllm serve) inside the running Ray head container (C(docker exec -d)), with its output
    in a log file inside the container and C(--distributed-executor-backend ray), so the engine's
    workers spread over the Ray cluster.
  - Every extra flag is checked before anything starts, against the flags the installed vLLM lists in
    its own C(vllm serve --help=all) (asked inside the running head container, or in a throwaway
    container of O(image)), read as vLLM reads them (C(--max_model_len) is C(--max-model-len), C(-O3)
    is C(--optimization-level)). An unknown flag is refused with the engine's version, the image and
    the closest valid name. Flags the module sets itself, C(--hf-token) and shell line fragments are
    refused in O(extra_args).
  - The engine's answer is kept per image ID in O(flag_cache_dir) on the node (asking takes tens of
    seconds, as importing vLLM is slow), so later runs with the same image do not ask again.
  - With O(state=checked), before the image is on the node, the check is deferred (static checks only;
    flags unknown to the built-in table are warnings) and done again with O(state=started).
  - Idempotent by a hash of the arguments and environment, kept in a state file in the container.
    Same arguments, process alive and the serving probe passing leave the server alone; different
    arguments restart the serve process.
  - The serving probe asks what a user asks, inside one deadline (O(probe_timeout)), that is C(/health),
    C(/v1/models) (O(served_model_name) listed), C(/version) and one bounded completion. An engine whose
    C(/health) answers 200 while its completions hang fails it. It runs in check mode too (it only reads),
    so a drift run reports a failed probe as a change and changes nothing.
  - The watchdog. An engine that failed its probe or whose serve process died is restarted (the whole
    process group of the old server, so the engine core, its Ray driver and with it the Ray actors on
    every node end with it), after a backoff that doubles with each restart in O(restart_window). When
    O(max_restarts) restarts already happened in that window it is a crash loop, and the module fails with
    the engine's last log lines and does not restart it again. Restarts for changed settings do not count.
  - After a (re)start it waits for C(/health) to answer 200 (failing early, with the log, when the process
    dies), then runs the probe with one chat completion sent alongside (the engine batches the two).
version_added: 0.1.0
author: dgx_spark.vllm contributors (@dgx-spark)
extends_documentation_fragment:
  - dgx_spark.vllm.docker
  - dgx_spark.vllm.container
  - dgx_spark.vllm.stage_record
  - dgx_spark.vllm.attributes.STATEFUL
options:
  container:
    description: The Ray head container on this node.
    type: str
    default: ray-head
  state:
    description:
      - V(started) runs and verifies the server.
      - V(absent) stops the serve process (the container stays).
      - V(checked) only validates the arguments and that the port is free (unless this module's server
        holds it), for preflight, and returns the command line.
    type: str
    choices: [started, absent, checked]
    default: started
  model:
    description: Model path inside the container (or a hub id the engine can resolve).
    type: str
  served_model_name:
    description: Name clients send as C(model).
    type: str
  tensor_parallel_size:
    description: C(--tensor-parallel-size).
    type: int
    default: 1
  pipeline_parallel_size:
    description: C(--pipeline-parallel-size).
    type: int
    default: 1
  host:
    description: Address the API server binds to.
    type: str
    default: 0.0.0.0
  port:
    description: API server port.
    type: int
    default: 8000
  max_model_len:
    description: C(--max-model-len); the model's own limit when omitted.
    type: int
  gpu_memory_utilization:
    description: C(--gpu-memory-utilization), a fraction between 0 and 1.
    type: float
  api_key:
    description: API key the server requires; passed as the environment variable C(VLLM_API_KEY), never in argv.
    type: str
  extra_args:
    description: More C(vllm serve) arguments, one per item (e.g. C(--reasoning-parser), C(qwen3)).
    type: list
    elements: str
    default: []
  env:
    description: Extra environment for the serve process.
    type: dict
    default: {}
  placement_strategy:
    description:
      - Ray placement group strategy written to C(VLLM_DISTRIBUTED_EXECUTOR_CONFIG); V(none) sets nothing.
      - Upstream vLLM does not read this variable (its Ray executor uses PACK, which still spreads
        one-GPU nodes, as in the lab); community DGX Spark builds do.
    type: str
    choices: [SPREAD, STRICT_SPREAD, PACK, STRICT_PACK, none]
    default: SPREAD
  flag_source:
    description:
      - What O(extra_args) and the module's own flags are checked against.
      - V(installed) asks the installed engine (C(vllm serve --help=all)); when it cannot be asked
        (no answer, no help text, or a help text without the flags this module emits) the module fails
        with the reason.
      - V(builtin) uses the flag table this collection keeps, taken from vLLM 0.33.0's help, and never
        asks the engine.
    type: str
    choices: [installed, builtin]
    default: installed
  image:
    description:
      - The image the server will run (ID or name), as the node's engine knows it.
      - With O(state=checked), when the head container is not running or runs another image, a throwaway
        container of this image is asked for its flags (entrypoint overridden, network off, the node's
        GPUs when its engine has a GPU runtime). When the image is not on the node yet the check is deferred.
      - Not used with O(state=started), which asks the running head container.
    type: str
  flag_cache_dir:
    description:
      - Directory on the node for the engines' answers, one file per image ID (C(<digest>.json)), created
        with mode 0700 and files with mode 0600. Not written in check mode.
    type: path
    default: /var/lib/dgx-spark/vllm-flags
  python:
    description: Python interpreter inside the container.
    type: str
    default: python3
  log_file:
    description: Log file of the serve process, inside the container.
    type: path
    default: /tmp/dgx-spark-vllm-serve.log
  state_file:
    description: State file (PID and argument hash), inside the container.
    type: path
    default: /tmp/dgx-spark-vllm-serve.json
  health_timeout:
    description: Seconds to wait for C(/health) to answer 200 (loading a large model takes minutes).
    type: int
    default: 1800
  stop_timeout:
    description: Seconds to wait for the old process to exit after SIGTERM before SIGKILL.
    type: int
    default: 60
  request_timeout:
    description: Seconds one HTTP request may take (the completion included).
    type: int
    default: 120
  smoke_prompt:
    description: Prompt of the verification completion.
    type: str
    default: "The capital of France is"
  smoke_max_tokens:
    description: Tokens of the verification completion.
    type: int
    default: 16
  log_lines:
    description: Lines of the serve log included in a failure.
    type: int
    default: 60
  probe_timeout:
    description: Seconds the whole serving probe of a running server may take, its completion included.
    type: int
    default: 60
  ray_gpus:
    description:
      - With O(backend=ray), the GPUs the Ray cluster reports alive (the ray_cluster stage's wait). Fewer than
        O(tensor_parallel_size) x O(pipeline_parallel_size) is refused before vllm serve starts, naming both.
      - Omitted, Ray's GPUs are not checked here.
    type: float
  probed:
    description:
      - With O(backend=mp) on the head, the probe the plan step (O(state=checked)) of this same run returned.
        When it passed and the rank is left as it is, the started step reports it instead of probing again
        (one completion per run, not two).
      - With O(backend=ray), the probe this same run made of the running server a moment ago (the deploy's
        stage probe, M(dgx_spark.vllm.stage_state) with O(dgx_spark.vllm.stage_state#module:endpoint)); with the
        same settings and the serve process alive it is taken as this module's own, so a server whose
        completion hangs is not waited out twice.
    type: dict
  max_restarts:
    description: Watchdog restarts (failed probe or dead engine) allowed in O(restart_window); one more is a crash loop.
    type: int
    default: 3
  restart_window:
    description: Seconds over which the watchdog counts its restarts.
    type: int
    default: 3600
  restart_backoff:
    description:
      - Seconds the watchdog waits after its newest restart before the next, doubled for each restart in
        O(restart_window) (the first restart in the window is at once).
    type: int
    default: 30
  restart_history:
    description: File on the head where the watchdog keeps its restarts (time and reason).
    type: path
    default: /var/lib/dgx-spark/vllm-restarts.json
  port_owners:
    description:
      - Other containers of this collection on this node whose server may hold O(port) (the other backend's).
        While one runs, O(state=checked) does not require the port to be free (the deploy stops it first).
    type: list
    elements: str
    default: []
  backend:
    description:
      - V(ray) runs C(vllm serve) inside the running Ray head container (O(container)), its workers placed
        over the Ray cluster.
      - V(mp) runs vLLM's own multiprocessing backend across nodes without Ray. The module runs on every node
        and makes this node's rank a container (O(container)) whose main process is C(vllm serve) with
        C(--nnodes), C(--node-rank), C(--master-addr) and C(--master-port) (C(--headless) on ranks above 0),
        with the container contract of M(dgx_spark.vllm.ray_node) (ENTRYPOINT overridden and reported, host
        network and IPC, C(--init), restart policy, GPUs, RDMA devices, O(container_env), O(mounts)).
        Idempotent by a label holding a hash of the container configuration (image ID included; the key
        only as its hash). Rank 0 waits for C(/health) while watching its own container and every rank's in
        O(workers), and fails at once when one exits or restarts, naming its node; on a timeout it names
        the ranks whose log shows they never joined.
    type: str
    choices: [ray, mp]
    default: ray
  nnodes:
    description: backend=mp. Number of nodes (ranks), C(--nnodes).
    type: int
    default: 1
  node_rank:
    description: backend=mp. This node's rank, C(--node-rank); 0 is the head, which serves the API.
    type: int
    default: 0
  master_addr:
    description: backend=mp. The head's fabric address, C(--master-addr). Required when O(nnodes) is above 1.
    type: str
  master_port:
    description: backend=mp. Port of the head's rendezvous, C(--master-port).
    type: int
    default: 29501
  workers:
    description: backend=mp, rank 0. The worker ranks to watch while waiting, through each node's Docker engine.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: Inventory name of the node.
        type: str
        required: true
      rank:
        description: Its rank.
        type: int
        required: true
      container:
        description: Its rank container.
        type: str
        required: true
      docker_host:
        description: Its Docker engine, as the head reaches it (C(ssh://USER@FABRIC_IP)).
        type: str
        required: true
  force_restart:
    description:
      - backend=mp. Recreate the rank container even when its configuration is unchanged (every rank
        restarts together, as a new head needs new ranks).
    type: bool
    default: false
  container_env:
    description:
      - backend=mp. Environment of the rank container, over the entries of O(env_file) (the fabric's
        C(/etc/dgx-spark/nccl.env)); O(env) is added to it.
    type: dict
    default: {}
  node_memory:
    description:
      - Each node the layout spans (one GPU each, as a Spark's GB10), with its C(/proc/meminfo) text. With it, the
        model's weights (split evenly over these nodes) and the KV cache of one O(max_model_len) sequence (from
        C(config.json), as vLLM sizes it) are held against MemTotal x O(gpu_memory_utilization) (vLLM's default
        when unset) on every node, and a layout that cannot fit is refused before anything starts.
      - The weights' size comes from the model directory on this node (its index's C(metadata.total_size), else its
        C(*.safetensors)); before the model is there, from the hub's file list (O(hub_repo_id)); when neither can
        tell, the check is deferred (it runs again with O(state=started), and on mp ranks, once the model is there).
      - Empty skips the check.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: Inventory name of the node.
        type: str
        required: true
      meminfo:
        description: The node's C(/proc/meminfo).
        type: str
        required: true
  hub_repo_id:
    description: The Hugging Face repository the model is downloaded from; only asked for its file sizes.
    type: str
  hub_revision:
    description: Revision of O(hub_repo_id).
    type: str
  hub_token:
    description: Token for O(hub_repo_id).
    type: str
  record_facts:
    description:
      - With O(record), the facts the stages record from what this serve found (RV(found)), as fact name and
        key of RV(found); each goes to the stage whose C(fact_names) holds it.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Serve Qwen3.5 over both Sparks
  dgx_spark.vllm.vllm_serve:
    container: ray-head
    model: /models/Qwen3.5-122B-A10B-FP8
    served_model_name: qwen3.5-122b
    tensor_parallel_size: 2
    max_model_len: 65536
    gpu_memory_utilization: 0.8
    api_key: "{{ vault_vllm_api_key }}"
    extra_args: [--reasoning-parser, qwen3, --enable-prefix-caching]

- name: Check the flags against the image before anything starts (preflight)
  dgx_spark.vllm.vllm_serve:
    state: checked
    image: dgx-spark/vllm-runtime:in-service
    model: /models/Qwen3.5-122B-A10B-FP8
    served_model_name: qwen3.5-122b
    tensor_parallel_size: 2
    extra_args: [--reasoning-parser, qwen3, --max_num_seqs=8, -O3]
"""

RETURN = r"""
endpoint:
  description: Base URL of the OpenAI-compatible API, as seen from the head node.
  returned: when state is started
  type: str
  sample: http://127.0.0.1:8000/v1
model:
  description: The served model name.
  returned: when state is started
  type: str
command:
  description: The C(vllm serve) command line (no secrets).
  returned: always
  type: list
  elements: str
args_hash:
  description: Hash of the arguments and environment.
  returned: always
  type: str
pid:
  description: PID of the serve process inside the container.
  returned: when state is started
  type: int
flag_check:
  description:
    - What the flags were checked against; empty with O(state=absent).
    - C(installed vLLM <version> (image <id>, <how>)), where how is C(cached), C(asked the running container <name>)
      or C(asked a throwaway container of <image>); C(built-in table of vLLM 0.33.0 (flag_source=builtin));
      or C(deferred (<why>; checked again before serving)).
    - "When the engine could not be asked (the module then fails): C(not asked: <why>)."
  returned: always
  type: str
  sample: installed vLLM 0.32.0 (image sha256:a9d32715c8c0, cached)
vllm_version:
  description: The installed vLLM's version, as the engine reported it when asked for its flags.
  returned: when the installed engine was asked or its cached answer used
  type: str
  sample: 0.32.0
completion:
  description: Text of the probe's completion (C(/v1/completions)).
  returned: when state is started and the probe passed
  type: str
probe:
  description:
    - The serving probe of the running server (before any restart; the deploy's failed warm check when it
      passes one as O(probed)), or the full probe after a (re)start.
    - ok, step (the step that failed), why, health (C(/health)'s status), models, owned_by, engine_version,
      text, latency_s and tokens of the completion, seconds.
  returned: when state is started and a server was running or was started
  type: dict
  sample: {ok: false, step: completion, why: "no completion within 60s although /health answered 200: the engine hangs",
           health: 200, latency_s: 60.0, seconds: 60.1}
watchdog:
  description:
    - Set when the engine failed (its probe, or its serve process died) and the module restarts it, or
      refuses to. Keys why, decision (V(restart) or V(crash_loop)), recent_restarts in the window, backoff_s waited.
  returned: when the watchdog acted
  type: dict
chat_completion:
  description:
    - Text of the verification chat completion (C(/v1/chat/completions)); its reasoning when it has no content.
    - Sent only after a (re)start; a server left alone is judged by the probe.
  returned: when state is started and the server was (re)started
  type: str
engine:
  description: The engine that serves, as it names itself (C(owned_by) in C(/v1/models)) and its C(/version).
  returned: when state is started and the probe passed
  type: str
  sample: vllm 0.33.0
layout_check:
  description:
    - The parallel layout against the model's C(config.json) on this node (head counts and layers, as vLLM
      splits them); C(deferred) while the model is not there yet (it is checked again before serving).
  returned: when state is started or checked
  type: str
  sample: fits /var/lib/dgx-spark/models/lab-qwen3.5-moe-tiny/config.json
memory_fit:
  description:
    - The memory check (O(node_memory)); check is C(fits <numbers>), C(refused), C(deferred <why>) or C(skipped <why>)
      (each followed by a colon), with the numbers in bytes (weights_bytes, weights_source, weights_per_node_bytes,
      kv_per_node_bytes, need_per_node_bytes, max_model_len, gpu_memory_utilization, kv, ranks_per_node, nodes with
      host, mem_total_bytes and budget_bytes).
  returned: when state is started or checked and no other input was refused first
  type: dict
  sample: {check: "fits: 56.24 GiB needed per node, 96.80 GiB allowed on the tightest", weights_bytes: 119000000000}
timings:
  description:
    - Seconds per stage (flag_check, stop, start, health, probe, chat).
    - C(flag_check) takes tens of seconds when the engine is asked, well under a second with a cached answer.
  returned: always
  type: dict
actions:
  description: What was done (V(started), V(restarted), V(stopped)); empty when nothing changed.
  returned: always
  type: list
  elements: str
found:
  description:
    - What a successful O(state=started) found for later runs to keep - C(engine) (as RV(engine), when it was
      asked) and C(memory_fit) (as RV(memory_fit), when it was checked, not skipped).
  returned: when state is started and the serve succeeded
  type: dict
  sample: {engine: vllm 0.33.0}
record:
  description: What O(record) recorded, as M(dgx_spark.vllm.ray_node)'s RV(dgx_spark.vllm.ray_node#module:record).
  returned: when O(record) is given, O(state=started), the serve succeeded and not in check mode
  type: dict
ray_gpus_alive:
  description:
    - GPUs Ray listed alive when the watchdog was about to restart a failed engine (backend ray), from one read
      of the GCS node table. Fewer than tensor x pipeline parallel size fails, naming them, instead of starting an
      engine that waits for a GPU Ray does not have.
  returned: before a watchdog restart over Ray
  type: float
"""

import contextlib
import json
import os
import socket
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.dgx_spark.vllm.plugins.module_utils import (
    _container,
    _image,
    _layout,
    _memory_fit,
    _probe,
    _ray,
    _vllm_args,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._docker import (
    DOCKER_COMMON_ARGS,
    WATCHED_CONTAINER_OPTIONS,
    DockerException,
    docker_client,
    find_container,
    log_tail,
    watch_containers,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._stage_state import (
    RECORD_OPTIONS,
    checked_record,
    record_group,
)
from ansible_collections.dgx_spark.vllm.plugins.module_utils._wait import StopWaiting, wait_for

try:
    from docker import types as docker_types
except ImportError:  # pragma: no cover - docker_client() reports the missing SDK
    docker_types = None

# Fixed programs run with `python3 -c`; all variable input travels as argv, never through a shell.
LAUNCH = (
    "import json, os, sys, time\n"
    "state, log, digest = sys.argv[1:4]\n"
    "argv = sys.argv[5:]\n"
    "fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
    "os.dup2(fd, 1)\n"
    "os.dup2(fd, 2)\n"
    "if os.getpgrp() != os.getpid():\n"
    "    os.setsid()\n"
    "with open(state + '.tmp', 'w') as f:\n"
    "    json.dump({'pid': os.getpid(), 'args_hash': digest, 'argv': argv, 'started': time.time()}, f)\n"
    "os.rename(state + '.tmp', state)\n"
    "os.execvp(argv[0], argv)\n"
)
STATUS = (
    "import json, os, sys\n"
    "try:\n"
    "    state = json.load(open(sys.argv[1]))\n"
    "except (OSError, ValueError):\n"
    "    state = None\n"
    "alive = False\n"
    "if state:\n"
    "    try:\n"
    "        with open('/proc/%d/stat' % state['pid']) as f:\n"
    "            alive = f.read().split(') ')[-1][:1] not in ('Z', 'X')\n"
    "    except OSError:\n"
    "        alive = False\n"
    "print(json.dumps({'state': state, 'alive': alive}))\n"
)
SIGNAL = "import os, sys\nos.killpg(int(sys.argv[1]), int(sys.argv[2]))\n"
# backend=mp: the label naming a rank container's rank.
ROLE_LABEL = "dgx_spark.vllm.vllm_rank"


class VllmServe:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.timings = {}
        self.result = dict(changed=False, actions=[], timings=self.timings)
        self.container = None
        # The image ID whose engine was asked for its flags (or whose cached answer was used).
        self.flag_image = None

    # --- docker exec helpers -------------------------------------------------------------
    def exec_py(self, script, *args, **kwargs):
        try:
            res = self.container.exec_run([self.p["python"], "-c", script, *[str(a) for a in args]], **kwargs)
        except DockerException as exc:
            self.fail("docker exec in %s failed: %s" % (self.p["container"], exc))
        out = res.output if res.output is not None else b""
        return res.exit_code, out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)

    def status(self):
        code, out = self.exec_py(STATUS, self.p["state_file"])
        try:
            return json.loads(out.strip().splitlines()[-1]) if code == 0 else {"state": None, "alive": False}
        except (ValueError, IndexError):
            return {"state": None, "alive": False}

    def log_tail(self):
        try:
            res = self.container.exec_run(["tail", "-n", str(self.p["log_lines"]), self.p["log_file"]])
        except DockerException as exc:
            return "(log not readable: %s)" % exc
        out = res.output or b""
        return out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)

    def fail(self, msg, **extra):
        out = dict(self.result)
        out.update(extra)
        self.module.fail_json(msg=msg, **out)

    def finish(self):
        """Exit with the result. A successful start reports what it found for later runs and, given O(record),
        records the stage group it ends on this node (the deploy's, which then needs no task of its own)."""
        if self.p["state"] == "started":
            found = {key: self.result.get(key) for key in ("engine", "memory_fit")}
            if str((found["memory_fit"] or {}).get("check", "skipped")).startswith("skipped"):
                # A skipped check found nothing: the fit an earlier run found holds.
                found["memory_fit"] = None
            self.result["found"] = {key: value for key, value in found.items() if value is not None}
            if self.p["record"] and not self.module.check_mode:
                facts = {
                    name: self.result["found"][key]
                    for name, key in self.p["record_facts"].items()
                    if key in self.result["found"]
                }
                self.result["record"] = record_group(self.module, self.p["record"], facts)
        self.module.exit_json(**self.result)

    # --- stages ----------------------------------------------------------------------------
    def run(self):
        if self.p["backend"] == "mp":
            return MpRank(self.module).run()
        argv = _vllm_args.serve_argv(self.p) if self.p["state"] != "absent" else []
        env = _vllm_args.serve_env(self.p) if self.p["state"] != "absent" else {}
        digest = _vllm_args.args_hash(argv, env)
        self.result.update(command=argv, args_hash=digest, flag_check="")
        if self.p["state"] != "absent":
            self.check_input()
        client = docker_client(self.module)
        self.container = find_container(client, self.p["container"])
        running = self.container is not None and self.container.status == "running"
        if not running and self.p["state"] == "started":
            self.fail(
                "The Ray head container %s is not running on this node; vllm serve runs inside it. "
                "Run the ray_cluster role first." % self.p["container"]
            )
        if self.p["state"] != "absent":
            self.check_flags(client, argv, running)
        if self.p["state"] == "checked":
            # Preflight: the port must be free unless our own server already holds it.
            if not (running and self.status()["alive"]) and not self.port_owned(client):
                self.check_port_free()
            self.finish()
        if not running:
            self.finish()
        current = self.status()
        state = current["state"] or {}
        before = dict(args_hash=state.get("args_hash"), alive=current["alive"], command=state.get("argv"))
        if self.p["state"] == "absent":
            self.result["diff"] = dict(before=before, after=dict(alive=False))
            if current["alive"]:
                self.result.update(changed=True, actions=["stopped"])
                if not self.module.check_mode:
                    self.stop(state["pid"])
            self.finish()
        self.result["diff"] = dict(before=before, after=dict(args_hash=digest, alive=True, command=argv))
        same = state.get("args_hash") == digest
        probe = None
        if same and current["alive"]:
            # The deploy's stage probe asked this same server a moment ago: its failure is not waited out twice.
            probe = self.p["probed"] or self.probe()
            self.result["probe"] = probe
        if probe and probe["ok"]:
            self.result["pid"] = state["pid"]
            self.report(probe)
            self.finish()
        self.result["changed"] = True
        self.result["actions"].append("restarted" if current["alive"] else "started")
        failed = None
        if probe:
            failed = "the probe failed at %s: %s" % (probe["step"], probe["why"])
        elif same and state.get("pid"):
            failed = "the vllm serve process (pid %s) died" % state["pid"]
        if failed:
            self.watchdog(failed)
        if self.module.check_mode:
            self.finish()
        if failed:
            self.check_ray_gpus_alive()
        if current["alive"]:
            self.stop(state["pid"])
        elif state.get("pid"):
            # The serve process died, but its session (engine core, Ray driver) may live on and hold the
            # cluster's GPUs: end what is left of it before starting again.
            self.exec_py(SIGNAL, state["pid"], 9)
        self.check_port_free()
        self.start(argv, env, digest)
        self.wait_health()
        self.verify()
        self.finish()

    def check_ray_gpus_alive(self):
        """Before the watchdog restarts the engine: one read of Ray's node table. A deploy that found the
        ray_cluster stage converged did not ask Ray; a Ray node can be gone while its container runs (a hung
        raylet), and a restart would wait for GPUs that do not come."""
        need = self.p["tensor_parallel_size"] * self.p["pipeline_parallel_size"]
        code, out = self.exec_py(_ray.RAY_QUERY, 10)
        doc = _ray.parse_query_output(out) if code == 0 else None
        if doc is None:
            self.fail(
                "Not restarting vllm serve: the Ray head in %s did not answer a node query (exit %s): %s"
                % (self.p["container"], code, _last_lines(out, 5))
            )
        found = _ray.cluster_state(doc)
        self.result["ray_gpus_alive"] = found["gpus"]
        if found["gpus"] < need:
            self.fail(
                "Not restarting vllm serve: Ray has %g GPU(s) alive (nodes %s; dead: %s), and tensor_parallel_size x "
                "pipeline_parallel_size needs %d. A Ray node is gone although its container still runs: run the "
                "deploy with --tags ray_cluster, whose wait names the node, with its log."
                % (found["gpus"], sorted(n["ip"] for n in found["alive"]) or "none", found["dead_ips"] or "none", need)
            )

    def check_input(self):
        errors = []
        for key in ("model", "served_model_name"):
            if not self.p[key]:
                errors.append("%s: required to serve; set it in the model profile" % key)
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            if self.p[key] < 1:
                errors.append("%s: must be 1 or more, got %s" % (key, self.p[key]))
        gmu = self.p["gpu_memory_utilization"]
        if gmu is not None and not 0 < gmu <= 1:
            errors.append("gpu_memory_utilization: must be in (0, 1], got %s" % gmu)
        if not 0 < self.p["port"] < 65536:
            errors.append("port: %s is not a TCP port; use 1..65535 (vllm_server_port)" % self.p["port"])
        errors += self.ray_gpu_problems()
        if not errors:
            errors += self.layout_problems()
        if not errors:
            errors += self.memory_problems()
        if errors:
            self.fail("; ".join(errors))

    def ray_gpu_problems(self):
        """Ray's alive GPUs against TP x PP: vLLM would otherwise wait for a placement group Ray cannot give."""
        p = self.p
        wanted = p["tensor_parallel_size"] * p["pipeline_parallel_size"]
        if p["ray_gpus"] is None or p["ray_gpus"] >= wanted:
            return []
        return [
            "ray_gpus: the Ray cluster has %g GPUs alive, but tensor_parallel_size (%d) x pipeline_parallel_size (%d)"
            " needs %d; vLLM would wait for GPUs Ray does not have. Make the GPUs each node declares to Ray"
            " (cluster_gpus_per_node) add up to TP x PP, or lower"
            " vllm_server_tensor_parallel_size / vllm_server_pipeline_parallel_size"
            % (p["ray_gpus"], p["tensor_parallel_size"], p["pipeline_parallel_size"], wanted)
        ]

    def layout_problems(self):
        """The parallel layout against the model's config.json on this node (the same path in the container)."""
        try:
            config = _layout.read_config(self.p["model"])
        except (OSError, ValueError) as exc:
            return ["model: cannot read %s/config.json on this node: %s" % (self.p["model"], exc)]
        if config is None:
            self.result["layout_check"] = "deferred: no config.json in %s on this node yet" % self.p["model"]
            return []
        found = _layout.problems(config, self.p["tensor_parallel_size"], self.p["pipeline_parallel_size"])
        self.result["layout_check"] = "refused" if found else "fits %s/config.json" % self.p["model"]
        return found

    def memory_problems(self):
        """The weights and one max_model_len sequence against each node's memory (GB10: unified)."""
        p = self.p
        weights, source = _memory_fit.weights_size(p["model"], p["hub_repo_id"], p["hub_revision"], p["hub_token"])
        config = _layout.read_config(p["model"])
        found, self.result["memory_fit"] = _memory_fit.check(p, config, weights, source, p["node_memory"])
        return found

    def check_flags(self, client, argv, running):
        """Refuse bad extra_args before anything starts: static checks, then every flag against the
        flags the installed engine lists in its own `vllm serve --help=all` (or the built-in table)."""
        started = time.monotonic()
        extra = self.p["extra_args"]
        problems = _vllm_args.static_problems(extra)
        if self.p["flag_source"] == "builtin":
            known, where = _vllm_args.KNOWN_FLAGS, _vllm_args.builtin_where()
            self.result["flag_check"] = (
                "built-in table of vLLM %s (flag_source=builtin)" % _vllm_args.BUILTIN_TABLE_RELEASE
            )
        else:
            known, version, failure = self.engine_flags(client, running)
            where = _vllm_args.engine_where(version, self.flag_image)
            if failure:
                self.timings["flag_check"] = round(time.monotonic() - started, 2)
                self.fail("Refusing to start vllm serve: " + "; ".join([*problems, failure]))
        if known is None:
            # Deferred: the static checks only; what the built-in table does not know is a warning.
            for problem in _vllm_args.unknown_problems(extra, _vllm_args.KNOWN_FLAGS, _vllm_args.builtin_where()):
                self.module.warn("Not checked against the image yet (%s): %s" % (self.result["flag_check"], problem))
        else:
            problems += _vllm_args.unknown_problems(extra, known, where)
            for name in _vllm_args.flag_names(argv[3 : len(argv) - len(extra)]):
                if name not in known:
                    problems.append("%s has no %s flag, which this module emits; use an image with it" % (where, name))
        self.timings["flag_check"] = round(time.monotonic() - started, 2)
        if problems:
            self.fail("Refusing to start vllm serve: " + "; ".join(problems))

    def engine_flags(self, client, running):
        """(flags, vLLM version, None) of the engine that will serve, from the cache or by asking it;
        (None, None, None) when it cannot be asked yet (state=checked before the image is on the node);
        (None, version, why) when it cannot be asked."""
        p = self.p
        target = None
        # An mp rank's container is recreated from the image: the image is what serves, at every state.
        plan_state = "checked" if p["backend"] == "mp" else p["state"]
        if plan_state == "checked" and p["image"]:
            try:
                target = _image.image_id(client, p["image"])
            except DockerException as exc:
                self.fail("image: cannot inspect %s on this node: %s" % (p["image"], exc))
        current = self.container.attrs.get("Image") if running else None
        source, image_id, how = _vllm_args.ask_plan(plan_state, running, current, p["image"], target)
        if source == "deferred":
            self.result["flag_check"] = how
            return None, None, None
        if source == "container":
            how = "asked the running container %s" % p["container"]
        self.flag_image = image_id
        cached = _vllm_args.read_cache(p["flag_cache_dir"], image_id) if image_id else None
        if cached:
            flags, version, how = cached["flags"], cached["vllm_version"], "cached"
        else:
            if source == "container":
                code, output = self.exec_py(_vllm_args.INSTALLED_FLAGS_SCRIPT, self.ask_timeout())
            else:
                code, output = self.run_throwaway(client, image_id)
            answer, why = _vllm_args.read_answer(output)
            flags = version = None
            if answer is not None:
                flags, version, why = _vllm_args.flags_from_answer(answer)
            if flags is None:
                self.result["flag_check"] = "not asked: %s" % why
                return None, version, _vllm_args.ask_failure(image_id, how, why, code)
            if image_id and not self.module.check_mode:
                error = _vllm_args.write_cache(p["flag_cache_dir"], image_id, flags, version, answer.get("command"))
                if error:
                    self.module.warn("flag_cache_dir: the answer was not cached (%s); the next run asks again" % error)
        self.result["vllm_version"] = version
        self.result["flag_check"] = _vllm_args.flag_check_text(version, image_id, how)
        return flags, version, None

    def ask_timeout(self):
        # The help takes about 30 s (the import is slow); stay inside the Docker client's own timeout.
        return max(30, self.p["docker_timeout"] - 10)

    def run_throwaway(self, client, image_id):
        """Ask a throwaway container of the image: (exit code, output). The node's GPUs are given when
        its engine has a GPU runtime: a CUDA build of vLLM cannot build its parser without a device
        ("Failed to infer device type"); an engine without one (the lab) is asked without."""
        name = "dgx-spark-vllm-flag-check-%d" % os.getpid()
        kwargs = _vllm_args.throwaway_kwargs(image_id, self.p["python"], self.ask_timeout(), name)
        tries = [[docker_types.DeviceRequest(count=-1, capabilities=[["gpu"]])]] if docker_types else []
        for device_requests in [*tries, None]:
            try:
                if device_requests:
                    output = client.containers.run(device_requests=device_requests, **kwargs)
                else:
                    output = client.containers.run(**kwargs)
                return 0, output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
            except DockerException as exc:
                self.remove_leftover(client, name)
                if device_requests and "device driver" in str(exc):
                    continue  # no GPU runtime on this engine
                stderr = getattr(exc, "stderr", None)  # ContainerError: the script exited non-zero
                if stderr is None:
                    return None, "docker run failed: %s" % exc
                text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else str(stderr)
                return getattr(exc, "exit_status", None), text
        return None, "docker run failed"

    @staticmethod
    def remove_leftover(client, name):
        with contextlib.suppress(DockerException):
            client.containers.get(name).remove(force=True)

    def stop(self, pid):
        started = time.monotonic()
        self.exec_py(SIGNAL, pid, 15)
        # A frozen (stopped) process acts on SIGTERM only once continued.
        self.exec_py(SIGNAL, pid, 18)

        def gone():
            return not self.status()["alive"], "stopping"

        res = wait_for(gone, self.p["stop_timeout"])
        if not res.ok:
            self.exec_py(SIGNAL, pid, 9)
            res = wait_for(gone, 10)
            if not res.ok:
                self.fail("The old vllm serve process (pid %s) did not exit after SIGKILL" % pid)
        self.timings["stop"] = round(time.monotonic() - started, 2)

    def port_owned(self, client):
        """Whether a container of this collection that may hold the port runs on this node (the other
        backend's, which the deploy stops before serving)."""
        for name in self.p["port_owners"]:
            found = find_container(client, name)
            if found is not None and found.status == "running":
                return True
        return False

    def check_port_free(self):
        try:
            sock = socket.create_connection((_probe.local_host(self.p["host"]), self.p["port"]), timeout=2)
        except OSError:
            return
        sock.close()
        self.fail(
            "port: %s is already in use on the head by another process; free it or choose another port "
            "(vllm_server_port)" % self.p["port"]
        )

    def start(self, argv, env, digest):
        cmd = [self.p["python"], "-c", LAUNCH, self.p["state_file"], self.p["log_file"], digest, "--", *argv]
        try:
            self.container.exec_run(cmd, detach=True, environment=env)
        except DockerException as exc:
            self.fail("docker exec -d in %s failed: %s" % (self.p["container"], exc))

        def launched():
            st = self.status()
            ok = bool(st["state"]) and st["state"].get("args_hash") == digest
            return ok, "launching"

        res = wait_for(launched, 30, interval=0.25)
        if not res.ok:
            self.fail("vllm serve did not start in %s. Log tail:\n%s" % (self.p["container"], self.log_tail()))
        self.result["pid"] = self.status()["state"]["pid"]
        self.timings["start"] = round(res.elapsed, 2)

    def url(self, path):
        return _probe.local_url(self.p["host"], self.p["port"]) + path

    def http(self, method, path, body=None, timeout=None):
        timeout = timeout or self.p["request_timeout"]
        return _probe.request(open_url, self.url(""), self.p["api_key"], method, path, body=body, timeout=timeout)

    def probe(self, timeout=None):
        """The serving probe (module_utils/_probe.py); its result is returned as `probe`."""

        def http(method, path, body, limit):
            return self.http(method, path, body, timeout=limit)

        found = _probe.probe(
            http,
            self.p["served_model_name"],
            self.p["smoke_prompt"],
            self.p["smoke_max_tokens"],
            timeout or self.p["probe_timeout"],
            wait=wait_for,
        )
        self.result["probe"] = found
        self.timings["probe"] = found["seconds"]
        return found

    def report(self, probe):
        """What the summary shows of a server that passed its probe."""
        self.result.update(_probe.summary(self.url(""), self.p["served_model_name"], probe))

    def watchdog(self, why):
        """Restart a failed engine, after a backoff, unless that would be a crash loop (then fail)."""
        p = self.p
        history = _probe.read_history(p["restart_history"])
        decision, wait, recent = _probe.restart_decision(
            history, time.time(), p["max_restarts"], p["restart_window"], p["restart_backoff"]
        )
        self.result["watchdog"] = dict(why=why, decision=decision, recent_restarts=len(recent), backoff_s=wait)
        if decision == "crash_loop":
            message = _probe.crash_loop_message(recent, p["restart_window"], p["max_restarts"], p["restart_history"])
            self.fail("The engine failed (%s). %s.\n%s" % (why, message, self.failure_detail()))
        if self.module.check_mode:
            return
        time.sleep(wait)
        error = _probe.write_history(p["restart_history"], [*history, {"at": time.time(), "why": why}])
        if error:
            self.module.warn("restart_history: the restart was not recorded (%s)" % error)

    def gone(self):
        """Why the server can no longer become healthy (None while it still can)."""
        return None if self.status()["alive"] else "the vllm serve process exited"

    def failure_detail(self):
        return "Log tail (%s):\n%s" % (self.p["log_file"], self.log_tail())

    def wait_health(self):
        state = dict(polls=0, hung=False)

        def healthy():
            # /health is one local request: asked every 0.1 s, its 200 is seen promptly. Whether the engine
            # died costs a docker exec of Python (mp: an inspect of every rank), CPU the starting engine
            # wants: asked every 10th poll (about once a second), and after a poll that hung.
            state["polls"] += 1
            why = self.gone() if state["polls"] % 10 == 1 or state["hung"] else None
            if why:
                raise StopWaiting(why)
            asked = time.monotonic()
            try:
                code, _body = self.http("GET", "/health", timeout=5)
            except Exception as exc:
                state["hung"] = time.monotonic() - asked > 1
                return False, type(exc).__name__ + (": %s" % getattr(exc, "code", "")).rstrip(": ")
            state["hung"] = False
            return code == 200, "HTTP %s" % code

        res = wait_for(healthy, self.p["health_timeout"], interval=0.1)
        self.timings["health"] = round(res.elapsed, 2)
        if not res.ok:
            why = res.stopped or "no 200 from /health within %ss (last: %s)" % (self.p["health_timeout"], res.last)
            self.fail("vllm serve is not healthy: %s. %s" % (why, self.failure_detail()), progress=res.progress)

    def verify(self):
        """After a (re)start: the probe and one chat completion (the chat template is the engine's own), sent
        together: the engine batches the two, so the chat costs no turn of its own."""
        messages = [{"role": "user", "content": self.p["smoke_prompt"]}]
        # With a reasoning parser the answer may be all reasoning (no closing think tag in 8 tokens).
        chat = Asked(
            self,
            "chat",
            "/v1/chat/completions",
            dict(messages=messages),
            lambda c: (
                c["message"].get("content")
                or c["message"].get("reasoning_content")
                or c["message"].get("reasoning")
                or ""
            ),
        )
        probe = self.probe(self.p["request_timeout"])
        # A failed probe names its step; the chat's answer is not waited for.
        if not probe["ok"]:
            self.fail("The verification failed at %s: %s. %s" % (probe["step"], probe["why"], self.failure_detail()))
        self.report(probe)
        text, error = chat.answer()
        if error:
            self.fail("The verification chat failed: %s. Log tail:\n%s" % (error, self.log_tail()))
        self.result["chat_completion"] = text


class Asked(threading.Thread):
    """One bounded verification request, sent at once and answered on its own thread."""

    def __init__(self, serve, what, path, body, text_of):
        super().__init__(daemon=True)
        self.serve, self.what, self.path, self.text_of = serve, what, path, text_of
        p = serve.p
        self.body = dict(body, model=p["served_model_name"], max_tokens=p["smoke_max_tokens"], temperature=0)
        self.text = self.error = None
        self.start()

    def run(self):
        started = time.monotonic()
        try:
            _code, raw = self.serve.http("POST", self.path, self.body)
            self.text = self.text_of(json.loads(raw)["choices"][0])
        except Exception as exc:
            self.error = str(exc) or type(exc).__name__
        # Kept here: the module's result is not touched from this thread (a failure may be reporting it).
        self.seconds = round(time.monotonic() - started, 2)

    def answer(self):
        """(text, None), or (None, why it failed); its seconds go to the timings."""
        self.join()
        self.serve.timings[self.what] = self.seconds
        return self.text, self.error


class MpRank(VllmServe):
    """backend=mp: this node's rank as a container whose main process is `vllm serve` (the container
    contract of the Ray nodes). Rank 0 serves the API; it waits for /health while watching its own
    container and every worker's, names the ranks that did not join, and verifies the endpoint."""

    def __init__(self, module):
        super().__init__(module)
        self.restarts = 0
        # Writable mount sources missing on this node: made before the container is (re)created.
        self.missing_sources = []
        # (worker, container, restart count when the wait began) for each worker rank watched.
        self.watched = []
        self.worker_engines = {}

    def run(self):
        p = self.p
        if p["state"] != "absent":
            self.check_input()
            self.check_mp_input()
        argv = _vllm_args.serve_argv(p) if p["state"] != "absent" else []
        env = _vllm_args.serve_env(p) if p["state"] != "absent" else {}
        self.result.update(command=argv, args_hash=_vllm_args.args_hash(argv, env), flag_check="", rank=p["node_rank"])
        client = docker_client(self.module)
        self.container = find_container(client, p["container"])
        before = _container.describe(self.container)
        if p["state"] == "absent":
            self.result["diff"] = dict(before=before, after={})
            if self.container is not None:
                self.result.update(changed=True, actions=["removed"])
                if not self.module.check_mode:
                    self.docker(self.container.remove, force=True)
            self.finish()
        running = self.container is not None and self.container.status == "running"
        try:
            image = _image.image_or_none(client, p["image"])
        except DockerException as exc:
            self.fail("image: cannot inspect %s on this node: %s" % (p["image"], exc))
        if image is None and p["state"] == "started":
            self.fail(
                "image: %s is not on this node's Docker engine; run the runtime_image stage first "
                "(it builds, verifies and copies the image to every node)" % p["image"]
            )
        if p["node_rank"] == 0:
            self.check_flags(client, argv, running)
        else:
            # The head asks the same image (runtime_image verified every node's copy by image ID) about the
            # same flags, but --node-rank and --headless: asking here again would only cost tens of seconds.
            self.result["flag_check"] = "checked by the head (rank 0): the same image and flags"
        if image is None:
            # The image is not on this node yet (the first play runs before the runtime image stage).
            self.finish()
        container_env = dict(_container.module_file_env(self.module, self.fail), **p["container_env"])
        container_env.update(env)
        config = _container.container_config(p, image.id, argv, "rank-%d" % p["node_rank"], container_env)
        # The key enters the label's hash only as its own hash.
        digest = _container.config_hash(dict(config, env=_vllm_args.hashed_env(container_env)))
        self.missing_sources = _container.missing_writable_sources(config, p["docker_host"])
        plan = _container.plan(self.container, digest, p["force_restart"] or bool(self.missing_sources))
        if plan is None and p["node_rank"] == 0 and p["state"] == "checked":
            # The plan step: a head that fails its probe restarts every rank (the watchdog permitting).
            probe = self.probe()
            if not probe["ok"]:
                plan = "recreated"
                self.watchdog("the probe failed at %s: %s" % (probe["step"], probe["why"]))
        image_entrypoint = (image.attrs.get("Config") or {}).get("Entrypoint")
        self.result.update(
            plan=plan,
            config_hash=digest,
            entrypoint=_container.entrypoint_message(image_entrypoint, config["entrypoint"]),
        )
        after = before if plan is None else dict(name=p["container"], status="running", config_hash=digest)
        self.result["diff"] = dict(before=before, after=dict(after, command=argv))
        if p["state"] == "checked":
            # This rank's own running server holds the port, as may the other backend's.
            if p["node_rank"] == 0 and not running and not self.port_owned(client):
                self.check_port_free()
            self.finish()
        if plan is not None:
            self.result.update(changed=True, actions=[plan])
            if self.module.check_mode:
                self.finish()
            self.apply(client, config, digest, plan)
        if p["node_rank"] > 0 or self.module.check_mode:
            self.finish()
        if plan is not None:
            self.watch_workers()
            self.wait_health()
            self.verify()
        else:
            # The plan step of this run probed this same server a moment ago.
            probe = p["probed"] if (p["probed"] or {}).get("ok") else self.probe()
            self.result["probe"] = probe
            if not probe["ok"]:
                self.fail(
                    "The engine failed its probe at %s after the plan step passed: %s. Run the deploy again "
                    "(its plan step restarts every rank). %s" % (probe["step"], probe["why"], self.failure_detail())
                )
            self.report(probe)
        self.finish()

    def check_mp_input(self):
        p = self.p
        errors = _container.contract_problems(p)
        if p["nnodes"] < 1:
            errors.append("nnodes: must be 1 or more, got %s" % p["nnodes"])
        elif not 0 <= p["node_rank"] < p["nnodes"]:
            errors.append("node_rank: must be in 0..%d, got %s" % (p["nnodes"] - 1, p["node_rank"]))
        if p["nnodes"] > 1 and not p["master_addr"]:
            errors.append("master_addr: required with more than one node; pass the head's fabric address")
        if not 0 < p["master_port"] < 65536:
            errors.append("master_port: %s is not a TCP port; use 1..65535 (vllm_server_mp_port)" % p["master_port"])
        if not p["image"]:
            errors.append("image: required with backend=mp; pass the runtime image in service (vllm_server_image)")
        if errors:
            self.fail("; ".join(errors))

    def apply(self, client, config, digest, plan):
        started = time.monotonic()
        # Before the old container goes: a source that cannot be made leaves it as it was.
        problem = _container.make_sources(self.missing_sources)
        if problem:
            self.fail(problem)
        if plan == "started":
            self.docker(self.container.start)
        else:
            if self.container is not None:
                self.docker(self.container.remove, force=True)
            kwargs = _container.create_kwargs(config, self.p["container"], digest, docker_types, ROLE_LABEL)
            self.container = self.docker(client.containers.create, **kwargs)
            self.docker(self.container.start)
        self.container.reload()
        self.restarts = self.container.attrs.get("RestartCount", 0)
        self.timings["start"] = round(time.monotonic() - started, 2)

    def docker(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except DockerException as exc:
            name = getattr(call, "__name__", call)
            self.fail("Docker engine refused %s for %s: %s" % (name, self.p["container"], exc))
        return None  # pragma: no cover

    def log_tail(self):
        return log_tail(self.container, self.p["log_lines"]) if self.container is not None else ""

    def failure_detail(self):
        parts = []
        for worker, found, _restarts in self.watched:
            text = log_tail(found, 400)
            joined = _vllm_args.joined_ranks(text)
            mark = "joined" if joined else "did not join"
            parts.append(
                "--- %s (%s) rank %s: %s. Log tail:\n%s"
                % (worker["host"], worker["container"], worker["rank"], mark, _last_lines(text, self.p["log_lines"]))
            )
        for host, why in self.worker_engines.items():
            if why != "watched":
                parts.append("--- %s: %s" % (host, why))
        head = "--- head (%s) rank 0 log tail:\n%s" % (self.p["container"], self.log_tail())
        return "\n".join([head, *parts])

    def watch_workers(self):
        """Find each worker rank's container; note its restart count to compare against."""
        self.watched, self.worker_engines = watch_containers(self.p["workers"], self.p["docker_timeout"])
        self.result["worker_engines"] = self.worker_engines

    def gone(self):
        try:
            self.container.reload()
        except DockerException as exc:
            return "the head's Docker engine stopped answering: %s" % exc
        how = _container.exited_how(self.container, self.restarts)
        if how:
            return "the head rank's container %s %s: vllm serve exited in it" % (self.p["container"], how)
        for worker, found, restarts in self.watched:
            try:
                found.reload()
            except DockerException as exc:
                return "the Docker engine of %s stopped answering: %s" % (worker["host"], exc)
            how = _container.exited_how(found, restarts)
            if how:
                return "the rank %s container %s on %s %s: its vllm serve exited" % (
                    worker["rank"],
                    worker["container"],
                    worker["host"],
                    how,
                )
        return None


def _last_lines(text, count):
    return "\n".join(text.splitlines()[-count:])


def main():
    argument_spec = dict(
        container=dict(type="str", default="ray-head"),
        state=dict(type="str", choices=["started", "absent", "checked"], default="started"),
        model=dict(type="str"),
        served_model_name=dict(type="str"),
        tensor_parallel_size=dict(type="int", default=1),
        pipeline_parallel_size=dict(type="int", default=1),
        host=dict(type="str", default="0.0.0.0"),  # noqa: S104 - the API is served to the network
        port=dict(type="int", default=8000),
        max_model_len=dict(type="int"),
        gpu_memory_utilization=dict(type="float"),
        api_key=dict(type="str", no_log=True),
        extra_args=dict(type="list", elements="str", default=[]),
        env=dict(type="dict", default={}),
        placement_strategy=dict(
            type="str", choices=["SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK", "none"], default="SPREAD"
        ),
        flag_source=dict(type="str", choices=["installed", "builtin"], default="installed"),
        image=dict(type="str"),
        flag_cache_dir=dict(type="path", default="/var/lib/dgx-spark/vllm-flags"),
        python=dict(type="str", default="python3"),
        log_file=dict(type="path", default="/tmp/dgx-spark-vllm-serve.log"),  # noqa: S108 - inside the container
        state_file=dict(type="path", default="/tmp/dgx-spark-vllm-serve.json"),  # noqa: S108
        health_timeout=dict(type="int", default=1800),
        stop_timeout=dict(type="int", default=60),
        request_timeout=dict(type="int", default=120),
        smoke_prompt=dict(type="str", default="The capital of France is"),
        smoke_max_tokens=dict(type="int", default=16, no_log=False),
        log_lines=dict(type="int", default=60),
        probe_timeout=dict(type="int", default=60),
        probed=dict(type="dict"),
        ray_gpus=dict(type="float"),
        max_restarts=dict(type="int", default=3),
        restart_window=dict(type="int", default=3600),
        restart_backoff=dict(type="int", default=30),
        restart_history=dict(type="path", default="/var/lib/dgx-spark/vllm-restarts.json"),
        port_owners=dict(type="list", elements="str", default=[]),
        backend=dict(type="str", choices=["ray", "mp"], default="ray"),
        nnodes=dict(type="int", default=1),
        node_rank=dict(type="int", default=0),
        master_addr=dict(type="str"),
        master_port=dict(type="int", default=29501),
        workers=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(WATCHED_CONTAINER_OPTIONS, rank=dict(type="int", required=True)),
        ),
        force_restart=dict(type="bool", default=False),
        container_env=dict(type="dict", default={}),
        node_memory=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(host=dict(type="str", required=True), meminfo=dict(type="str", required=True)),
        ),
        hub_repo_id=dict(type="str"),
        hub_revision=dict(type="str"),
        hub_token=dict(type="str", no_log=True),
        record=dict(type="dict", options=RECORD_OPTIONS),
        record_facts=dict(type="dict", default={}),
    )
    argument_spec.update(DOCKER_COMMON_ARGS)
    argument_spec.update(_container.CONTRACT_ARGS)
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_if=[
            ("state", "started", ("model", "served_model_name")),
            ("state", "checked", ("model", "served_model_name")),
        ],
        supports_check_mode=True,
    )
    checked_record(module)
    VllmServe(module).run()


if __name__ == "__main__":
    main()
