#!/usr/bin/env bash
# End-to-end suite on a local Kubernetes control plane: builds (or reuses) the
# control-plane binaries (e2e/cluster/build.sh, cached in ~/.cache/frota-e2e),
# then runs pytest on e2e/. The cluster fixture starts and stops the control
# plane; the trap removes whatever is left (processes, pod netns, the bridge),
# also after a failure or an interrupt. FROTA_E2E=0 skips the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FROTA_E2E:-1}" = 0 ]; then
  echo "== e2e skipped (FROTA_E2E=0)"
  exit 0
fi
[ -x .venv/bin/python ] || source scripts/bootstrap.sh
# A work dir of this run's own: the cleanup touches nothing another run made.
own_work=
if [ -z "${FROTA_E2E_WORK:-}" ]; then
  own_work=$(mktemp -d /tmp/frota-e2e.XXXXXX)
  export FROTA_E2E_WORK=$own_work
fi
cleanup() {
  .venv/bin/python -m e2e.cluster down --work-dir "$FROTA_E2E_WORK" >/dev/null 2>&1 || true
  [ -z "$own_work" ] || rm -rf "$own_work"
}
trap cleanup EXIT
echo "== e2e: control-plane binaries"
start=$SECONDS
bin_dir=$(nice -n 19 bash e2e/cluster/build.sh)
echo "binaries in $bin_dir ($((SECONDS - start))s)"
echo "== e2e: pytest e2e/ (local control plane)"
# In the background so that a signal reaches the trap at once, not after pytest.
FROTA_E2E_BIN=$bin_dir timeout --kill-after=30 "${FROTA_E2E_TIMEOUT:-1800}" \
  .venv/bin/python -m pytest -q -p no:cacheprovider e2e/ "$@" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 130' INT TERM
wait $pid
