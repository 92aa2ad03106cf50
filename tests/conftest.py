"""Fixtures shared by the test modules."""
import os
import signal

import pytest
from engine_proxy import EngineProxy
from postgres import PostgresServer, Unavailable

from evolve.sandbox.docker import docker_unavailable_reason

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
    if _ci():
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


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (tests/postgres.py); skips where none can be
    started, except in CI."""
    try:
        server = PostgresServer().__enter__()
    except Unavailable as exc:
        if _ci():
            pytest.fail(f"CI=true but no PostgreSQL server could be started: {exc}", pytrace=False)
        pytest.skip(str(exc))
    yield server
    server.__exit__()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The archive's URL, once on a SQLite file and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'evolve.db'}"
    return request.getfixturevalue("postgres").new_database()
