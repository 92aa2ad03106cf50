#!/bin/sh
# Builds the sandbox image's root filesystem from Debian packages alone, with no container
# registry (only a Debian mirror):
#     build-rootfs.sh TARGET_DIR [MIRROR]
# `evolve sandbox build` runs this as root, then imports TARGET_DIR with `docker import`.
# DEBOOTSTRAP_CACHE (an absolute directory) keeps the downloaded .debs for the next build.
set -eu
target=$1
mirror=${2:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)
packages=$(grep -v '^#' "$here/packages.txt" | xargs | tr ' ' ',')

if [ -n "${DEBOOTSTRAP_CACHE:-}" ]; then
    mkdir -p "$DEBOOTSTRAP_CACHE"
    set -- --cache-dir="$DEBOOTSTRAP_CACHE"
else
    set --
fi
debootstrap --variant=minbase --include="$packages" "$@" bookworm "$target" "$mirror"

mkdir -p "$target/tmp/recipe"
cp "$here/slim.sh" "$here/build-only.txt" "$target/tmp/recipe/"
chroot "$target" /bin/sh /tmp/recipe/slim.sh
