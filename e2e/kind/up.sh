#!/usr/bin/env bash
# Creates (or reuses) a kind cluster for the e2e suite: builds the operator and
# worker images, loads them into the cluster, applies crds/ and manifests/.
# Needs docker, kind and kubectl. Writes the kubeconfig to e2e/.work/kind-kubeconfig.
#
#   e2e/kind/up.sh            # KIND_CLUSTER=frota-e2e by default
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-frota-e2e}
# The dev overlay runs frota-operator:dev, the image built here.
OPERATOR_IMAGE=${FROTA_OPERATOR_IMAGE:-frota-operator:dev}
WORKER_IMAGE=${FROTA_E2E_IMAGE:-frota-worker:e2e}
KUBECONFIG_OUT=${KIND_KUBECONFIG:-$PWD/e2e/.work/kind-kubeconfig}

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e/kind: $tool is not installed" >&2; exit 1; }
done
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "== kind create cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s
fi
mkdir -p "$(dirname "$KUBECONFIG_OUT")"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_OUT"
export KUBECONFIG=$KUBECONFIG_OUT

echo "== docker build $OPERATOR_IMAGE, $WORKER_IMAGE"
docker build -t "$OPERATOR_IMAGE" -f operator/Dockerfile .
docker build -t "$WORKER_IMAGE" -f worker_image/Dockerfile .
echo "== kind load"
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$WORKER_IMAGE"

if compgen -G "crds/*.yaml" >/dev/null; then
  echo "== apply crds/"
  if [ -f crds/kustomization.yaml ]; then kubectl apply --server-side -k crds/; else kubectl apply --server-side -f crds/; fi
  sleep 2  # kubectl wait errors on a CRD with no status conditions yet
  kubectl wait --for=condition=Established crd --all --timeout=60s
fi
# The e2e overlay when there is one, else dev, else the base (as e2e/test_operator_install.py).
for k in manifests/overlays/e2e manifests/overlays/dev manifests/base; do
  if [ -f "$k/kustomization.yaml" ]; then
    echo "== apply -k $k"
    # One step: the manifests hold no custom resource (the operator creates its peering object).
    kubectl apply --server-side -k "$k"
    break
  fi
done
echo "kind cluster $CLUSTER ready; export KUBECONFIG=$KUBECONFIG_OUT"
