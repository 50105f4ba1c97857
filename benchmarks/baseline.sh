#!/usr/bin/env bash
# Copyright: dgx_spark.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The plain-shell baseline for benchmarks/run.py: the steps an operator's launcher script does by
# hand over SSH, with the same container flags, the same `vllm serve` command line and the same
# readiness criteria as the collection (alive Ray nodes and GPUs, then /health, then one completion).
# It starts from the same state as a cold deploy (nodes configured, images and model present, nothing
# running) and prints one line "baseline: ... ready in S s" when the endpoint has answered a completion.
#
# BACKEND=mp (vllm_server_backend mp): no Ray; each node runs its rank as a container whose main process
# is `vllm serve` (the Ray containers' flags, `--entrypoint vllm`) with --nnodes, --node-rank,
# --master-addr, --master-port MP_PORT (vllm_server_mp_port), the worker --headless and started first;
# ready when /health answers 200 and one completion has answered, as for Ray.
#
# The serve settings come from the model profile, not from here: run.py reads them from the bench
# inventory (inventories/lab/group_vars/spark/model.yml, linked) and passes them in the environment:
#   MODEL SERVED TP PP PORT                   the profile's vllm_server_* values
#   MAX_MODEL_LEN GMU                         vllm_server_max_model_len, _gpu_memory_utilization (empty: left out)
#   PROMPT MAX_TOKENS                         vllm_server_smoke_prompt, vllm_server_smoke_max_tokens
#   EXTRA_ARGS                                vllm_server_extra_args, one argument per line
#   GPUS_PER_NODE SHM                         cluster_gpus_per_node, ray_cluster_shm_size
#   CACHE_DIR CACHE_ENV                       ray_cluster_cache_dir; its variables (NAME=subdirectory per line)
#   PLACEMENT                                 the role's placement strategy (VLLM_DISTRIBUTED_EXECUTOR_CONFIG)
#
#   HEAD=198.18.30.11 WORKER=198.18.30.12 HEAD_IP=198.18.130.11 WORKER_IP=198.18.130.12 \
#   SSH_KEY=.lab-bench/ssh/id_ed25519 KNOWN_HOSTS=.lab-bench/ssh/known_hosts MODEL=... benchmarks/baseline.sh
#   benchmarks/baseline.sh down     # remove what it started
set -euo pipefail

: "${HEAD:?management address of the head node}" "${WORKER:?management address of the worker node}"
: "${SSH_KEY:?SSH key}" "${KNOWN_HOSTS:?known_hosts file}"
SSH=(ssh -i "$SSH_KEY" -o UserKnownHostsFile="$KNOWN_HOSTS" -o StrictHostKeyChecking=yes -o BatchMode=yes
  -o ControlMaster=auto -o ControlPersist=120s -o ControlPath=/tmp/bench-baseline-%C)

on() { local host=$1; shift; "${SSH[@]}" "root@$host" "$@"; }

MP_CONTAINER=vllm-mp
if [ "${1:-up}" = down ]; then
  on "$HEAD" docker rm -f ray-head $MP_CONTAINER >/dev/null 2>&1 || true
  on "$WORKER" docker rm -f ray-worker $MP_CONTAINER >/dev/null 2>&1 || true
  exit 0
fi

: "${HEAD_IP:?fabric address of the head}" "${WORKER_IP:?fabric address of the worker}"
: "${MODEL:?model path (vllm_server_model)}" "${SERVED:?served model name (vllm_server_served_model_name)}"
: "${TP:?vllm_server_tensor_parallel_size}" "${PP:?vllm_server_pipeline_parallel_size}"
: "${MAX_MODEL_LEN?vllm_server_max_model_len (may be empty)}" "${EXTRA_ARGS?vllm_server_extra_args, one per line}"
: "${GPUS_PER_NODE:?cluster_gpus_per_node}" "${SHM:?ray_cluster_shm_size}"
IMAGE=${IMAGE:-dgx-spark/vllm-runtime:in-service}
PORT=${PORT:-8000}
PLACEMENT=${PLACEMENT:-SPREAD}
GMU=${GMU:-}
PROMPT=${PROMPT:-The capital of France is}
MAX_TOKENS=${MAX_TOKENS:-16}
ENV_FILE=${ENV_FILE:-/etc/dgx-spark/nccl.env}
TIMEOUT=${TIMEOUT:-600}
BACKEND=${BACKEND:-ray}
MP_PORT=${MP_PORT:-29501}
LOG=/tmp/baseline-vllm.log

start=$(date +%s.%N)
since() { echo "$(date +%s.%N) - $start" | bc; }
deadline=$(( $(date +%s) + TIMEOUT ))
left() { echo $(( deadline - $(date +%s) )); }

# The profile's `vllm serve` command line as the collection builds it, into serve=(...): the backend,
# the address to bind (the node's fabric address), then the rank's flags (mp) before the extra arguments.
serve_argv() {
  local backend=$1 host=$2
  shift 2
  serve=(vllm serve "$MODEL" --served-model-name "$SERVED" --tensor-parallel-size "$TP"
    --pipeline-parallel-size "$PP" --distributed-executor-backend "$backend" --host "$host" --port "$PORT")
  [ -z "$MAX_MODEL_LEN" ] || serve+=(--max-model-len "$MAX_MODEL_LEN")
  [ -z "$GMU" ] || serve+=(--gpu-memory-utilization "$GMU")
  serve+=("$@")
  while IFS= read -r arg; do [ -n "$arg" ] && serve+=("$arg"); done <<<"$EXTRA_ARGS"
}

