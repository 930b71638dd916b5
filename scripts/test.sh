#!/usr/bin/env bash
# Runs the whole test suite: lint, unit + integration tests, then the
# end-to-end suite: the project's images in containers on a kind cluster whose
# node image is built here (scripts/e2e.sh; Docker, kind and the Kubernetes
# binaries are installed or built by the scripts, and cached). Installs what it
# needs into .venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check --no-cache .
if [ "${FROTA_VLLM_TESTS:-1}" != 0 ] && [ -z "${FROTA_VLLM:-}" ]; then
  echo "== vLLM's CPU build (the vllm runtime's tests; FROTA_VLLM_TESTS=0 skips them)"
  FROTA_VLLM="$(bash scripts/vllm-env.sh)"
  export FROTA_VLLM
fi
if [ "${FROTA_E2E:-1}" != 0 ]; then
  # Before pytest, so its tests on a real kube-apiserver run on a fresh machine too
  # (without the binaries they skip); cached, and needed by the e2e stage anyway.
  echo "== Kubernetes binaries (e2e/cluster/build.sh; cached)"
  bash e2e/cluster/build.sh >/dev/null
  echo "== Helm (e2e/cluster/helm.sh; cached)"
  bash e2e/cluster/helm.sh >/dev/null
  echo "== Prometheus and promtool (e2e/cluster/prometheus.sh; cached)"
  bash e2e/cluster/prometheus.sh >/dev/null
fi
echo "== pytest (unit + integration)"
export FROTA_STRICT_SKIPS=1  # a skip for what this script provides fails (tests/conftest.py)
start=$SECONDS
.venv/bin/python -m pytest -q "$@"
echo "== pytest took $((SECONDS - start)) s"
echo "== e2e (the images on kind; FROTA_E2E=0 skips it)"
bash scripts/e2e.sh
echo "== scripts/test.sh took $SECONDS s"
