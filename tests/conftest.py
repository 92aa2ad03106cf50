"""Fixtures shared by the test modules."""
import os

import pytest

from evolve.docker_sandbox import docker_unavailable_reason


@pytest.fixture(scope="module")
def docker_ready():
    """Docker tests skip (with the reason) where no engine or image is ready, except in CI."""
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but the Docker sandbox tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)
