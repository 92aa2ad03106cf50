"""The sandbox of one host: Docker (the jail, the default) or the process backend (an explicit
opt-in). A Ray cluster's nodes each make theirs here too."""
from __future__ import annotations

from evolve.config import SandboxLimits


def host_sandbox(limits: SandboxLimits):
    """Docker never falls back in silence: where it cannot run, the run fails and says how to
    opt in to the process backend."""
    if limits.backend == "process":
        from evolve.sandbox.process import ProcessSandbox

        return ProcessSandbox(limits)
    from evolve.sandbox.docker import DockerSandbox, DockerUnavailable

    try:
        return DockerSandbox(limits)
    except DockerUnavailable as exc:
        raise DockerUnavailable(f"{exc}. To run candidates without Docker, on this host and "
                                "without a jail, set sandbox.backend: process", exc.permanent) from None
