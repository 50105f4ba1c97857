#!/usr/bin/env bash
# Create .venv with the control-node and development requirements, and link the repository
# as the dgx_spark.vllm collection under build/collections (ansible.cfg's collections_path).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "bootstrap: $PYTHON is missing or older than 3.11; install Python 3.11+ or set PYTHON=..." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
mkdir -p build/collections/ansible_collections/dgx_spark
ln -sfn "$(pwd)" build/collections/ansible_collections/dgx_spark/vllm
