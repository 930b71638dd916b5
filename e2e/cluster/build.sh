#!/usr/bin/env bash
# Builds the Kubernetes binaries the e2e suite runs on, from Go modules the
# module proxy serves: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, and for a kind node image (e2e/kind/node-image.sh) kube-proxy,
# kubelet and kubeadm (k8s.io/kubernetes); and etcd (go.etcd.io/etcd/server/v3).
# Binaries are cached by version outside the repo, so a later run (or a fresh
# clone on the same machine) takes seconds; Go's module and build caches
# persist too.
#
#   e2e/cluster/build.sh            # build or reuse; prints the bin dir last
#   K8S_VERSION=v1.34.4 ETCD_VERSION=v3.6.16 e2e/cluster/build.sh
#
# Cold on 2 cores: ~25-40 min (niced); warm: a second.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${FROTA_E2E_CACHE:-$HOME/.cache/frota-e2e}
BIN="$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kube-proxy kubelet kubeadm)

log() { echo "[e2e-build $(date +%H:%M:%S)] $*" >&2; }
# go build -v names each package as it compiles; show a line every 100.
progress() { awk -v what="$1" '/^#|: / {print > "/dev/stderr"; next}
  {n++; if (n % 100 == 0) printf "[e2e-build] %s: %d packages compiled (%s)\n", what, n, $0 > "/dev/stderr"}'; }
die() { echo "e2e-build: $*" >&2; exit 1; }

have_all() {
  for b in "${K8S_BINS[@]}" etcd; do [ -x "$BIN/$b" ] || return 1; done
}
if have_all; then
  log "binaries cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || die "Go is not installed (need Go >= 1.24 on PATH); install it, e.g. 'apt-get install golang-go' or from go.dev, then rerun."
export CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE=${GOMODCACHE:-$(go env GOMODCACHE)}
export GOCACHE=${GOCACHE:-$(go env GOCACHE)}
log "go: $(go version); proxy: $(go env GOPROXY)"
mkdir -p "$CACHE"
if ! go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null 2>"$CACHE/download.err"; then
  cat "$CACHE/download.err" >&2 || true
  die "cannot download k8s.io/kubernetes@$K8S_VERSION: is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?"
fi

mkdir -p "$CACHE/src" "$BIN.partial"
# A cache from before the list grew: keep its binaries, build only the missing.
if [ -d "$BIN" ]; then cp -n "$BIN"/* "$BIN.partial"/; fi
NICE=(nice -n "${FROTA_E2E_NICE:-19}")

# --- kubernetes: a wrapper module whose replace lines pin the staging modules
# (which k8s.io/kubernetes's own go.mod points at ./staging) to v0.x.y.
kdir="$CACHE/src/kubernetes-$K8S_VERSION"
mkdir -p "$kdir"
staging_version="v0.${K8S_VERSION#v1.}"
kmod="$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/go.mod"
mapfile -t staging < <(grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$kmod" | awk '{print $1}')
[ "${#staging[@]}" -gt 10 ] || die "could not read staging modules from $kmod"
{
  echo "module frota.dev/e2e/kubebins"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  for m in "${staging[@]}"; do echo "	$m => $m $staging_version"; done
  echo ")"
} > "$kdir/go.mod"
{
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  for b in "${K8S_BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
  echo ")"
} > "$kdir/tools.go"
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
(
  cd "$kdir"
  log "resolving kubernetes $K8S_VERSION modules (staging $staging_version)"
  [ -f go.sum ] || "${NICE[@]}" go mod tidy -e 2>&1 | tail -5 >&2
  for b in "${K8S_BINS[@]}"; do
    [ -x "$BIN.partial/$b" ] && continue
    log "building $b (a cold build compiles ~2000 packages: many minutes)"
    start=$SECONDS
    "${NICE[@]}" go build -v -tags tools -trimpath -ldflags "$ldflags" -o "$BIN.partial/$b" \
      "k8s.io/kubernetes/cmd/$b" 2>&1 | progress "$b"
    log "built $b in $((SECONDS - start))s"
  done
)

# --- etcd: its own wrapper module (its dependencies differ from kubernetes').
edir="$CACHE/src/etcd-$ETCD_VERSION"
mkdir -p "$edir"
cat > "$edir/go.mod" <<EOF
module frota.dev/e2e/etcdbin

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
cat > "$edir/tools.go" <<EOF
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
(
  cd "$edir"
  if [ ! -x "$BIN.partial/etcd" ]; then
    log "resolving etcd $ETCD_VERSION modules"
    [ -f go.sum ] || "${NICE[@]}" go mod tidy -e 2>&1 | tail -5 >&2
    log "building etcd"
    start=$SECONDS
    "${NICE[@]}" go build -v -tags tools -trimpath -ldflags "-s -w" -o "$BIN.partial/etcd" \
      go.etcd.io/etcd/server/v3 2>&1 | progress etcd
    log "built etcd in $((SECONDS - start))s"
  fi
)

rm -rf "$BIN"
mv "$BIN.partial" "$BIN"
log "binaries ready in $BIN"
echo "$BIN"
