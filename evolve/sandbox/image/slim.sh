#!/bin/sh
# Shared by both builds, run inside the new root filesystem as root: drops what a sandbox
# never uses (build-only packages, documentation, caches) and makes the /work mount point.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# --force-unsafe-io: no fsync per file; a half-written image is thrown away anyway.
grep -v '^#' "$here/build-only.txt" | xargs dpkg --purge --force-depends --force-unsafe-io
rm -rf /var/cache/apt/* /var/lib/apt/lists/* /var/log/* /usr/share/doc/* /usr/share/man/* \
       /usr/share/info/* /usr/share/locale/* /tmp/* /root/.cache
find /usr/lib/python3/dist-packages -depth -type d -name tests -exec rm -rf {} +
# The root filesystem is read-only in the sandbox, so bytecode must be there already:
# without it numpy alone takes ~0.4 s more to import, on every evaluation.
python3 -m compileall -q -j 0 /usr/lib/python3/dist-packages /usr/lib/python3.11 >/dev/null || true
mkdir -p /work
python3 -c 'import numpy, scipy.optimize, scipy.spatial' # the purge left what candidates use
