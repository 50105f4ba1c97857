#!/usr/bin/env bash
# Make sure a Docker engine answers. On Debian/Ubuntu as root: install docker.io (and
# debootstrap for the lab images) and start dockerd with the 198.18.0.0/15 addresses.
# Where systemd is PID 1 the engine is docker.service (enabled, so it comes back after a reboot) with
# the lab's addresses in a drop-in; elsewhere (a container, as on the CI machine) dockerd is started
# with nohup and does not survive a reboot: run `make engine` again after one.
# Elsewhere: say exactly what is missing.
set -euo pipefail
DOCKER_HOST_SOCK=/var/run/docker.sock
DOCKERD_ADDRESSES=(--bip 198.18.0.1/24 --default-address-pool 'base=198.19.0.0/16,size=24')
DROP_IN=/etc/systemd/system/docker.service.d/dgx-spark-lab.conf

engine_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

need_debootstrap() { ! command -v debootstrap >/dev/null 2>&1; }

if engine_answers && ! need_debootstrap; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  engine_answers || echo "ensure-docker: no Docker engine answers at $DOCKER_HOST_SOCK; start one (dockerd) or install Docker." >&2
  need_debootstrap && echo "ensure-docker: debootstrap is missing (the lab builds its images with it); install it." >&2
  exit 1
fi
pkgs=()
command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
need_debootstrap && pkgs+=(debootstrap)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "ensure-docker: installing ${pkgs[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
if ! engine_answers && [ -d /run/systemd/system ]; then
  # The packaged unit's own command line, plus the lab's addresses.
  mkdir -p "$(dirname "$DROP_IN")"
  printf '%s\n' '# Written by dgx_spark.vllm scripts/ensure-docker.sh: the lab'"'"'s addresses (198.18.0.0/15).' \
    '[Service]' 'ExecStart=' \
    "ExecStart=$(command -v dockerd) -H fd:// --containerd=/run/containerd/containerd.sock ${DOCKERD_ADDRESSES[*]}" \
    >"$DROP_IN"
  echo "ensure-docker: starting docker.service, enabled at boot ($DROP_IN)" >&2
  systemctl daemon-reload
  systemctl enable --now docker.service
  for _ in $(seq 1 60); do engine_answers && break; sleep 1; done
  if ! engine_answers; then
    echo "ensure-docker: docker.service did not answer within 60 s; see journalctl -u docker.service" >&2
    exit 1
  fi
elif ! engine_answers; then
  mkdir -p /var/log
  echo "ensure-docker: starting dockerd with nohup (log: /var/log/dockerd.log); PID 1 is not systemd, so" \
    "it does not come back after a reboot: run make engine (scripts/ensure-docker.sh) again then" >&2
  nohup dockerd "${DOCKERD_ADDRESSES[@]}" >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do engine_answers && break; sleep 1; done
fi
if ! engine_answers; then
  echo "ensure-docker: dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
  tail -n 5 /var/log/dockerd.log >&2 || true
  exit 1
fi
