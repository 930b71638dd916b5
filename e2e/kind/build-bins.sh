#!/usr/bin/env bash
# Builds what a kind node needs besides Kubernetes and etcd (those come from
# e2e/cluster/build.sh), from Go modules the module proxy serves, since no
# release download or image registry can be reached:
#
#   containerd, ctr, containerd-shim-runc-v2   github.com/containerd/containerd/v2
#   runc (with seccomp: restricted pods ask for RuntimeDefault)  github.com/opencontainers/runc
#   crictl                                     sigs.k8s.io/cri-tools
#   host-local, loopback, ptp, portmap, bridge github.com/containernetworking/plugins
#   coredns                                    github.com/coredns/coredns
#   local-path-provisioner                     github.com/rancher/local-path-provisioner
#   pause, frota-kind-cni                      our own sources in e2e/kind/images/
#
# Versions follow kind v0.33.0's images/base where the proxy serves them;
# CoreDNS is the one kubeadm v1.34 deploys. Each component is cached by version
# under ~/.cache/frota-e2e/kind-bin/NAME-VERSION; the set is hard-linked into
# one directory, printed last.
#
#   e2e/kind/build-bins.sh          # build or reuse; prints the bin dir last
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.4}
RUNC_VERSION=${RUNC_VERSION:-v1.4.3}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}          # kind's v1.36.0 is not served
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.9.1}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.1}        # kubeadm v1.34's CoreDNSVersion
LOCAL_PATH_VERSION=${LOCAL_PATH_VERSION:-v0.0.30}  # kind's v0.0.34 is not served
CACHE=${FROTA_E2E_CACHE:-$HOME/.cache/frota-e2e}/kind-bin
NICE=(nice -n "${FROTA_E2E_NICE:-10}")

