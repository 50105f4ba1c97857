#!/usr/bin/env bash
# Make sure a Docker engine answers. On Debian/Ubuntu as root: install docker.io (and
# debootstrap for the lab images) and start dockerd with the 198.18.0.0/15 addresses.
# Elsewhere: say exactly what is missing.
set -euo pipefail
DOCKER_HOST_SOCK=/var/run/docker.sock

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
if ! engine_answers; then
  mkdir -p /var/log
  echo "ensure-docker: starting dockerd (log: /var/log/dockerd.log)" >&2
  nohup dockerd --bip 198.18.0.1/24 --default-address-pool base=198.19.0.0/16,size=24 \
    >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do engine_answers && break; sleep 1; done
fi
if ! engine_answers; then
  echo "ensure-docker: dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
  tail -n 5 /var/log/dockerd.log >&2 || true
  exit 1
fi
