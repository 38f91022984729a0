#!/usr/bin/env bash
# Makes local/bookworm:base, a Debian 12 image with Python 3.11, from Debian's packages alone, for machines with
# a Docker daemon but no image registry (this project's test machines). Users build on python:3.11-slim instead.
#
#   bash deploy/local/base-image.sh [MIRROR]
#
# The host's extra CA certificates (/usr/local/share/ca-certificates) go into the image so that pip inside a build
# trusts what the host trusts (a network that inspects TLS). It is a build base for this machine, never published.
set -euo pipefail
MIRROR=${1:-http://deb.debian.org/debian}
TAG=${BASE_TAG:-local/bookworm:base}

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG is there already"
    exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" >/dev/null
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
chroot "$root" update-ca-certificates >/dev/null
chroot "$root" apt-get clean
tar -C "$root" -c . | docker import - "$TAG" >/dev/null
echo "$TAG made"
