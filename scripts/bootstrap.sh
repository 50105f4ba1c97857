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
# The wheels ansible-test sanity installs into its per-test venvs (its pinned requirement files and pip
# itself), fetched once here so that `make sanity` never reaches the package index (scripts/sanity.sh).
wheels=.venv/wheels/sanity
# First line: a digest of what is wanted; then pip download's arguments, one a line.
mapfile -t sanity < <(.venv/bin/python -c '
import glob, hashlib, os, ansible_test
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
base = os.path.join(os.path.dirname(ansible_test.__file__), "_data", "requirements")
files = sorted(glob.glob(os.path.join(base, "sanity.*.txt")))
args = [a for path in files for a in ("-r", path)]
args += ["%s==%s" % kv for kv in get_venv_packages(NativePythonConfig(version="3.11")).items()]
digest = hashlib.sha256("\n".join(args).encode())
for path in files:
    with open(path, "rb") as fh:
        digest.update(fh.read())
print(digest.hexdigest())
print("\n".join(args))')
if [ "$(cat "$wheels/.sha256" 2>/dev/null)" != "${sanity[0]}" ]; then
  echo "bootstrap: fetching the sanity test wheels into $wheels (once)"
  rm -rf "$wheels" && mkdir -p "$wheels"
  .venv/bin/pip download --quiet --disable-pip-version-check --dest "$wheels" "${sanity[@]:1}"
  echo "${sanity[0]}" > "$wheels/.sha256"
fi
mkdir -p build/collections/ansible_collections/dgx_spark
ln -sfn "$(pwd)" build/collections/ansible_collections/dgx_spark/vllm
