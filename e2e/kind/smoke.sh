#!/usr/bin/env bash
# Checks a running e2e kind cluster the way the suite will use it, with a tiny
# image built here (the Debian base plus python3's http.server), loaded with
# `kind load`: nodes Ready; CoreDNS resolves kubernetes.default from a pod; a
# pod on each node reaches a ClusterIP Service whose pod is on the other node
# (kube-proxy and the pod network); kubectl exec, logs and port-forward.
#
#   e2e/kind/up.sh && e2e/kind/smoke.sh     # KIND_CLUSTER, KIND_KUBECONFIG as up.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-frota-e2e}
export KUBECONFIG=${KIND_KUBECONFIG:-$PWD/e2e/.work/kind-kubeconfig}
IMAGE=frota-kind-smoke:v1
NS=frota-kind-smoke
PATH=$(bash e2e/cluster/build.sh):$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin
export DOCKER_BUILDKIT=0

log() { echo "== smoke $(date +%H:%M:%S): $*" >&2; }
FAILED=0
check() {  # check NAME CMD...: run CMD, say PASS or FAIL
  local name=$1 out; shift
  if out=$("$@" 2>&1); then
    echo "PASS $name: $(tail -1 <<<"$out")"
  else
    echo "FAIL $name: $out"
    FAILED=$((FAILED + 1))
  fi
}

build_image() {
  local debian=frota-kind/debian:bookworm
  docker image inspect "$debian" >/dev/null 2>&1 ||
    bash scripts/base-image.sh "$debian" bookworm ca-certificates >/dev/null
  printf '%s\n' "FROM $debian" \
    'RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*' \
    'CMD ["python3", "-u", "-m", "http.server", "8000"]' | docker build -q -t "$IMAGE" - >/dev/null
  kind load docker-image --name "$CLUSTER" "$IMAGE" >&2
}

# A pod pinned to a node, and a ClusterIP Service in front of it.
server() {  # server NAME NODE
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {app: $1}}
spec:
  nodeName: $2
  tolerations: [{operator: Exists}]
  containers:
    - name: http
      image: $IMAGE
      imagePullPolicy: Never
      readinessProbe: {httpGet: {path: /, port: 8000}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: $1}
spec:
  selector: {app: $1}
  ports: [{port: 80, targetPort: 8000}]
---
EOF
}

# fetch POD URL: GET from inside POD. Retried for 10 s: a Service answers
# "connection refused" until each node's kube-proxy has its endpoint.
fetch() {
  kubectl -n "$NS" exec "$1" -- python3 -c '
import sys, time, urllib.request
for attempt in range(20):
    try:
        r = urllib.request.urlopen(sys.argv[1], timeout=5)
        print(sys.argv[1], r.status, "after", attempt, "retries")
        break
    except OSError as e:
        err = e
        time.sleep(0.5)
else:
    sys.exit(f"{sys.argv[1]}: {err}")' "$2"
}

port_forward() {
  kubectl -n "$NS" port-forward svc/a 18080:80 >/dev/null 2>&1 &
  local pf=$! _
  for _ in $(seq 50); do
    if python3 -c "import urllib.request; print('port-forward', urllib.request.urlopen('http://127.0.0.1:18080/', timeout=2).status)" 2>/dev/null; then
      kill "$pf"; return 0
    fi
    sleep 0.2
  done
  kill "$pf"; return 1
}

main() {
  log "building and loading $IMAGE"
  build_image
  mapfile -t nodes < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  [ "${#nodes[@]}" -ge 2 ] || { echo "FAIL need two nodes, have ${nodes[*]}"; exit 1; }
  check "nodes Ready" kubectl wait --for=condition=Ready node --all --timeout=60s
  kubectl delete namespace "$NS" --ignore-not-found --wait >/dev/null
  kubectl create namespace "$NS" >/dev/null
  { server a "${nodes[0]}"; server b "${nodes[1]}"; } | kubectl -n "$NS" apply -f - >/dev/null
  check "pods Ready" kubectl -n "$NS" wait --for=condition=Ready pod/a pod/b --timeout=120s
  check "DNS kubernetes.default" kubectl -n "$NS" exec a -- python3 -c \
    "import socket; print('kubernetes.default ->', socket.gethostbyname('kubernetes.default'))"
  check "DNS b.$NS.svc.cluster.local" kubectl -n "$NS" exec a -- python3 -c \
    "import socket; print('b ->', socket.gethostbyname('b.$NS.svc.cluster.local'))"
  check "a (${nodes[0]}) -> Service b (pod on ${nodes[1]})" fetch a "http://b.$NS/"
  check "b (${nodes[1]}) -> Service a (pod on ${nodes[0]})" fetch b "http://a.$NS/"
  check "exec" kubectl -n "$NS" exec a -- cat /etc/hostname
  check "logs" sh -c "kubectl -n $NS logs a | grep -m1 'GET / HTTP'"
  check "port-forward svc/a" port_forward
  kubectl delete namespace "$NS" --wait=false >/dev/null
  [ "$FAILED" = 0 ] || { echo "$FAILED check(s) failed"; exit 1; }
  echo "all checks passed"
}

main "$@"
