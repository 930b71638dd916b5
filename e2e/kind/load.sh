#!/usr/bin/env bash
# Puts local Docker images into kind nodes' containerd, as `kind load docker-image`
# does, with less disk and time:
# - `docker save` streams straight into the node (kind writes a temporary tar first);
# - the node unpacks the layers and lets their packed copies go
#   (--discard-unpacked-layers; kind keeps both), so the 6 GB worker image costs a
#   node 6 GB, not 12, and an image sharing its layers (the vLLM image, a re-tag)
#   costs only the layers it adds;
# - an image the node already holds under another name is only tagged;
# - the images a node lacks go in one stream, so layers they share cross once.
#
#   e2e/kind/load.sh NODES IMAGE...     # NODES: comma-separated kind node names
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NODE[,NODE...] IMAGE..." >&2; exit 2; }
IFS=, read -r -a nodes <<<"$1"
shift

log() { echo "== e2e/kind $(date +%H:%M:%S): $*" >&2; }

# The name containerd keeps: docker.io/library/NAME:TAG for a bare NAME, as Docker's.
normalize() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then
    ref=docker.io/library/$ref
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    ref=docker.io/$ref
  fi
  [[ ${ref##*/} == *:* || $ref == *@* ]] || ref=$ref:latest
  echo "$ref"
}

held_as() {  # held_as NODE REF: the image ID the node's CRI has under REF (empty: none)
  docker exec "$1" crictl inspecti --output go-template --template '{{.status.id}}' "$2" 2>/dev/null || true
}

avail() { df -h --output=avail / | tail -n 1 | tr -d ' '; }

load_node() {  # load_node NODE IMAGE...: every image the node lacks, in one stream
  local node=$1 image id ref other start=$SECONDS i pending=() refs=() ids=()
  shift
  for image in "$@"; do
    id=$(docker image inspect --format '{{.Id}}' "$image")
    ref=$(normalize "$image")
    if [ "$(held_as "$node" "$ref")" = "$id" ]; then
      log "$node already holds $image"
      continue
    fi
    other=$(docker exec "$node" crictl inspecti --output go-template \
      --template '{{range .status.repoTags}}{{.}}{{"\n"}}{{end}}' "$id" 2>/dev/null | head -n 1 || true)
    if [ -n "$other" ]; then
      docker exec "$node" ctr --namespace=k8s.io images tag --force "$other" "$ref" >/dev/null
      log "$node: tagged $other as $ref"
      continue
    fi
    pending+=("$image") refs+=("$ref") ids+=("$id")
  done
  [ ${#pending[@]} -gt 0 ] || return 0
  # One `docker save` of them all: a layer two images share (the worker's and the vLLM
  # image's runtime) is sent, and stored, once.
  if ! docker save "${pending[@]}" | docker exec --privileged -i "$node" ctr --namespace=k8s.io images \
      import --local --all-platforms --digests --snapshotter=overlayfs --discard-unpacked-layers - >/dev/null; then
    echo "load: importing ${pending[*]} into $node failed, $(avail) left on this machine's disk. Docker stages" \
      "the images' layers while it saves them and the node holds them packed and unpacked while it" \
      "imports: this needs free disk of about three times their size (docs/operations.md#disk)." >&2
    exit 1
  fi
  for i in "${!pending[@]}"; do
    [ "$(held_as "$node" "${refs[i]}")" = "${ids[i]}" ] ||
      { echo "load: $node does not hold ${pending[i]} after import" >&2; exit 1; }
  done
  log "loaded ${pending[*]} into $node: $((SECONDS - start)) s ($(avail) disk left here)"
}

for node in "${nodes[@]}"; do
  load_node "$node" "$@"
done
