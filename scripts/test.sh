#!/usr/bin/env bash
# Runs the whole test suite: lint, unit + integration tests, then the
# end-to-end suite on a local Kubernetes control plane (built from source,
# cached). Installs what it needs into .venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== pytest (unit + integration)"
.venv/bin/python -m pytest -q "$@"
echo "== e2e (local Kubernetes control plane; FROTA_E2E=0 skips it)"
bash scripts/e2e.sh