log() { echo "[kind-bins $(date +%H:%M:%S)] $*" >&2; }
die() { echo "kind-bins: $*" >&2; exit 1; }
# go build -v names each package it compiles: show a line every 100.
progress() { awk -v what="$1" '/^#|: / {print > "/dev/stderr"; next}
  {n++; if (n % 100 == 0) printf "[kind-bins] %s: %d packages compiled\n", what, n > "/dev/stderr"}'; }

# Module-mode `go install pkg@version`: each module builds with its own go.mod
# (none of these has replace directives), so no wrapper module is needed.
export GOFLAGS='' GOTOOLCHAIN=local
export GOMODCACHE=${GOMODCACHE:-$(go env GOMODCACHE)} GOCACHE=${GOCACHE:-$(go env GOCACHE)}

# component NAME VERSION FUNC: run FUNC DIR.partial once per NAME-VERSION.
component() {
  local name=$1 version=$2 fn=$3 dir="$CACHE/$1-$2"
  if [ -d "$dir" ]; then
    COMPONENT_DIRS+=("$dir")
    return
  fi
  log "building $name $version"
  local start=$SECONDS
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  "$fn" "$dir.partial" "$version"
  mv "$dir.partial" "$dir"
  log "built $name $version in $((SECONDS - start))s"
  COMPONENT_DIRS+=("$dir")
}

goinstall() {  # goinstall OUTDIR [go install args...]
  local out=$1; shift
  if ! GOBIN=$out "${NICE[@]}" go install -v -trimpath "$@" 2>&1 | progress "${*: -1}"; then
    die "go install ${*: -1} failed"
  fi
}

build_containerd() {
  local out=$1 v=$2 pkg=github.com/containerd/containerd/v2
  # kind's tags: none of the optional snapshotters it never selects.
  local tags="no_aufs no_zfs no_btrfs no_devmapper urfave_cli_no_docs"
  local ld="-s -w -X $pkg/version.Version=$v -X $pkg/version.Package=$pkg"
  CGO_ENABLED=1 goinstall "$out" -tags "$tags" -ldflags "$ld" "$pkg/cmd/containerd@$v" "$pkg/cmd/ctr@$v"
  # The shim is static (as containerd's Makefile builds it): it runs in every pod.
  CGO_ENABLED=0 goinstall "$out" -tags "$tags no_grpc" -ldflags "$ld -extldflags -static" \
    "$pkg/cmd/containerd-shim-runc-v2@$v"
}

build_runc() {
  local out=$1 v=$2
  need_libseccomp
  CGO_ENABLED=1 goinstall "$out" -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w -X main.gitCommit=$v" \
    "github.com/opencontainers/runc@$v"
}

# go_binary OUTDIR VERSION VAR PKG: PKG@VERSION, pure Go (static) and stripped, with
# VERSION stamped into the string variable VAR.
go_binary() {
  local out=$1 v=$2 var=$3 pkg=$4
  CGO_ENABLED=0 goinstall "$out" -ldflags "-s -w -X $var=$v" "$pkg@$v"
}

build_crictl() {
  go_binary "$1" "$2" sigs.k8s.io/cri-tools/pkg/version.Version sigs.k8s.io/cri-tools/cmd/crictl
}

build_cni_plugins() {
  local out=$1 v=$2 m=github.com/containernetworking/plugins/plugins
  CGO_ENABLED=0 goinstall "$out" -ldflags "-s -w" "$m/ipam/host-local@$v" "$m/main/loopback@$v" \
    "$m/main/ptp@$v" "$m/main/bridge@$v" "$m/meta/portmap@$v"
}

build_coredns() {
  go_binary "$1" "$2" github.com/coredns/coredns/coremain.GitCommit github.com/coredns/coredns
}

build_local_path() {
  go_binary "$1" "$2" main.VERSION github.com/rancher/local-path-provisioner
}

# Our own: a pause that reaps zombies, and the CNI agent (stdlib only, so no
# module download). Their "version" is a hash of their sources.
build_pause() {
  "${NICE[@]}" gcc -Os -static -Wall -Werror -o "$1/pause" "$HERE/images/pause/pause.c"
  strip "$1/pause"
}
build_cni_agent() {
  (cd "$HERE/images/cni" && CGO_ENABLED=0 "${NICE[@]}" go build -trimpath -ldflags "-s -w" \
    -o "$1/frota-kind-cni" .)
}
src_hash() { cat "$@" | sha256sum | cut -c1-12; }

need_libseccomp() {
  [ -f /usr/include/seccomp.h ] && return
  log "installing libseccomp-dev (runc's seccomp support links it)"
  command -v apt-get >/dev/null || die "need libseccomp's headers (Debian: libseccomp-dev)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config; } >&2
}

main() {
  command -v go >/dev/null || die "Go is not installed (need Go >= 1.26 on PATH)"
  command -v gcc >/dev/null || die "gcc is needed (containerd and runc use cgo; pause is C)"
  mkdir -p "$CACHE"
  COMPONENT_DIRS=()
  component containerd "$CONTAINERD_VERSION" build_containerd
  component runc "$RUNC_VERSION" build_runc
  component crictl "$CRICTL_VERSION" build_crictl
  component cni-plugins "$CNI_PLUGINS_VERSION" build_cni_plugins
  component coredns "$COREDNS_VERSION" build_coredns
  component local-path-provisioner "$LOCAL_PATH_VERSION" build_local_path
  component pause "$(src_hash images/pause/pause.c)" build_pause
  component frota-kind-cni "$(src_hash images/cni/*.go images/cni/go.mod)" build_cni_agent

  # One directory holding the whole set, named by the set (hard links: free).
  local set
  set=$(printf '%s\n' "${COMPONENT_DIRS[@]##*/}" | sha256sum | cut -c1-12)
  local out="$CACHE/set-$set"
  if [ ! -d "$out" ]; then
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    for d in "${COMPONENT_DIRS[@]}"; do cp -l "$d"/* "$out.partial"/; done
    mv "$out.partial" "$out"
  fi
  log "binaries ready in $out"
  echo "$out"
}

main "$@"
