#!/bin/sh
# Entrypoint of the lab "donor" image, like the community image it replays (field failure 1):
# it locks GPU clocks and starts `vllm serve` from environment variables. It ignores the
# command it is given ("$@"), so a launcher that passes `ray start ...` never starts Ray.
echo "[entrypoint] locking GPU clocks to ${GPU_CLOCK_MIN:-2400},${GPU_CLOCK_MAX:-3000} MHz"
nvidia-smi -lgc "${GPU_CLOCK_MIN:-2400},${GPU_CLOCK_MAX:-3000}" \
  || echo "[entrypoint] nvidia-smi failed (no GPU here); continuing"
set -- vllm serve "${MODEL:-/models/model}" \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" \
  --tensor-parallel-size "${TENSOR_PARALLEL_SIZE:-1}" \
  --served-model-name "${SERVED_MODEL_NAME:-model}"
if [ -n "${DISTRIBUTED_EXECUTOR_BACKEND:-}" ]; then
  set -- "$@" --distributed-executor-backend "$DISTRIBUTED_EXECUTOR_BACKEND"
fi
echo "[entrypoint] exec $*"
exec "$@"
