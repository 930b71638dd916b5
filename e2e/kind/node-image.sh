#!/usr/bin/env bash
# Builds a kind node image for the e2e suite where no image registry and no
# release download can be reached: everything comes from Debian's packages and
# from Go modules, and `kind build node-image` pulls nothing.
#
#   e2e/kind/node-image.sh                      # build or reuse; prints the image last
#   FROTA_KIND_FORCE=1 e2e/kind/node-image.sh   # rebuild the node image
#
# How (each step cached; progress on stderr):
#  1. kind v0.33.0 from its Go module; Kubernetes and etcd (e2e/cluster/build.sh)
#     and, at the same time, containerd, runc, crictl, CNI plugins, CoreDNS,
#     local-path-provisioner, our pause and CNI agent (e2e/kind/build-bins.sh):
#     Go builds cached by version (cold on 2 cores: ~30 min for the two).
#  2. A Debian base by debootstrap (scripts/base-image.sh), then the kind base
#     image (e2e/kind/base/Dockerfile) with kind's own entrypoint and units.
#  3. One image per component, named as kubeadm and kind expect them
#     (registry.k8s.io/..., docker.io/kindest/...), saved into the four image
#     archives of a kubernetes-server-linux-amd64.tar.gz that `kind build
#     node-image --type file` takes. kind pulls only what those archives lack,
#     so they carry every image (see kind_archive.py for why it rewrites them).
#  4. kind build node-image; the result is labelled with a hash of the recipe
#     (versions, binaries' cache keys, these files), and a later run with the
#     same recipe returns at once.
#
# kindnetd cannot be built (the module proxy does not serve its source), so the
# cluster runs with disableDefaultCNI and our own CNI agent (e2e/kind/cni.yaml,
# images/cni); its image also carries kindnetd's tag, only so kind finds that
# tag in the archives and does not try to pull it.
set -euo pipefail
cd "$(dirname "$0")/../.."

K8S_VERSION=${K8S_VERSION:-v1.34.4}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
SUITE=${FROTA_KIND_SUITE:-bookworm}  # systemd 252 runs on cgroup v1; 256+ (trixie) refuses it
NODE_IMAGE=${FROTA_KIND_NODE_IMAGE:-frota-kind-node:$K8S_VERSION}
CNI_IMAGE=frota-kind-cni:v1          # e2e/kind/cni.yaml runs it
DEBIAN_IMAGE=frota-kind/debian:$SUITE
CACHE=${FROTA_E2E_CACHE:-$HOME/.cache/frota-e2e}
LABEL=frota.kind.recipe
export DOCKER_BUILDKIT=0             # BuildKit would pull its frontend image

log() { echo "[kind-node $(date +%H:%M:%S)] $*" >&2; }
die() { echo "kind-node: $*" >&2; exit 1; }
STEPS=()
# timed NAME CMD...: run a step, log and keep its duration for the summary.
timed() {
  local name=$1 start=$SECONDS; shift
  "$@"
  STEPS+=("$name $((SECONDS - start))s")
  log "$name: $((SECONDS - start))s"
}

ensure_docker() {
  if ! docker info >/dev/null 2>&1; then
    [ -f scripts/docker.sh ] || die "docker does not answer"
    bash scripts/docker.sh start >&2
  fi
  # kind's builder execs with --privileged: see docker-caps.sh.
  bash e2e/kind/docker-caps.sh
}

# docker build, without the client's notice that the classic builder is
# deprecated (once per build: noise in the progress). Not niced: dockerd,
# not the client, does the work.
docker_build() {
  docker build "$@" 2> >(grep -v -e '^DEPRECATED: The legacy builder' -e '^ *BuildKit is currently disabled' \
    -e '^ *environment-variable\.$' -e '^$' >&2)
}

