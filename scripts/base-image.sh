#!/usr/bin/env bash
# Build a Debian base image from Debian's packages alone (no image registry needed):
# debootstrap --variant=minbase, then `tar -C ROOTFS -c . | docker import - TAG`.
#
#   bash scripts/base-image.sh TAG SUITE [PACKAGES_COMMA_SEPARATED]
#   bash scripts/base-image.sh frota-base/python:3.11-bookworm bookworm python3,python3-venv,python3-pip,ca-certificates
#
# Progress goes to stderr; the tag is printed last on stdout. Idempotent: the
# image carries the label frota.base.recipe=<hash of suite, packages, mirror,
# arch and this recipe>, and an image with that tag and hash is kept as it is.
# The rootfs tarball is cached under ${FROTA_IMAGE_CACHE:-~/.cache/frota-images},
# so a fresh dockerd re-imports it in seconds. Needs root (debootstrap chroots).
#
# Environment: FROTA_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# FROTA_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security),
# FROTA_BASE_FORCE=1 rebuilds even when the image and tarball exist.
set -euo pipefail

RECIPE_VERSION=1  # bump when the steps below change what ends up in the image
if [ $# -lt 2 ]; then
  echo "usage: $0 TAG SUITE [PACKAGES_COMMA_SEPARATED]" >&2
  exit 2
fi
tag=$1 suite=$2 packages=${3:-}
mirror=${FROTA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${FROTA_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
cache=${FROTA_IMAGE_CACHE:-$HOME/.cache/frota-images}
say() { echo "== base-image: $*" >&2; }

sorted_packages=$(tr ',' '\n' <<<"$packages" | sed '/^$/d' | sort -u | paste -sd, -)
hash=$(printf '%s\n' "$RECIPE_VERSION" "$suite" "$sorted_packages" "$mirror" "$security" "$arch" |
  sha256sum | cut -c1-16)
label=frota.base.recipe

have=$(docker image inspect "$tag" --format "{{index .Config.Labels \"$label\"}}" 2>/dev/null || true)
if [ "$have" = "$hash" ] && [ "${FROTA_BASE_FORCE:-0}" != 1 ]; then
  say "$tag is up to date (recipe $hash)"
  echo "$tag"
  exit 0
fi

mkdir -p "$cache"
tarball=$cache/debian-$suite-$arch-$hash.tar
if [ ! -s "$tarball" ] || [ "${FROTA_BASE_FORCE:-0}" = 1 ]; then
  command -v debootstrap >/dev/null 2>&1 || {
    say "installing debootstrap"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
  }
  rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/frota-rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  start=$(date +%s)
  say "debootstrap $suite ($arch, minbase${sorted_packages:+, +$sorted_packages}) into $rootfs"
  debootstrap --variant=minbase --arch="$arch" ${sorted_packages:+--include="$sorted_packages"} \
    "$suite" "$rootfs" "$mirror" >&2
  # Updates and security sources too, so later `apt-get install` gets current packages
  # (not for rolling suites, which have neither).
  {
    echo "deb $mirror $suite main"
    case "$suite" in
      sid|unstable|testing|experimental) ;;
      *) echo "deb $mirror $suite-updates main"; echo "deb $security $suite-security main" ;;
    esac
  } >"$rootfs/etc/apt/sources.list"
  # What docker import cannot know and a container must not inherit from the build host.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* \
    "$rootfs"/var/log/*.log
  : >"$rootfs/etc/hostname"
  rm -f "$rootfs/etc/resolv.conf"
  tar -C "$rootfs" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$rootfs"
  trap - EXIT
  say "rootfs built in $(( $(date +%s) - start )) s ($(du -h "$tarball" | cut -f1)), cached at $tarball"
else
  say "reusing cached rootfs $tarball"
fi

say "docker import -> $tag"
docker import \
  --change "LABEL $label=$hash" \
  --change "LABEL frota.base.suite=$suite" \
  --change "ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change 'CMD ["/bin/bash"]' \
  - "$tag" <"$tarball" >&2
echo "$tag"
