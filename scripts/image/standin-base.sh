#!/usr/bin/env bash
# A stand-in for python:3.11-slim-bookworm, for machines that reach Debian's mirror but no image
# registry: Debian 12 (debootstrap, minbase) with Debian's Python 3.11 and pip, linked where the official
# image has them (/usr/local/bin) and pip allowed to install (no EXTERNALLY-MANAGED marker), as root.
# Usage: standin-base.sh IMAGE_NAME CACHE_DIR. The root's tarball is kept in CACHE_DIR (outside the clone),
# so a warm run only imports it; a cold run builds it (4-5 min here, mostly downloads). Made again weekly.
set -euo pipefail
IMAGE=$1
CACHE=$2
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL="$CACHE/python-3.11-bookworm-standin.tar"
# A week at most: Debian's security updates reach the stand-in as they reach the official image.
if [ -n "$(find "$TARBALL" -mtime +7 2>/dev/null)" ]; then
    echo "stand-in base: $TARBALL is over a week old; making it again"
    rm -f "$TARBALL"
    podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
fi
if [ -s "$TARBALL" ] && podman image exists "$IMAGE"; then
    echo "stand-in base $IMAGE: already in podman's store"
    exit 0
fi
mkdir -p "$CACHE"
if [ ! -s "$TARBALL" ]; then
    root=$(mktemp -d "$CACHE/root.XXXXXX")
    # debootstrap mounts /proc and /sys in the root while it works: unmount before removing anything
    trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true; rm -rf --one-file-system "$root"' EXIT
    echo "stand-in base: debootstrap bookworm from $MIRROR into $root"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
        bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
    for name in python python3 python3.11 pip pip3; do
        target=/usr/bin/$name
        [ "$name" = python ] && target=/usr/bin/python3
        [ "$name" = pip ] && target=/usr/bin/pip3
        ln -sf "$target" "$root/usr/local/bin/$name"
    done
    rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
fi
podman import --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' "$TARBALL" "$IMAGE" >/dev/null
echo "stand-in base $IMAGE: imported from $TARBALL"
