#!/usr/bin/env bash
# Builds Helm from the helm.sh/helm/v4 Go module the module proxy serves, for
# the chart's tests (tests/manifests/test_helm_chart.py) and the kind e2e
# (e2e/test_helm.py). Cached by version outside the repo, next to the
# Kubernetes binaries of e2e/cluster/build.sh, so a later run takes a second.
#
#   e2e/cluster/helm.sh                      # build or reuse; prints the binary's path last
#   HELM_VERSION=v4.3.2 e2e/cluster/helm.sh
#
# Cold on 2 cores: ~5 min (niced, ~850 packages; 272 s measured); warm: a second.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v4.3.2}
CACHE=${FROTA_E2E_CACHE:-$HOME/.cache/frota-e2e}
DIR="$CACHE/bin/helm-$HELM_VERSION"
HELM="$DIR/helm"

log() { echo "[e2e-helm $(date +%H:%M:%S)] $*" >&2; }
# go install -v names each package as it compiles; show a line every 100.
progress() { awk '/^#|: / {print > "/dev/stderr"; next}
  {n++; if (n % 100 == 0) printf "[e2e-helm] %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}'; }
die() { echo "e2e-helm: $*" >&2; exit 1; }

if [ -x "$HELM" ]; then
  log "helm cached at $HELM"
  echo "$HELM"
  exit 0
fi

command -v go >/dev/null || die "Go is not installed (helm $HELM_VERSION needs Go >= 1.26 on PATH); install it from go.dev, then rerun."
export CGO_ENABLED=0
log "go: $(go version); proxy: $(go env GOPROXY)"
mkdir -p "$CACHE"
if ! go mod download -json "helm.sh/helm/v4@$HELM_VERSION" >/dev/null 2>"$CACHE/helm-download.err"; then
  cat "$CACHE/helm-download.err" >&2 || true
  die "cannot download helm.sh/helm/v4@$HELM_VERSION: is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?"
fi

# `go install module@version` builds with the module's own go.mod (helm has no
# replace directives), so the dependencies are exactly the release's. The
# version variable is what `helm version` prints (helm's Makefile sets it too).
rm -rf "$DIR.partial"
mkdir -p "$DIR.partial"
log "building helm $HELM_VERSION (a cold build compiles ~850 packages: ~5 min)"
start=$SECONDS
GOBIN="$DIR.partial" nice -n "${FROTA_E2E_NICE:-19}" go install -v -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" 2>&1 | progress
[ -x "$DIR.partial/helm" ] || die "go install produced no helm binary"
log "built helm in $((SECONDS - start))s"

rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
log "helm ready at $HELM"
echo "$HELM"
