#!/usr/bin/env bash
# ansible-test sanity, offline and local (never --docker: no image can be pulled here).
# It must run from an ansible_collections/dgx_spark/vllm tree: copy the repository's files there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
DEST=$ROOT/build/sanity/ansible_collections/dgx_spark/vllm

# Without shellcheck ansible-test skips its shellcheck test silently.
if ! command -v shellcheck >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "sanity: installing shellcheck" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null
  else
    echo "sanity: shellcheck is missing (ansible-test would skip its shellcheck test); install it" >&2
    exit 1
  fi
fi

# ansible-test looks for its pip bootstrap script in this cache before downloading it.
pip_version=$("$VENV/bin/python" -c '
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11"))["pip"])')
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$cache")"
wheels=$VENV/wheels/sanity
if [ ! -f "$wheels/.sha256" ]; then
  echo "sanity: no sanity wheels in $wheels; run make venv (scripts/bootstrap.sh) once with the package index reachable" >&2
  exit 1
fi
sed "s|^WHEELHOUSE = None$|WHEELHOUSE = \"$wheels\"|" scripts/lib/get_pip_offline.py > "$cache"

rm -rf "$DEST"
mkdir -p "$DEST"
# Only what the collection ships: galaxy.yml's build_ignore (the root `spark` inventory link) stays out.
git ls-files -z --cached --others --exclude-standard -- . ':!spark' \
  | xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' \
  | tar --null -T - -cf - | tar -C "$DEST" -xf -
cd "$DEST"
# Its own repository: ansible-test lists files through git, and the outer one ignores build/.
git init -q .
PATH=$VENV/bin:$PATH "$VENV/bin/ansible-test" sanity --python 3.11 --requirements --color no "$@"
