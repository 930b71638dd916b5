#!/usr/bin/env bash
# Makes privileged containers work under Docker 20.10 on a machine whose
# capability bounding set is short of some capability (this kind of sandbox
# lacks CAP_SYS_RESOURCE): Docker would grant it to every --privileged
# container and `docker exec --privileged`, and runc fails with "unable to
# apply caps: operation not permitted" (moby/moby#42906). kind's nodes are
# privileged containers, and `kind build node-image` execs with --privileged.
#
# On such a machine only: installs e2e/kind/runc-bounded (runc minus the
# missing capabilities) as /usr/local/libexec/frota/runc-bounded, registers it
# in /etc/docker/daemon.json as the default runtime (other keys kept), and
# asks a running dockerd to reload its config (SIGHUP: containers keep
# running). A machine with every capability is left alone.
#
#   bash e2e/kind/docker-caps.sh     # idempotent; exit 1 if privileged still fails
set -euo pipefail
cd "$(dirname "$0")"
DEST=/usr/local/libexec/frota/runc-bounded
CONF=/etc/docker/daemon.json
RUNTIME=frota-runc

log() { echo "[docker-caps] $*" >&2; }

bounding_is_full() {
  local last bnd
  last=$(cat /proc/sys/kernel/cap_last_cap)
  bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  [ $((16#$bnd)) = $(((1 << (last + 1)) - 1)) ]
}

install_wrapper() {
  local real
  real=$(command -v runc || true)
  [ -n "$real" ] || { log "no runc on PATH"; exit 1; }
  mkdir -p "${DEST%/*}"
  # The real runc's path goes into the copy: dockerd runs it with its own PATH.
  sed "s|\"FROTA_REAL_RUNC\", \"/usr/sbin/runc\"|\"FROTA_REAL_RUNC\", \"$real\"|" runc-bounded >"$DEST.tmp"
  chmod 0755 "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
}

register_runtime() {  # prints "changed" when daemon.json changed
  mkdir -p "${CONF%/*}"
  python3 - "$CONF" "$RUNTIME" "$DEST" <<'PY'
import json, os, sys
conf, name, path = sys.argv[1:]
cfg = json.load(open(conf)) if os.path.exists(conf) and os.path.getsize(conf) else {}
want = dict(cfg, runtimes=dict(cfg.get("runtimes", {}), **{name: {"path": path}}))
want["default-runtime"] = name
if want != cfg:
    with open(conf + ".tmp", "w") as f:
        json.dump(want, f, indent=2)
    os.replace(conf + ".tmp", conf)
    print("changed")
PY
}

reload_dockerd() {
  local pid
  pid=$(pidof dockerd || true)
  [ -n "$pid" ] || return 0  # not running: it reads daemon.json when it starts
  log "dockerd ($pid) reloads $CONF"
  kill -HUP "$pid"
  local _
  for _ in $(seq 20); do
    [ "$(docker info --format '{{.DefaultRuntime}}' 2>/dev/null)" = "$RUNTIME" ] && return 0
    sleep 0.5
  done
  log "dockerd did not take the $RUNTIME runtime; see its log"
  exit 1
}

main() {
  if bounding_is_full; then
    exit 0
  fi
  log "this machine's capability bounding set lacks some capabilities: privileged containers go through $DEST"
  install_wrapper
  if [ -n "$(register_runtime)" ] || [ "$(docker info --format '{{.DefaultRuntime}}' 2>/dev/null)" != "$RUNTIME" ]; then
    reload_dockerd
  fi
}

main "$@"
