#!/usr/bin/env bash
# Docker for Frota's image builds and kind: Debian's docker.io, started on demand.
#
#   bash scripts/docker.sh start    # install docker.io + iptables if dockerd is missing;
#                                   # start dockerd unless one already answers; wait for it
#   bash scripts/docker.sh stop     # stop the dockerd *this script* started (pid file), nothing else
#   bash scripts/docker.sh status   # exit 0 when `docker info` answers
#   bash scripts/docker.sh allow BR # accept forwarded traffic on bridge BR (see below)
#
# Or source it and call frota_docker_start / frota_docker_stop / frota_docker_status.
#
# Once dockerd runs it sets the iptables FORWARD policy to DROP (with
# bridge-nf-call-iptables=1), which silently drops traffic on bridges that are
# not Docker's (a libvirt or test-network bridge on the same machine). `start`
# therefore inserts DOCKER-USER ACCEPT rules for each bridge in
# FROTA_DOCKER_BRIDGES and for every non-Docker bridge that exists at that
# moment; rules are checked with `iptables -C` first, so repeating `start` adds nothing.

FROTA_DOCKERD_PIDFILE=${FROTA_DOCKERD_PIDFILE:-/var/run/frota-dockerd.pid}
FROTA_DOCKERD_LOG=${FROTA_DOCKERD_LOG:-/var/log/frota-dockerd.log}
FROTA_DOCKER_BRIDGES=${FROTA_DOCKER_BRIDGES:-}

_frota_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

frota_docker_status() { docker info >/dev/null 2>&1; }

frota_docker_allow() {  # frota_docker_allow BRIDGE...: ACCEPT forwarding into/out of each bridge
  local br dir
  for br in "$@"; do
    for dir in -i -o; do
      _frota_sudo iptables -C DOCKER-USER "$dir" "$br" -j ACCEPT 2>/dev/null ||
        _frota_sudo iptables -I DOCKER-USER "$dir" "$br" -j ACCEPT || return 1
    done
  done
}

_frota_other_bridges() {  # bridges that exist now and are not Docker's (docker0, br-<network id>)
  ip -o link show type bridge 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' |
    grep -Ev '^(docker[0-9]+|br-[0-9a-f]{12})$' || true
}

frota_docker_start() {
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "== installing docker.io and iptables (Debian packages)" >&2
    _frota_sudo apt-get update -qq &&
      _frota_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io iptables >&2 ||
      return 1
  fi
  if ! frota_docker_status; then
    echo "== starting dockerd (log: $FROTA_DOCKERD_LOG)" >&2
    _frota_sudo sh -c "nohup dockerd --pidfile '$FROTA_DOCKERD_PIDFILE' >>'$FROTA_DOCKERD_LOG' 2>&1 &"
    local i
    for i in $(seq 1 60); do
      frota_docker_status && break
      sleep 1
    done
    if ! frota_docker_status; then
      echo "dockerd did not answer within 60 s; last log lines:" >&2
      tail -n 20 "$FROTA_DOCKERD_LOG" >&2
      return 1
    fi
  fi
  # shellcheck disable=SC2046
  frota_docker_allow $FROTA_DOCKER_BRIDGES $(_frota_other_bridges)
}

frota_docker_stop() {
  local pid
  pid=$(cat "$FROTA_DOCKERD_PIDFILE" 2>/dev/null) || { echo "no dockerd started by this script" >&2; return 0; }
  if kill -0 "$pid" 2>/dev/null; then
    echo "== stopping dockerd (pid $pid)" >&2
    _frota_sudo kill -TERM "$pid"
    local i
    for i in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  _frota_sudo rm -f "$FROTA_DOCKERD_PIDFILE"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    start) frota_docker_start ;;
    stop) frota_docker_stop ;;
    status) frota_docker_status && echo "docker is running" || { echo "docker is not running"; exit 1; } ;;
    allow) shift; frota_docker_allow "$@" ;;
    *) echo "usage: $0 start|stop|status|allow BRIDGE..." >&2; exit 2 ;;
  esac
fi
