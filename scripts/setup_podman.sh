#!/usr/bin/env bash
# Makes podman able to build and run the image for tests/container. They use podman
# even where Docker answers: the build mounts the local torch wheel with
# `podman build -v`, and podman needs no daemon.
# Idempotent and non-interactive; a second run only rewrites the config if it changed.
# It never fails the caller: if podman cannot be installed, the container tests skip
# (and say why), which is better than a red CI for a missing tool.
set -u

log() { echo "setup_podman: $*" >&2; }

# runc: crun fails here. debootstrap: the test base image is made locally because no
# registry may be reachable. iptables and the CNI plugins: publishing ports (-p).
packages=(podman runc debootstrap iptables containernetworking-plugins)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done

if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "cannot install ${missing[*]} (needs root and apt-get); container tests will skip"
        exit 0
    fi
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        "${packages[@]}" >/dev/null; }; then
        log "apt-get failed; container tests will skip"
        exit 0
    fi
fi

# The sandboxes this runs in refuse what podman does by default: crun cannot set up
# the container there, systemd is not PID 1 (so no systemd cgroup manager and no
# journald), and the default ulimits ask for more open files than the host's hard
# limit allows, so every container would fail to start.
if [[ $(id -u) -eq 0 ]]; then
    nofile=$(ulimit -Hn)
    [[ $nofile == unlimited ]] && nofile=1048576
    conf=/etc/containers/containers.conf
    wanted=$(cat <<EOF
# Written by scripts/setup_podman.sh: runc, cgroupfs and file events work in a
# sandbox without systemd; ulimits stay within the host's hard limits.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
)
    if [[ ! -f $conf ]] || [[ "$(cat "$conf")" != "$wanted" ]]; then
        mkdir -p /etc/containers
        printf '%s\n' "$wanted" >"$conf"
        log "wrote $conf"
    fi
fi

if podman info >/dev/null 2>&1; then
    log "podman $(podman version --format '{{.Client.Version}}' 2>/dev/null) ready"
else
    log "podman is installed but 'podman info' fails; container tests will skip"
fi
exit 0
