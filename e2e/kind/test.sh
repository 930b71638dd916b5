#!/usr/bin/env bash
# Runs the e2e suite on a kind cluster: up.sh creates it (node image built
# here, the Frota images loaded, the operator applied), pytest runs e2e/
# against it, and the cluster is deleted afterwards, also after a failure.
#
#   e2e/kind/test.sh [pytest args]     # KEEP_CLUSTER=1 keeps the cluster afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."
export KIND_CLUSTER=${KIND_CLUSTER:-frota-e2e}
export KIND_KUBECONFIG=${KIND_KUBECONFIG:-$PWD/e2e/.work/kind-kubeconfig}
# The worker image up.sh loads and the tests run (scripts/images.sh builds it).
export FROTA_E2E_IMAGE=${FROTA_E2E_IMAGE:-frota-worker:dev}
PATH=$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin  # kind's go install
if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'kind delete cluster --name "$KIND_CLUSTER"' EXIT
fi
bash e2e/kind/up.sh
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# The kubectl of the cluster's own version (built beside the node image's binaries).
FROTA_E2E_KUBECTL="$(bash e2e/cluster/build.sh)/kubectl"
export FROTA_E2E_KUBECTL
# In the background, so a signal reaches the traps at once, not after pytest.
FROTA_E2E_KUBECONFIG=$KIND_KUBECONFIG "$PY" -m pytest -v -p no:cacheprovider e2e/ "$@" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 130' INT TERM
wait $pid