# The same flags ray_node gives the containers: host network and IPC, --init, restart policy,
# shared memory, the fabric environment, the model read-only (the entrypoint: `ray`, or `vllm` for mp).
flags="--network host --ipc host --init --restart unless-stopped --shm-size $SHM --env-file $ENV_FILE \
  -v $MODEL:$MODEL:ro"
# The engine's compile caches kept on the node (ray_cluster_cache_dir), one directory per variable.
if [ -n "${CACHE_DIR:-}" ]; then
  flags+=" -v $CACHE_DIR:$CACHE_DIR"
  while IFS='=' read -r name sub; do [ -n "$name" ] && flags+=" -e $name=$CACHE_DIR/$sub"; done <<<"${CACHE_ENV:-}"
fi

if [ "$BACKEND" = mp ]; then
  # One rank per node, the worker first (its rank waits for the head's), as the collection starts them.
  rank() {
    local host=$1 ip=$2 rank=$3
    shift 3
    serve_argv mp "$ip" --nnodes 2 --node-rank "$rank" --master-addr "$HEAD_IP" --master-port "$MP_PORT" "$@"
    on "$host" "docker run -d --name $MP_CONTAINER $flags --entrypoint vllm $IMAGE $(printf '%q ' "${serve[@]:1}")" \
      >/dev/null
  }
  rank "$WORKER" "$WORKER_IP" 1 --headless
  rank "$HEAD" "$HEAD_IP" 0
  launched=$(since)
  ray_ready=-
  # The engine died: its container restarted (restart policy) or stopped. The log is the container's.
  dead="[ \$(docker inspect -f {{.RestartCount}}{{.State.Status}} $MP_CONTAINER) != 0running ]"
  tail_log() { on "$HEAD" docker logs --tail 40 $MP_CONTAINER 2>&1; }
else
  common="$flags -e RAY_USAGE_STATS_ENABLED=0 --entrypoint ray"
  on "$HEAD" "docker run -d --name ray-head $common $IMAGE start --head --port=6379 \
    --node-ip-address=$HEAD_IP --num-gpus=$GPUS_PER_NODE --include-dashboard=false --disable-usage-stats --block" >/dev/null
  on "$WORKER" "docker run -d --name ray-worker $common $IMAGE start \
    --address=$HEAD_IP:6379 --node-ip-address=$WORKER_IP --num-gpus=$GPUS_PER_NODE --disable-usage-stats --block" >/dev/null

  # Ready: 2 alive nodes and 2 GPUs, asked of the head (each query imports Ray: about a second).
  query='import ray; ray.init(address="auto", logging_level="ERROR"); n=[x for x in ray.nodes() if x["Alive"]]; print(len(n), int(sum(x["Resources"].get("GPU", 0) for x in n)))'
  want="2 $((2 * GPUS_PER_NODE))"
  until [ "$(on "$HEAD" docker exec ray-head python3 -c "'$query'" 2>/dev/null | tail -1)" = "$want" ]; do
    [ "$(left)" -gt 0 ] || { echo "baseline: Ray cluster not ready" >&2; exit 1; }
    sleep 0.25
  done
  ray_ready=$(since)

  # vllm serve in the head container, the profile's command line as the collection builds it (binds the
  # head's fabric address), its output in a log file; the exit status kept so a dead engine fails at once.
  serve_argv ray "$HEAD_IP"
  placement="{\"placement_group_options\":{\"strategy\":\"$PLACEMENT\"}}"
  inner="$(printf '%q ' "${serve[@]}") >$LOG 2>&1; echo \$? >$LOG.exit"
  on "$HEAD" "docker exec -d -e VLLM_DISTRIBUTED_EXECUTOR_CONFIG=$(printf '%q' "$placement") ray-head \
    sh -c $(printf '%q' "$inner")"
  launched=$(since)
  dead="docker exec ray-head test -e $LOG.exit"
  tail_log() { on "$HEAD" docker exec ray-head tail -n 40 "$LOG" || true; }
fi

# /health from the head (the API listens on the fabric address only), every 0.25 s. The nodes have
# wget, not curl; wget exits 0 on a 200 only.
health="http://$HEAD_IP:$PORT/health"
if ! on "$HEAD" "timeout $(left) sh -c 'until wget -q -O /dev/null -T 5 --tries=1 $health; do
    if $dead; then exit 3; fi; sleep 0.25; done'"; then
  echo "baseline: /health never 200; log tail:" >&2
  tail_log >&2
  exit 1
fi
healthy=$(since)

body="{\"model\": \"$SERVED\", \"prompt\": \"$PROMPT\", \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}"
if ! out=$(on "$HEAD" "wget -q -O - -T $(left) --tries=1 --header='Content-Type: application/json' \
    --post-data=$(printf '%q' "$body") http://$HEAD_IP:$PORT/v1/completions"); then
  echo "baseline: the completion failed; log tail:" >&2
  tail_log >&2
  exit 1
fi
case $out in *'"text"'*) ;; *) echo "baseline: no completion text in: $out" >&2; exit 1 ;; esac
echo "baseline ($BACKEND): ray ready in $ray_ready s, serve launched at $launched s, /health 200 at $healthy s," \
  "ready (one completion) in $(since) s"
