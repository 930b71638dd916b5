#!/usr/bin/env bash
# The end-to-end suite, the way users run Frota: the project's own images in
# containers on a kind cluster.
#   1. Docker (Debian's docker.io; started here, and stopped after, when it was not running)
#   2. the operator and worker images (scripts/images.sh; layer cache makes reruns quick)
#   3. a kind node image built from Go modules and Debian packages (e2e/kind/node-image.sh, cached)
#   4. a fresh cluster, the images loaded, the operator applied, pytest e2e/ (e2e/kind/test.sh;
#      the cluster is deleted afterwards, also after a failure)
# FROTA_E2E=0 skips it; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FROTA_E2E:-1}" = 0 ]; then
  echo "== e2e skipped (FROTA_E2E=0)"
  exit 0
fi
[ -x .venv/bin/python ] || source scripts/bootstrap.sh

own_docker=0
bash scripts/docker.sh status || own_docker=1
bash scripts/docker.sh start
if [ "$own_docker" = 1 ]; then
  trap 'bash scripts/docker.sh stop' EXIT
fi

step() {  # step NAME COMMAND...: run it, then say how long it took
  local name=$1 start=$SECONDS
  shift
  echo "== e2e: $name"
  "$@"
  echo "== e2e: $name took $((SECONDS - start)) s"
}
step "images" bash scripts/images.sh
step "kind node image" bash e2e/kind/node-image.sh
step "kind cluster + pytest e2e/" timeout --kill-after=60 "${FROTA_E2E_TIMEOUT:-3000}" \
  bash e2e/kind/test.sh "$@"
