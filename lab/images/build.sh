#!/bin/sh
# Build one lab runtime image from a staged context (image dir + stand-in sources + host CA).
#   lab/images/build.sh NAME [TAG]   build NAME (runtime-donor | runtime-old); prints the image ID
#   lab/images/build.sh --hash NAME  print the content hash of NAME's inputs (for content tags)
# TAG defaults to dgx-spark-lab/NAME:<content hash>. Env: BASE_IMAGE, CA_BUNDLE, DOCKER.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
standin="$here/../standin_vllm"

inputs() {  # the files a build reads, stable order, caches and tests left out
  (cd "$here/.." && find "images/$1" standin_vllm -type f \
     -not -path '*/tests/*' -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
     -not -path 'standin_vllm/build/*' -not -name '*.pyc' | LC_ALL=C sort)
}

content_hash() {
  (cd "$here/.." && inputs "$1" | while read -r f; do printf '%s\n' "$f"; cat "$f"; done \
     | sha256sum | cut -c1-12)
}

if [ "${1:-}" = "--hash" ]; then content_hash "$2"; exit 0; fi
name=${1:?usage: build.sh NAME [TAG] | --hash NAME}
[ -f "$here/$name/Dockerfile" ] || { echo "no image named $name under $here" >&2; exit 2; }
tag=${2:-dgx-spark-lab/$name:$(content_hash "$name")}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -a "$here/$name/." "$ctx/"
mkdir "$ctx/standin_vllm"
(cd "$here/.." && inputs "$name" | grep '^standin_vllm/' | while read -r f; do
   mkdir -p "$ctx/$(dirname "$f")"; cp -p "$f" "$ctx/$f"; done)
cp "${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca.crt"
${DOCKER:-docker} build -q --build-arg "BASE_IMAGE=${BASE_IMAGE:-dgx-spark-lab/base:bookworm}" \
  --label "dgx_spark.lab.content_hash=$(content_hash "$name")" -t "$tag" "$ctx"
