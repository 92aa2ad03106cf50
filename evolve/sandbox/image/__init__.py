"""The sandbox image: its recipe (the files in this folder) and how to build it.

Offline (the default, no container registry needed): build-rootfs.sh makes a Debian root
filesystem with debootstrap from a Debian mirror, slim.sh trims it, and `docker import`
turns it into an image. With a registry: `docker build` of the Dockerfile here gives the
same contents. Either way the tag is a hash of the recipe, so a changed recipe means a new
tag, and the engine never runs candidates in an image built from an older recipe.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPOSITORY = "evolve-sandbox"
RECIPE_DIR = Path(__file__).resolve().parent
RECIPE_FILES = ("packages.txt", "build-only.txt", "slim.sh", "build-rootfs.sh", "Dockerfile")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What `docker import` sets on the image; the Dockerfile's ENV and CMD say the same.
# tini as pid 1 (running as root) reaps the candidates' orphans; `sleep` keeps it alive.
IMPORT_CHANGES = [
    "ENV LANG=C.UTF-8",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["/usr/bin/tini", "-s", "--", "sleep", "infinity"]',
]


class BuildError(Exception):
    """The image could not be built; the message says what to do."""


def recipe_hash() -> str:
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        digest.update(name.encode() + b"\0" + (RECIPE_DIR / name).read_bytes() + b"\0")
    digest.update(json.dumps(IMPORT_CHANGES).encode())
    return digest.hexdigest()[:16]


def image_tag() -> str:
    return f"{REPOSITORY}:{recipe_hash()}"


def cache_dir() -> Path:
    return Path(os.environ.get("EVOLVE_CACHE", Path.home() / ".cache" / "evolve"))


def build_image(client, *, dockerfile: bool = False, mirror: str = DEFAULT_MIRROR,
                force: bool = False, say=print) -> str:
    """Build the image unless a current one exists; returns its tag."""
    tag = image_tag()
    if not force and client.images.list(name=tag):
        say(f"{tag} is up to date")
        return tag
    start = time.monotonic()
    if dockerfile:
        say(f"building {tag} from {RECIPE_DIR / 'Dockerfile'} "
            "(needs a registry for debian:bookworm-slim)")
        client.images.build(path=str(RECIPE_DIR), tag=tag, rm=True, pull=False)
    else:
        _build_offline(client, tag, mirror, say)
    size_mb = client.images.get(tag).attrs["Size"] / 1e6
    say(f"built {tag} in {time.monotonic() - start:.0f} s ({size_mb:.0f} MB)")
    _remove_older(client, tag, say)
    return tag


def _remove_older(client, tag: str, say) -> None:
    """Images of older recipes are never used again; one still in use stays."""
    for image in client.images.list(name=REPOSITORY):
        for old in image.tags:
            if old != tag and old.startswith(REPOSITORY + ":"):
                try:
                    client.images.remove(old)
                    say(f"removed {old} (an older recipe)")
                except Exception as exc:  # noqa: BLE001 - e.g. a container still uses it
                    say(f"kept {old}: {exc}")


def _build_offline(client, tag: str, mirror: str, say) -> None:
    if os.geteuid() != 0:
        raise BuildError("the offline build runs debootstrap, which needs root: run "
                         "`sudo evolve sandbox build`, or `evolve sandbox build --dockerfile` "
                         "where a container registry is reachable")
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (apt-get install debootstrap)")
    repository, version = tag.split(":")
    # /var/tmp: the root filesystem (~1 GB before trimming) may not fit a tmpfs /tmp.
    with tempfile.TemporaryDirectory(prefix="evolve-rootfs-", dir="/var/tmp") as tmp:
        rootfs, tarball = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        env = {**os.environ, "DEBOOTSTRAP_CACHE": str(cache_dir() / "debootstrap")}
        say(f"debootstrap bookworm from {mirror} into {rootfs} (a few minutes)")
        try:
            _run(["sh", str(RECIPE_DIR / "build-rootfs.sh"), str(rootfs), mirror], env=env)
            _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."])
        finally:
            _unmount_below(Path(tmp))  # never let the clean-up walk into a left /proc or /dev
        say(f"docker import -> {tag}")
        client.api.import_image(src=str(tarball), repository=repository, tag=version,
                                changes=IMPORT_CHANGES)


def _run(command: list[str], env: dict | None = None) -> None:
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace")[-3000:]
        raise BuildError(f"{' '.join(command[:2])} failed (exit {done.returncode}):\n{tail}")


def _unmount_below(path: Path) -> None:
    """debootstrap mounts /proc (and may bind /dev) in the target; a failed run can leave them."""
    prefix = str(path) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
