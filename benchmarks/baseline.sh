#!/usr/bin/env bash
# The plain-shell baseline for benchmarks/run.py: the steps an operator's launcher script does by
# hand over SSH, with the same container flags and the same readiness criteria as the collection
# (alive Ray nodes and GPUs, then /health and one completion). It starts from the same state as a
# cold deploy (nodes configured, images and model present, nothing running) and prints one line
# "baseline: ready in S s" when the endpoint has answered a completion.
#
#   HEAD=198.18.30.11 WORKER=198.18.30.12 HEAD_IP=198.18.130.11 WORKER_IP=198.18.130.12 \
#   SSH_KEY=.lab-bench/ssh/id_ed25519 KNOWN_HOSTS=.lab-bench/ssh/known_hosts benchmarks/baseline.sh
#   benchmarks/baseline.sh down     # remove what it started
set -euo pipefail

: "${HEAD:?management address of the head node}" "${WORKER:?management address of the worker node}"
: "${HEAD_IP:?fabric address of the head}" "${WORKER_IP:?fabric address of the worker}"
: "${SSH_KEY:?SSH key}" "${KNOWN_HOSTS:?known_hosts file}"
IMAGE=${IMAGE:-dgx-spark/vllm-runtime:in-service}
MODEL=${MODEL:-/var/lib/dgx-spark/models/lab-qwen3.5-moe-tiny}
SERVED=${SERVED:-lab-qwen3.5-moe-tiny}
PORT=${PORT:-8000}
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
ENV_FILE=${ENV_FILE:-/etc/dgx-spark/nccl.env}
SHM=${SHM:-1g}
TIMEOUT=${TIMEOUT:-300}
SSH=(ssh -i "$SSH_KEY" -o UserKnownHostsFile="$KNOWN_HOSTS" -o StrictHostKeyChecking=yes -o BatchMode=yes
  -o ControlMaster=auto -o ControlPersist=120s -o ControlPath=/tmp/bench-baseline-%C)

on() { local host=$1; shift; "${SSH[@]}" "root@$host" "$@"; }

if [ "${1:-up}" = down ]; then
  on "$HEAD" docker rm -f ray-head >/dev/null 2>&1 || true
  on "$WORKER" docker rm -f ray-worker >/dev/null 2>&1 || true
  exit 0
fi

start=$(date +%s.%N)
# The same flags ray_node gives the containers: host network and IPC, --init, restart policy,
# shared memory, the entrypoint overridden with `ray`, the fabric environment, the model read-only.
common="--network host --ipc host --init --restart unless-stopped --shm-size $SHM --env-file $ENV_FILE \
  -e RAY_USAGE_STATS_ENABLED=0 -v $MODEL:$MODEL:ro --entrypoint ray"
on "$HEAD" "docker run -d --name ray-head $common $IMAGE start --head --port=6379 \
  --node-ip-address=$HEAD_IP --num-gpus=$GPUS_PER_NODE --include-dashboard=false --disable-usage-stats --block" >/dev/null
on "$WORKER" "docker run -d --name ray-worker $common $IMAGE start \
  --address=$HEAD_IP:6379 --node-ip-address=$WORKER_IP --num-gpus=$GPUS_PER_NODE --disable-usage-stats --block" >/dev/null

# Ready: 2 alive nodes and 2 GPUs, asked of the head every second.
query='import ray; ray.init(address="auto", logging_level="ERROR"); n=[x for x in ray.nodes() if x["Alive"]]; print(len(n), int(sum(x["Resources"].get("GPU", 0) for x in n)))'
want="2 $((2 * GPUS_PER_NODE))"
deadline=$(( $(date +%s) + TIMEOUT ))
until [ "$(on "$HEAD" docker exec ray-head python3 -c "'$query'" 2>/dev/null | tail -1)" = "$want" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "baseline: Ray cluster not ready" >&2; exit 1; }
  sleep 1
done
ray_ready=$(date +%s.%N)

on "$HEAD" "docker exec -d ray-head sh -c 'exec vllm serve $MODEL --served-model-name $SERVED \
  --tensor-parallel-size 2 --pipeline-parallel-size 1 --distributed-executor-backend ray --host 0.0.0.0 \
  --port $PORT --max-model-len 4096 >/tmp/baseline-vllm.log 2>&1'"
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$HEAD:$PORT/health")" = 200 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "baseline: /health never 200" >&2; exit 1; }
  sleep 1
done
curl -sf "http://$HEAD:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$SERVED\", \"prompt\": \"Say hello\", \"max_tokens\": 8, \"temperature\": 0}" >/dev/null
end=$(date +%s.%N)
echo "baseline: ray ready in $(echo "$ray_ready - $start" | bc) s, ready in $(echo "$end - $start" | bc) s"
