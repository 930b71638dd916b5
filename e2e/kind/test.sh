#!/usr/bin/env bash
# Runs the e2e suite on kind: the same pytest files as on the local control
# plane, given the kind kubeconfig and the port-forward address strategy.
#
#   e2e/kind/test.sh [pytest args]     # KEEP_CLUSTER=1 keeps the cluster afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-frota-e2e}
export KIND_KUBECONFIG=${KIND_KUBECONFIG:-$PWD/e2e/.work/kind-kubeconfig}
# The worker image up.sh loads and the tests run (scripts/images.sh builds it).
export FROTA_E2E_IMAGE=${FROTA_E2E_IMAGE:-frota-worker:dev}
PATH=$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin  # kind's go install
if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'kind delete cluster --name "$CLUSTER"' EXIT
fi
bash e2e/kind/up.sh
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
FROTA_E2E_KUBECONFIG=$KIND_KUBECONFIG FROTA_E2E_ADDRESS=port-forward \
  "$PY" -m pytest -v e2e/ "$@"
