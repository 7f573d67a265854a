#!/usr/bin/env bash
# Installs podman from Debian's packages (as root) and configures it for a VM like CI's: no
# CAP_SYS_RESOURCE (podman's default rlimits of 1048576 are refused, so the limits are the host's), a
# hybrid cgroup layout that crun refuses (runc and cgroupfs instead), no systemd (file events).
# Idempotent: a configured machine is left as it is. Measured: docs/deploy.md#what-make-image-test-checks.
set -euo pipefail
CONF=/etc/containers/containers.conf
MARK="# written by grpcgrade scripts/image/engine.sh"
# catatonit: podman's --init; the CNI dnsname plugin: compose services find each other by name;
# docker-compose 1.29: compose v1, to check the compose file parses there too.
missing=0
for tool in podman debootstrap podman-compose catatonit docker-compose; do
    command -v "$tool" >/dev/null || missing=1
done
if [ "$missing" = 1 ]; then
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends \
        podman runc uidmap slirp4netns fuse-overlayfs containernetworking-plugins iptables debootstrap \
        golang-github-containernetworking-plugin-dnsname podman-compose catatonit docker-compose >/dev/null
fi
if ! grep -qF "$MARK v2" "$CONF" 2>/dev/null; then
    test ! -e "$CONF" || cp "$CONF" "$CONF.before-grpcgrade"
    mkdir -p "$(dirname "$CONF")"
    # The host's open-file limit; processes at most 32768: podman (4.3, as root) starts runc under that
    # cap, so a container asking more than it is refused too (measured: 32768 runs, 90000 does not).
    nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
    test "$nofile" = unlimited && nofile=1048576
    { test "$nproc" = unlimited || test "$nproc" -gt 32768; } && nproc=32768
    cat >"$CONF" <<CONF
$MARK v2
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi
podman --version
