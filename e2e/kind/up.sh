#!/usr/bin/env bash
# Creates (or reuses) the e2e suite's kind cluster, offline: the node image is
# built here (e2e/kind/node-image.sh) with every image the cluster runs, so
# nothing is pulled. Then: our pod network (cni.yaml), nodes Ready, CoreDNS
# up, fake GPUs on the workers, the Frota images loaded. Installing the operator
# is the user's step (`kubectl apply -k manifests/overlays/dev`), and the e2e
# suite's first test.
#
#   e2e/kind/up.sh          # KIND_CLUSTER=frota-e2e; writes $KIND_KUBECONFIG
#
# Environment:
#   KIND_CLUSTER          cluster name (frota-e2e)
#   KIND_KUBECONFIG       where the kubeconfig goes (e2e/.work/kind-kubeconfig)
#   KIND_CONFIG           kind config (e2e/kind/cluster.yaml)
#   KIND_NODE_IMAGE       use this node image instead of building one
#   FROTA_OPERATOR_IMAGE  operator image to load (frota-operator:dev, the dev overlay's)
#   FROTA_E2E_IMAGE       worker image to load (frota-worker:dev)
#   FROTA_E2E_VLLM_IMAGE  vLLM image to load (frota-vllm-cpu:dev)
#   FROTA_E2E_GPUS        nvidia.com/gpu each worker advertises (2; 0: none)
#   FROTA_KIND_LOAD=0     stop after the cluster is up (no images loaded)
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-frota-e2e}
KUBECONFIG_OUT=${KIND_KUBECONFIG:-$PWD/e2e/.work/kind-kubeconfig}
CONFIG=${KIND_CONFIG:-e2e/kind/cluster.yaml}
OPERATOR_IMAGE=${FROTA_OPERATOR_IMAGE:-frota-operator:dev}
WORKER_IMAGE=${FROTA_E2E_IMAGE:-frota-worker:dev}
VLLM_IMAGE=${FROTA_E2E_VLLM_IMAGE:-frota-vllm-cpu:dev}
GPUS=${FROTA_E2E_GPUS:-2}

log() { echo "== e2e/kind $(date +%H:%M:%S): $*" >&2; }
die() { echo "e2e/kind: $*" >&2; exit 1; }

tools() {
  docker info >/dev/null 2>&1 || bash scripts/docker.sh start >&2
  bash e2e/kind/docker-caps.sh  # kind's nodes are privileged containers
  PATH=$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin
}

# kubectl of the cluster's own version, built with the node image's binaries
# (after node-image.sh, so a cold build runs there, beside the other Go builds).
kubectl_path() {
  local bin
  bin=$(bash e2e/cluster/build.sh)
  PATH=$bin:$PATH
  for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null || die "$tool is not installed (e2e/kind/node-image.sh installs kind)"
  done
}

create_cluster() {
  if command -v kind >/dev/null && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER"
    kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_OUT"
    # A run that was killed (its EXIT trap never ran) leaves its tests' namespaces, whose
    # pods keep the nodes' CPU requested: this run's pods would stay Pending. They go first.
    local stale
    stale=$(kubectl --kubeconfig "$KUBECONFIG_OUT" get namespaces -o name | grep '^namespace/e2e-' || true)
    if [ -n "$stale" ]; then
      log "deleting the namespaces an earlier run left: $(echo $stale)"
      # shellcheck disable=SC2086  # one argument per namespace
      kubectl --kubeconfig "$KUBECONFIG_OUT" delete $stale --timeout=300s
    fi
    return
  fi
  local image=${KIND_NODE_IMAGE:-}
  [ -n "$image" ] || image=$(bash e2e/kind/node-image.sh)  # installs kind too
  command -v kind >/dev/null || die "kind is not installed (e2e/kind/node-image.sh installs it)"
  log "kind create cluster $CLUSTER ($image, $CONFIG)"
  local start=$SECONDS
  # No --wait: without a CNI (cluster.yaml disables kindnetd) no node is Ready yet.
  kind create cluster --name "$CLUSTER" --image "$image" --config "$CONFIG" \
    --kubeconfig "$KUBECONFIG_OUT" >&2
  log "kind create cluster: $((SECONDS - start))s"
}

wait_ready() {
  local start=$SECONDS
  kubectl apply -f e2e/kind/cni.yaml >&2
  kubectl -n kube-system rollout status daemonset/frota-kind-cni --timeout=180s >&2
  kubectl wait --for=condition=Ready node --all --timeout=180s >&2
  kubectl -n kube-system rollout status deployment/coredns --timeout=180s >&2
  log "nodes Ready, CoreDNS up: $((SECONDS - start))s"
}

# Extended resources are whatever a node's status says; the e2e GPU samples
# select nvidia.com/gpu.present=true and request nvidia.com/gpu.
fake_gpus() {
  [ "$GPUS" -gt 0 ] || return 0
  local node
  for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
    kubectl label --overwrite "$node" nvidia.com/gpu.present=true >/dev/null
    kubectl patch "$node" --subresource=status --type=json \
      -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS\"}]" >/dev/null
    log "$node: nvidia.com/gpu=$GPUS"
  done
}

# Into the nodes that run pods only (the control plane is tainted), by load.sh: a
# node keeps each layer once, and the vLLM image adds one layer to the worker's.
load_images() {
  local image nodes images=()
  nodes=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name | sed 's|^node/||' | paste -sd,)
  [ -n "$nodes" ] || nodes=$(kubectl get nodes -o name | sed 's|^node/||' | paste -sd,)  # a lone control plane
  for image in "$OPERATOR_IMAGE" "$WORKER_IMAGE" "$VLLM_IMAGE"; do
    if docker image inspect "$image" >/dev/null 2>&1; then
      images+=("$image")
    else
      log "no image $image here, not loaded (scripts/images.sh builds it)"
    fi
  done
  [ ${#images[@]} = 0 ] || bash e2e/kind/load.sh "$nodes" "${images[@]}"
}

main() {
  mkdir -p "$(dirname "$KUBECONFIG_OUT")"
  tools
  create_cluster
  kubectl_path
  export KUBECONFIG=$KUBECONFIG_OUT
  wait_ready
  fake_gpus
  [ "${FROTA_KIND_LOAD:-1}" = 0 ] || load_images
  echo "kind cluster $CLUSTER ready; export KUBECONFIG=$KUBECONFIG_OUT"
}

main "$@"
