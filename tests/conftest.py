"""Shared test setup: keep the reference-posterior cache out of the user's home."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDPENALTY_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()
