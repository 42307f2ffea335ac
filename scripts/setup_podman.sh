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
# Only for tests/deploy/test_registry_push.py (a local registry with htpasswd logins),
# which skips without them: a failure to install these must not cost the image tests.
registry_packages=(docker-registry apache2-utils)

missing_from() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || echo "$pkg"
    done
}
mapfile -t missing < <(missing_from "${packages[@]}")
mapfile -t missing_registry < <(missing_from "${registry_packages[@]}")

if ((${#missing[@]} + ${#missing_registry[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "cannot install ${missing[*]} ${missing_registry[*]} (needs root and apt-get); tests that need them will skip"
        ((${#missing[@]})) && exit 0
    else
        export DEBIAN_FRONTEND=noninteractive
        apt_updated=false
        if ((${#missing[@]})); then
            log "installing ${missing[*]}"
            if ! { apt-get update -qq && apt_updated=true && apt-get install -y -qq --no-install-recommends \
                "${packages[@]}" >/dev/null; }; then
                log "apt-get failed; container tests will skip"
                exit 0
            fi
        fi
        if ((${#missing_registry[@]})); then
            log "installing ${missing_registry[*]}"
            # policy-rc.d 101: the package's own registry service must not start (port 5000);
            # the test starts one of its own on a free port.
            had_policy=false
            [[ -e /usr/sbin/policy-rc.d ]] && had_policy=true
            $had_policy || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d; }
            if ! { { $apt_updated || apt-get update -qq; } && apt-get install -y -qq --no-install-recommends \
                "${registry_packages[@]}" >/dev/null; }; then
                log "apt-get failed for ${missing_registry[*]}; the registry push test will skip"
            fi
            $had_policy || rm -f /usr/sbin/policy-rc.d
        fi
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