ensure_kind() {
  PATH=$PATH:$(go env GOPATH)/bin
  if ! kind version 2>/dev/null | grep -q "^kind $KIND_VERSION "; then
    log "installing kind $KIND_VERSION from its Go module"
    GOFLAGS='' go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
  KIND_SRC=$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION
  [ -d "$KIND_SRC/images/base/files" ] || GOFLAGS='' go mod download "sigs.k8s.io/kind@$KIND_VERSION"
}

debian_base() { bash scripts/base-image.sh "$DEBIAN_IMAGE" "$SUITE" ca-certificates >/dev/null; }
# Both Go builds at once: each already uses every core to compile, but
# module downloads and the single-threaded links of one overlap the other.
# Each logs its own per-binary times; a warm run takes a second.
build_go() {
  local out
  out=$(mktemp)
  bash e2e/kind/build-bins.sh >"$out" &
  local pid=$!
  K8S_BIN=$(bash e2e/cluster/build.sh) || { wait "$pid"; rm -f "$out"; die "e2e/cluster/build.sh failed"; }
  wait "$pid" || { rm -f "$out"; die "e2e/kind/build-bins.sh failed"; }
  NODE_BIN=$(tail -1 "$out")
  rm -f "$out"
}

kind_const() { grep -ho "docker.io/kindest/$1:[^\"]*" "$KIND_SRC"/pkg/build/nodeimage/const_*.go | head -1; }

