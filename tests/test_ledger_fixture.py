"""A ledger written by an earlier release reads and reports identically (docs/design.md §4,
"The ledger's parts"): ``tests/fixtures/ledger_<version>.sqlite`` was written by
``tests/fixtures/make_ledger_fixture.py`` with that release's code (log-ratio, exp-family,
gradient and secure-aggregation sessions of lattice and float owners, an open gradient session,
a replayed request); ``ledger_<version>_report.json`` is what it reported then. Today's code
must give the same figures (floats to 1e-12 relative) and replay the same stored answers."""

from __future__ import annotations

import inspect
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

from ledger_fixture_report import fixture_report  # noqa: E402

from fedpenalty.owner import Ledger  # noqa: E402

RELEASES = sorted(p.name[len("ledger_") : -len(".sqlite")] for p in FIXTURES.glob("*.sqlite"))


def assert_same(got: Any, stored: Any, where: str = "report") -> None:
    """``got`` equals ``stored`` exactly, floats to 1e-12 relative."""
    if isinstance(stored, dict):
        assert isinstance(got, dict) and set(got) == set(stored), where
        for key in stored:
            assert_same(got[key], stored[key], f"{where}.{key}")
    elif isinstance(stored, list):
        assert isinstance(got, list) and len(got) == len(stored), where
        for j, (a, b) in enumerate(zip(got, stored)):
            assert_same(a, b, f"{where}[{j}]")
    elif isinstance(stored, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), where
        assert math.isclose(got, stored, rel_tol=1e-12, abs_tol=0.0), (where, got, stored)
    else:
        assert got == stored, (where, got, stored)


def test_there_is_a_fixture_of_this_release():
    assert RELEASES, "no fixture ledger in tests/fixtures"


@pytest.mark.parametrize("release", RELEASES)
def test_an_earlier_releases_ledger_reports_identically(tmp_path, release):
    copy = tmp_path / "ledger.sqlite"
    shutil.copyfile(FIXTURES / f"ledger_{release}.sqlite", copy)
    stored = json.loads((FIXTURES / f"ledger_{release}_report.json").read_text())
    sessions = stored.pop("sessions")
    got = json.loads(json.dumps(fixture_report(copy, sessions)))
    assert_same(got, stored)
    Ledger(copy).close()  # a writer opens it (its schema steps run) and changes no figure
    assert_same(json.loads(json.dumps(fixture_report(copy, sessions))), stored)


#: the public methods of ``Ledger`` in release 0.1.0 and their parameters (name=default)
LEDGER_API_0_1_0 = {
    "__init__": "path synchronous='FULL' read_only=False",
    "agreement_secret": "owner",
    "answered_on_lattice": "owner",
    "charge": "c",
    "charging": "c",
    "close": "",
    "close_session": "owner session",
    "close_sessions": "owners session",
    "ids": "names",
    "open_session": "owner session algorithm planned_answers sampling_rate=None "
    "noise_multiplier=1.0 admit=None client=None lattice=False",
    "open_sessions": "owners session algorithm planned_answers sampling_rate=None client=None "
    "max_step=None",
    "probe": "",
    "reports": "owners session",
    "sampled": "owner",
    "session": "owner session",
    "session_opener": "owners session",
    "sessions": "owner",
    "stored": "owners session first last",
    "stored_ids": "owner_ids session first last",
    "total": "owner",
}


def test_the_ledger_facade_keeps_the_public_methods_of_release_0_1_0():
    """Node, host, report, simulation and tests call these: same names, parameters, defaults."""
    for name, expected in LEDGER_API_0_1_0.items():
        params = list(inspect.signature(getattr(Ledger, name)).parameters.values())[1:]
        got = " ".join(
            p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params
        )
        assert got == expected, name
    assert isinstance(Ledger.writable, property) and isinstance(Ledger.path, property)
