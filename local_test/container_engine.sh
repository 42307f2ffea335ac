#!/usr/bin/env bash
# Prints the container engine to use: $CONTAINER_ENGINE if set, docker when a Docker
# engine answers, podman otherwise (podman needs no daemon, so it is the fallback on
# CI machines; see scripts/setup_podman.sh).
set -u
if [[ -n ${CONTAINER_ENGINE:-} ]]; then
    echo "$CONTAINER_ENGINE"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
else
    echo podman
fi
