#!/usr/bin/env bash
# Builds prometheus and promtool from the github.com/prometheus/prometheus Go
# module (the proxy serves it), for the alert-rule unit tests
# (tests/monitoring) and the monitoring e2e (e2e/test_monitoring.py).
# Cached by version outside the repo like e2e/cluster/build.sh's binaries.
#
#   e2e/cluster/prometheus.sh       # build or reuse; prints the bin dir last
#   PROMETHEUS_VERSION=v0.316.0 e2e/cluster/prometheus.sh
#
# Only Kubernetes service discovery is compiled in (remove_all_sd +
# enable_kubernetes_sd): the e2e needs no other, and the cloud SDKs the rest
# pull in would double the build. No built-in web UI assets: the HTTP API is
# all the tests use. Cold on 2 cores: ~8 min (niced, an empty Go build cache); warm: a second.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
CACHE=${FROTA_E2E_CACHE:-$HOME/.cache/frota-e2e}
BIN="$CACHE/bin/prometheus-$PROMETHEUS_VERSION"
BINS=(prometheus promtool)
MOD=github.com/prometheus/prometheus

log() { echo "[e2e-prometheus $(date +%H:%M:%S)] $*" >&2; }
# go build -v names each package as it compiles; show a line every 100.
progress() { awk -v what="$1" '/^#|: / {print > "/dev/stderr"; next}
  {n++; if (n % 100 == 0) printf "[e2e-prometheus] %s: %d packages compiled (%s)\n", what, n, $0 > "/dev/stderr"}'; }
die() { echo "e2e-prometheus: $*" >&2; exit 1; }

have_all() {
  for b in "${BINS[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}
if have_all; then
  log "binaries cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || die "Go is not installed (need Go >= 1.26 on PATH); install it, e.g. from go.dev, then rerun."
export CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE=${GOMODCACHE:-$(go env GOMODCACHE)}
export GOCACHE=${GOCACHE:-$(go env GOCACHE)}
log "go: $(go version); proxy: $(go env GOPROXY)"
mkdir -p "$CACHE"
if ! go mod download -json "$MOD@$PROMETHEUS_VERSION" >/dev/null 2>"$CACHE/download.err"; then
  cat "$CACHE/download.err" >&2 || true
  die "cannot download $MOD@$PROMETHEUS_VERSION: is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?"
fi

NICE=(nice -n "${FROTA_E2E_NICE:-19}")
# A wrapper module: prometheus's own go.mod has no replace lines, so requiring
# it pins every dependency at the versions its go.mod names.
pdir="$CACHE/src/prometheus-$PROMETHEUS_VERSION"
mkdir -p "$pdir" "$BIN.partial"
cat > "$pdir/go.mod" <<EOF
module frota.dev/e2e/prometheusbins

go 1.26

require $MOD $PROMETHEUS_VERSION
EOF
cat > "$pdir/tools.go" <<EOF
//go:build tools

package tools

import (
	_ "$MOD/cmd/prometheus"
	_ "$MOD/cmd/promtool"
)
EOF
vpkg=github.com/prometheus/common/version
ldflags="-s -w -X $vpkg.Version=${PROMETHEUS_VERSION#v} -X $vpkg.Branch=HEAD -X $vpkg.BuildUser=frota-e2e -X $vpkg.BuildDate=19700101-00:00:00"
tags="tools,remove_all_sd,enable_kubernetes_sd"
(
  cd "$pdir"
  log "resolving $MOD $PROMETHEUS_VERSION modules"
  [ -f go.sum ] || "${NICE[@]}" go mod tidy -e 2>&1 | tail -5 >&2
  for b in "${BINS[@]}"; do
    [ -x "$BIN.partial/$b" ] && continue
    log "building $b"
    start=$SECONDS
    "${NICE[@]}" go build -v -tags "$tags" -trimpath -ldflags "$ldflags" -o "$BIN.partial/$b" \
      "$MOD/cmd/$b" 2>&1 | progress "$b"
    log "built $b in $((SECONDS - start))s"
  done
)

rm -rf "$BIN"
mv "$BIN.partial" "$BIN"
log "binaries ready in $BIN"
echo "$BIN"