# The names kubeadm and kind will look for, read from them rather than restated.
read_image_names() {
  local list
  list=$("$K8S_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
  ETCD_TAG=$(grep '/etcd:' <<<"$list")
  COREDNS_TAG=$(grep '/coredns:' <<<"$list")
  PAUSE_TAG=$(grep '/pause:' <<<"$list")
  # base/Dockerfile sets containerd's sandbox image to it (kind preloads that one).
  [ "$PAUSE_TAG" = registry.k8s.io/pause:3.10.1 ] || die "kubeadm wants $PAUSE_TAG: update base/Dockerfile's sandbox_image"
  KINDNETD_TAG=$(kind_const kindnetd)
  LOCAL_PATH_TAG=$(kind_const local-path-provisioner)
  LOCAL_PATH_HELPER_TAG=$(kind_const local-path-helper)
  for v in ETCD_TAG COREDNS_TAG KINDNETD_TAG LOCAL_PATH_TAG LOCAL_PATH_HELPER_TAG; do
    [ -n "${!v}" ] || die "could not read $v from kubeadm or kind's source"
  done
}

recipe_hash() {
  local debian_recipe
  debian_recipe=$(docker image inspect "$DEBIAN_IMAGE" --format '{{index .Config.Labels "frota.base.recipe"}}' 2>/dev/null || true)
  {
    echo "$K8S_VERSION $KIND_VERSION $SUITE ${K8S_BIN##*/} ${NODE_BIN##*/} $debian_recipe"
    cat e2e/kind/node-image.sh e2e/kind/kind_archive.py e2e/kind/base/Dockerfile \
      e2e/kind/images/static/Dockerfile e2e/kind/images/static/rootfs/etc/* e2e/kind/images/netbase/Dockerfile
  } | sha256sum | cut -c1-16
}

# --- the kind base image -----------------------------------------------------
build_base_image() {
  BASE_IMAGE=frota-kind-base:$RECIPE
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && { log "$BASE_IMAGE exists"; return; }
  local ctx=$WORK/base
  rm -rf "$ctx" && mkdir -p "$ctx/bin"
  # kind's files, with the modes its Dockerfile gives them (the module cache is read-only).
  cp -r "$KIND_SRC/images/base/files" "$ctx/files"
  chmod -R u+w "$ctx/files"
  find "$ctx/files" -type d -exec chmod 0755 {} +
  find "$ctx/files" -type f -exec chmod 0644 {} +
  chmod 0755 "$ctx/files/usr/local/bin/"* "$ctx/files/kind/bin/"*
  for b in containerd ctr containerd-shim-runc-v2 runc crictl host-local loopback ptp portmap bridge; do
    cp -l "$NODE_BIN/$b" "$ctx/bin/" 2>/dev/null || cp "$NODE_BIN/$b" "$ctx/bin/"
  done
  log "docker build $BASE_IMAGE (from $DEBIAN_IMAGE: apt-get in the build)"
  docker_build --build-arg "BASE=$DEBIAN_IMAGE" -t "$BASE_IMAGE" \
    -f e2e/kind/base/Dockerfile "$ctx" >&2
}

# --- component images --------------------------------------------------------
build_bases() {
  log "docker build frota-kind/static, frota-kind/netbase"
  docker_build -q --build-arg "DEBIAN=$DEBIAN_IMAGE" -t "frota-kind/static:$SUITE" e2e/kind/images/static >&2
  docker_build -q --build-arg "DEBIAN=$DEBIAN_IMAGE" -t "frota-kind/netbase:$SUITE" \
    e2e/kind/images/netbase >&2
}

# image TAG BASE ENTRYPOINT BINARY:DEST...: a base plus binaries, by a
# Dockerfile written here (classic builder: COPY is cached by content).
image() {
  local tag=$1 base=$2 entrypoint=$3 ctx="$WORK/img/${1//[\/:]/_}" spec src
  shift 3
  rm -rf "$ctx" && mkdir -p "$ctx"
  {
    echo "FROM $base"
    for spec in "$@"; do
      src=${spec%%:*}
      cp -l "$src" "$ctx/" 2>/dev/null || cp "$src" "$ctx/"
      echo "COPY ${src##*/} ${spec#*:}"
    done
    echo "ENTRYPOINT $entrypoint"
  } >"$ctx/Dockerfile"
  docker_build -q -t "$tag" "$ctx" >/dev/null
  log "image $tag"
}

build_component_images() {
  local static=frota-kind/static:$SUITE netbase=frota-kind/netbase:$SUITE b
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    image "registry.k8s.io/$b:$K8S_VERSION" "$static" "[\"/usr/local/bin/$b\"]" "$K8S_BIN/$b:/usr/local/bin/"
  done
  image "registry.k8s.io/kube-proxy:$K8S_VERSION" "$netbase" '["/usr/local/bin/kube-proxy"]' \
    "$K8S_BIN/kube-proxy:/usr/local/bin/"
  # kubeadm's tag; the binary is build.sh's etcd (a later v3.6 patch release).
  image "$ETCD_TAG" "$static" '["/usr/local/bin/etcd"]' "$K8S_BIN/etcd:/usr/local/bin/"
  # kubeadm's CoreDNS Deployment gives only args: the image's entrypoint is /coredns.
  image "$COREDNS_TAG" "$static" '["/coredns"]' "$NODE_BIN/coredns:/coredns"
  image "$PAUSE_TAG" "$static" '["/pause"]' "$NODE_BIN/pause:/pause"
  image "$LOCAL_PATH_TAG" "$static" '["/usr/local/bin/local-path-provisioner"]' \
    "$NODE_BIN/local-path-provisioner:/usr/local/bin/"
  image "$CNI_IMAGE" "$netbase" '["/usr/local/bin/frota-kind-cni"]' "$NODE_BIN/frota-kind-cni:/usr/local/bin/"
  docker tag "$CNI_IMAGE" "$KINDNETD_TAG"
  # The helper runs sh, mkdir and rm: the Debian base has them.
  docker tag "$DEBIAN_IMAGE" "$LOCAL_PATH_HELPER_TAG"
}

# --- the Kubernetes "release" tarball kind builds from -------------------------
# archive NAME IMAGE...: kubernetes/server/bin/NAME.tar holding those images.
archive() {
  local name=$1; shift
  docker save -o "$WORK/raw.tar" "$@"
  python3 e2e/kind/kind_archive.py "$WORK/raw.tar" "$SERVER_BIN/$name.tar" | sed "s/^/[kind-node]   $name.tar: /" >&2
  rm -f "$WORK/raw.tar"
}

build_tarball() {
  SERVER_BIN=$WORK/tarball/kubernetes/server/bin
  rm -rf "$WORK/tarball" && mkdir -p "$SERVER_BIN"
  cp "$K8S_BIN"/{kubeadm,kubelet,kubectl} "$SERVER_BIN/"
  echo "$K8S_VERSION" >"$WORK/tarball/kubernetes/version"
  # Images sharing a base go together: an archive stores a layer once.
  archive kube-apiserver "registry.k8s.io/kube-apiserver:$K8S_VERSION" "$ETCD_TAG" "$COREDNS_TAG" \
    "$PAUSE_TAG" "$LOCAL_PATH_TAG"
  archive kube-controller-manager "registry.k8s.io/kube-controller-manager:$K8S_VERSION"
  archive kube-scheduler "registry.k8s.io/kube-scheduler:$K8S_VERSION"
  archive kube-proxy "registry.k8s.io/kube-proxy:$K8S_VERSION" "$CNI_IMAGE" "$KINDNETD_TAG" \
    "$LOCAL_PATH_HELPER_TAG"
  TARBALL=$WORK/kubernetes-server-linux-amd64.tar.gz
  local gz=gzip
  command -v pigz >/dev/null && gz=pigz
  tar -C "$WORK/tarball" -cf - kubernetes | nice -n 10 "$gz" -1 >"$TARBALL"
  rm -rf "$WORK/tarball"
  log "$(du -h "$TARBALL" | cut -f1) $TARBALL"
}

kind_build() {
  log "kind build node-image (its 'docker pull' of the local base fails, as it may: kind goes on)"
  # Without ctr import's progress table (a screenful per archive) and
  # containerd's cgroup v1 notices.
  nice -n 10 kind build node-image --type file "$TARBALL" --base-image "$BASE_IMAGE" \
    --image "$NODE_IMAGE.partial" 2>&1 |
    grep -Ev '	saved	|^Importing	|^application/vnd|level=warning msg="DEPRECATION: The support for cgroup v1' >&2
  # The recipe label makes the next run a no-op; kind's commit cannot add one.
  printf 'FROM %s\nLABEL %s=%s\n' "$NODE_IMAGE.partial" "$LABEL" "$RECIPE" |
    docker_build -q -t "$NODE_IMAGE" - >/dev/null
  docker rmi "$NODE_IMAGE.partial" >/dev/null
}

# Base images of earlier recipes (the node image keeps its own layers).
drop_stale_bases() {
  docker image ls --format '{{.Repository}}:{{.Tag}}' frota-kind-base | grep -vx "$BASE_IMAGE" |
    xargs -r docker rmi >/dev/null 2>&1 || true
}

main() {
  local start=$SECONDS
  ensure_docker
  ensure_kind
  timed "go builds" build_go
  read_image_names
  timed "debian base" debian_base
  RECIPE=$(recipe_hash)
  local have
  have=$(docker image inspect "$NODE_IMAGE" --format "{{index .Config.Labels \"$LABEL\"}}" 2>/dev/null || true)
  if [ "$have" = "$RECIPE" ] && [ "${FROTA_KIND_FORCE:-0}" != 1 ]; then
    log "$NODE_IMAGE is up to date (recipe $RECIPE; ${SECONDS}s)"
    echo "$NODE_IMAGE"
    return
  fi
  WORK=$CACHE/kind-work/$RECIPE
  mkdir -p "$WORK"
  timed "kind base image" build_base_image
  timed "component bases" build_bases
  timed "component images" build_component_images
  timed "server tarball" build_tarball
  timed "kind build node-image" kind_build
  rm -rf "$WORK"
  drop_stale_bases
  log "built $NODE_IMAGE in $((SECONDS - start))s: ${STEPS[*]}"
  log "size: $(docker image inspect "$NODE_IMAGE" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"
  echo "$NODE_IMAGE"
}

main "$@"
