#!/usr/bin/env bash
# Makes a virtual environment on the interpreter the router runs on in its image, with
# the router's dependencies, and prints its `python`. The router benchmarks run Frota
# on it (`--frota-python`), so that they measure the router as it ships.
#
#   bash scripts/image-python.sh          # -> ~/.cache/frota-image-python/<version>/bin/python
#   IMAGE_PYTHON=/usr/bin/python3.11 IMAGE_PYTHON_ENV=DIR bash scripts/image-python.sh
#
# The image is built on Debian's python3 (scripts/base-image.sh installs it from
# Debian's packages), which Debian ships as a statically linked, optimized build of
# CPython. A development environment's interpreter is often another build: pyenv's,
# for one, links libpython as a shared library and is built without profile feedback,
# and runs the same router code with about 10% more instructions
# (docs/benchmarks.md, "The interpreter"). Frota's code comes from the checkout the
# benchmark runs (PYTHONPATH), so the environment holds only the dependencies.
set -euo pipefail

python="${IMAGE_PYTHON:-/usr/bin/python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "image-python: $python is not a Python >= 3.11 (Debian's python3 and python3-venv:" \
         "apt-get install python3 python3-venv)" >&2
    exit 2
fi
version=$("$python" -c 'import platform; print(platform.python_version())')
env_dir="${IMAGE_PYTHON_ENV:-$HOME/.cache/frota-image-python/$version}"
stamp="$env_dir/.frota-installed"
root=$(cd "$(dirname "$0")/.." && pwd)

# The project's dependencies and uvloop (the router's event loop in the image).
requirements=$("$python" - "$root/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
engine = project["optional-dependencies"]["engine"]
print("\n".join(project["dependencies"] + [r for r in engine if r.startswith("uvloop")]))
EOF
)
wanted=$(printf '%s\n' "$requirements" | sha256sum | cut -c1-16)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
    echo "$env_dir/bin/python"
    exit 0
fi

echo "image-python: a virtual environment of $python ($version) in $env_dir" >&2
"$python" -m venv "$env_dir"
printf '%s\n' "$requirements" > "$env_dir/requirements.txt"
"$env_dir/bin/pip" install --quiet --disable-pip-version-check -r "$env_dir/requirements.txt" >&2
echo "$wanted" > "$stamp"
echo "$env_dir/bin/python"
