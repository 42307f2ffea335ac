#!/usr/bin/env bash
# Makes a Debian bookworm + Python 3.11 base image without a registry, for machines
# (CI, sandboxes) that cannot pull python:3.11-slim-bookworm. The image is cached by
# its tag: a second run returns at once.
#
#   scripts/make_base_image.sh [TAG]       (default localhost/bookworm-python:3.11)
#
# Build the project's image on it with
#   podman build --build-arg BASE_IMAGE=TAG ...
set -euo pipefail

tag=${1:-localhost/bookworm-python:3.11}
engine=${CONTAINER_ENGINE:-podman}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if "$engine" image exists "$tag" 2>/dev/null; then
    echo "make_base_image: $tag exists" >&2
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "make_base_image: debootstrap needs root" >&2
    exit 1
fi

rootfs=$(mktemp -d /var/tmp/base-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >/dev/null

# Machines behind a TLS-inspecting proxy add their CA under
# /usr/local/share/ca-certificates; pip inside the build needs to trust it too.
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
    cp "${extra[@]}" "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
fi

# What a slim image leaves out: apt lists and caches, docs and man pages.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*

tar -C "$rootfs" --numeric-owner -c . \
    | "$engine" import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        - "$tag" >/dev/null
echo "make_base_image: made $tag" >&2
