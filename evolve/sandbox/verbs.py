"""`evolve sandbox build` and `evolve sandbox check`: make the Docker image, and say what
works from inside the sandbox on this host."""
from __future__ import annotations

import asyncio
import os
import sys

from evolve.config import SandboxLimits
from evolve.sandbox.docker import (
    ENGINE_ERRORS,
    DockerSandbox,
    connect,
    image_missing,
    remove_leftovers,
    short_error,
)
from evolve.sandbox.image import DEFAULT_MIRROR, BuildError, build_image, image_tag


def build(dockerfile: bool = False, mirror: str = DEFAULT_MIRROR, force: bool = False) -> int:
    try:
        client = connect(timeout=3600)  # an import or a build takes minutes
        build_image(client, dockerfile=dockerfile, mirror=mirror, force=force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ENGINE_ERRORS as exc:
        print(f"error: Docker: {short_error(exc)} (is dockerd running?)", file=sys.stderr)
        return 1
    return 0


# What `check` asks a candidate to find out from inside the sandbox.
PROBE = """\
import os, socket, sys

def read_first(paths):
    for path in paths:
        try:
            return open(path).read().strip()
        except OSError:
            pass
    return "?"

def probe():
    facts = {"uid": os.getuid(), "python": sys.version.split()[0]}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1)
        facts["network"] = "open"
    except OSError as exc:
        facts["network"] = f"blocked ({exc.strerror or exc})"
    try:
        open("/probe", "w")
        facts["root_fs"] = "writable"
    except OSError:
        facts["root_fs"] = "read-only"
    facts["pids.max"] = read_first(["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"])
    facts["memory limit"] = read_first(["/sys/fs/cgroup/memory.max",
                                        "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
    import numpy, scipy
    facts["numpy"], facts["scipy"] = numpy.__version__, scipy.__version__
    return facts
"""


def check() -> int:
    """Print what works and what does not; 0 if candidates can run in Docker here."""
    try:
        client = connect()
        version = client.version()
    except ENGINE_ERRORS as exc:
        print(f"engine:    not reachable ({short_error(exc)}); "
              "start dockerd, then `evolve sandbox build`")
        return 1
    where = os.environ.get("DOCKER_HOST", "the default socket")
    print(f"engine:    Docker {version.get('Version')} "
          f"(API {version.get('ApiVersion')}) at {where}")
    tag = image_tag()
    if missing := image_missing(client, tag):
        print(f"image:     {missing}")
        return 1
    print(f"image:     {tag} ({client.images.get(tag).attrs['Size'] / 1e6:.0f} MB)")
    print(f"leftovers: {remove_leftovers(client)} container(s) of stopped engines removed")
    return asyncio.run(_check_runs())


async def _check_runs() -> int:
    sandbox = DockerSandbox(SandboxLimits(timeout_s=30), warm=1)
    try:
        cases = [{"name": "probe", "args": {}}]
        result = await sandbox.run(PROBE, "probe", cases)
        if result.status != "ok" or "probe" not in result.outputs:
            print(f"probe:     {result.status}: {result.detail} {result.case_errors} "
                  f"{result.log_tail}")
            return 1
        facts = result.outputs["probe"]
        print("probe:     " + ", ".join(f"{key} {value}" for key, value in facts.items()))
        jailed = (facts["uid"] == 65534 and facts["network"] != "open"
                  and facts["root_fs"] == "read-only")
        times = []
        for _ in range(5):
            result = await sandbox.run("def f():\n    return 1\n", "f", [{"name": "a", "args": {}}])
            times.append(result.elapsed_s)
        print(f"warm run:  {result.status}, {min(times) * 1000:.0f} ms for a trivial candidate")
        if not jailed:
            print("isolation: FAILED (see the probe line)")
        return 0 if jailed and result.status == "ok" else 1
    finally:
        sandbox.close()
