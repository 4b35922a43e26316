#!/usr/bin/env bash
# The local base image the Dockerfile builds on where TensorFlow's images cannot be pulled: Debian
# 12 (bookworm) with its Python 3.11 and venv, made from Debian's packages by mmdebstrap and
# imported into podman's image store as localhost/brats-seg-base:bookworm. The Dockerfile's venv
# then installs TensorFlow's wheel from PyPI (docs/installation.md, "Docker").
#
#   scripts/image/make_base.sh            # makes the image unless it exists (a cache between builds)
#   scripts/image/make_base.sh --force    # makes it again (e.g. for Debian's security updates)
#
# The base holds what the Dockerfile and TensorFlow's wheel need and nothing else: python3 and
# python3-venv (the venv, its pip from ensurepip), ca-certificates (pip's HTTPS), passwd
# (useradd, groupadd). Debian's own mirror and its security archive, no Recommends, no manual
# pages or translations. Needs root (podman's system store; mmdebstrap's root mode), mmdebstrap
# and podman: apt-get install podman buildah mmdebstrap (.ci/run installs them).
set -euo pipefail

IMAGE=localhost/brats-seg-base:bookworm
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,passwd
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

missing=()
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "error: ${missing[*]} not found on PATH: install them (Debian/Ubuntu: apt-get install podman buildah mmdebstrap; .ci/run does it)" >&2
  exit 1
fi

if ((!force)) && podman image exists "$IMAGE"; then
  echo "$IMAGE exists: kept ($0 --force makes it again)"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/brats-seg-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT

start=$SECONDS
mmdebstrap --quiet --variant=apt --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  "$SUITE" "$work/base.tar" \
  "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
# The environment Debian's own images set: an imported tarball has none, and the Dockerfile
# prepends its venv to the base's PATH.
podman import --quiet --change "ENV=PATH=$DEFAULT_PATH" --change 'ENV=LANG=C.UTF-8' --change 'CMD=["/bin/bash"]' \
  --message "scripts/image/make_base.sh: mmdebstrap --variant=apt --include=$PACKAGES $SUITE" \
  "$work/base.tar" "$IMAGE" >/dev/null
echo "$IMAGE made in $((SECONDS - start)) s ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
