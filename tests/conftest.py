"""Fixtures shared by the test modules."""
import os
import signal

import pytest

from evolve.docker_sandbox import docker_unavailable_reason

from engine_proxy import EngineProxy

# A test job started in the background of a non-interactive shell (`cmd &`) inherits SIGINT
# ignored, and so would every process the tests start (exec keeps SIG_IGN): the Ctrl-C tests
# would then test nothing. A handler here is reset to the default in each child.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def docker_ready():
    """Docker tests skip (with the reason) where no engine or image is ready, except in CI."""
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but the Docker sandbox tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def engine_proxy(docker_ready, tmp_path):
    """A Docker engine that can be cut off and restored for one client (tests/engine_proxy.py)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip("the outage test proxies a unix-socket engine")
    proxy = EngineProxy(tmp_path / "engine.sock", host.removeprefix("unix://"))
    proxy.start()
    yield proxy
    if proxy.listener.fileno() != -1:
        proxy.stop()
