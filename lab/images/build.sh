#!/bin/sh
# Build one lab runtime image from a staged context (image dir + host CA [+ a wheelhouse filled on
# the controller]).
#   lab/images/build.sh NAME [TAG]   build NAME (runtime-donor | runtime-old); prints the image ID
#   lab/images/build.sh --hash NAME  print the content hash of NAME's inputs (for content tags)
# TAG defaults to dgx-spark-lab/NAME:<content hash>. Env: BASE_IMAGE, CA_BUNDLE, DOCKER,
# LAB_WHEELHOUSE (default .lab/cache/wheelhouse), LAB_PIP_PYTHON (default python3).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
wheelhouse=${LAB_WHEELHOUSE:-$here/../../.lab/cache/wheelhouse}

inputs() {  # the files a build reads, stable order, caches and tests left out
  (cd "$here/.." && find "images/$1" -type f \
     -not -path '*/tests/*' -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
     -not -path '*/build/*' -not -name '*.pyc' | LC_ALL=C sort)
}

content_hash() {
  (cd "$here/.." && inputs "$1" | while read -r f; do printf '%s\n' "$f"; cat "$f"; done \
     | sha256sum | cut -c1-12)
}

if [ "${1:-}" = "--hash" ]; then content_hash "$2"; exit 0; fi
name=${1:?usage: build.sh NAME [TAG] | --hash NAME}
[ -f "$here/$name/Dockerfile" ] || { echo "no image named $name under $here" >&2; exit 2; }
tag=${2:-dgx-spark-lab/$name:$(content_hash "$name")}
mkdir -p "$wheelhouse"
ctx=$(mktemp -d "$(dirname "$wheelhouse")/build-ctx.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
(cd "$here/.." && inputs "$name" | while read -r f; do
   dest="$ctx/${f#images/"$name"/}"; mkdir -p "$(dirname "$dest")"; cp -p "$f" "$dest"; done)
cp "${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca.crt"
if [ -f "$here/$name/requirements.txt" ]; then
  # The image installs from wheels only. pip runs here, with this machine's pip configuration (its
  # index, proxy CA and find-links), so it must be the image's Python: Debian bookworm's 3.11, x86_64.
  py=${LAB_PIP_PYTHON:-python3}
  got=$("$py" -c 'import platform, sys; print("%d.%d-%s" % (sys.version_info[:2] + (platform.machine(),)))')
  if [ "$got" != "3.11-x86_64" ]; then
    echo "build.sh: the wheelhouse for $name needs Python 3.11 on x86_64 (the image's); $py is $got." \
      "Set LAB_PIP_PYTHON to a python3.11." >&2
    exit 2
  fi
  "$py" -m pip download -q --disable-pip-version-check -d "$wheelhouse" -r "$here/$name/requirements.txt" >&2
  # Hard links when the wheelhouse shares the file system: no second copy of ~1 GB.
  cp -al "$wheelhouse" "$ctx/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$ctx/wheelhouse"
fi
${DOCKER:-docker} build -q --build-arg "BASE_IMAGE=${BASE_IMAGE:-dgx-spark-lab/base:bookworm}" \
  --label "dgx_spark.lab.content_hash=$(content_hash "$name")" -t "$tag" "$ctx"
