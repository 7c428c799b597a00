"""Shared test setup: keep the reference-posterior cache out of the user's home; one local Ray
for the whole session (started when a test first needs it); real owner processes stopped
after each test that starts them."""

from __future__ import annotations

import secrets

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDPENALTY_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture
def procs(tmp_path):
    """Real ``fedpenalty`` processes of one test (``grpc_processes.Processes``), all stopped
    when it ends."""
    from grpc_processes import Processes

    processes = Processes(tmp_path)
    yield processes
    processes.stop_all()


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by every Ray test of the session (started once: it takes seconds),
    with token authentication on and an ephemeral token (nothing written to ~/.ray)."""
    from fedpenalty.cluster.ray_hosts import connect_ray

    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "token")
    mp.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    runtime = connect_ray("")
    yield runtime
    runtime.stop()
    mp.undo()


@pytest.fixture(scope="session")
def ray_actors(ray_session):
    """Two owner-host actors on the session's Ray, reused by the tests that bring their own
    owners (``ray_support.ray_oracle_of``). They reserve no CPU, so that the Ray transport's
    own actors still find every CPU free."""
    from fedpenalty.cluster.ray_hosts import RayHosts

    actors = RayHosts.create(2, cpus=0)
    yield actors
    actors.stop()
