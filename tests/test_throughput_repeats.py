"""scenarios/throughput.py with ``--repeat`` and ``--clock cpu``: every measurement is divided
by the floor of its own repetition (measured just before it), and the spread table lists each
row's median and range."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scenarios" / "throughput.py"
_SPEC = importlib.util.spec_from_file_location("throughput", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
throughput = importlib.util.module_from_spec(_SPEC)
sys.modules["throughput"] = throughput
_SPEC.loader.exec_module(throughput)


def test_each_repetition_is_divided_by_its_own_floor(tmp_path, capsys):
    out = tmp_path / "rows.json"
    flags = ["--owners", "2", "--models", "gaussian_mean", "--seconds", "0.05"]
    flags += ["--transports", "numpy-floor,inprocess", "--clock", "cpu", "--repeat", "2"]
    assert throughput.main([*flags, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["transport"], r["repeat"]) for r in rows] == [
        ("numpy-floor", 0), ("inprocess", 0), ("numpy-floor", 1), ("inprocess", 1)
    ]  # fmt: skip
    for floor, row in (rows[0:2], rows[2:4]):
        ratio = row["iterations_per_second"] / floor["iterations_per_second"]
        assert row["ratio_to_numpy_floor"] == ratio and row["clock"] == "cpu"
    printed = capsys.readouterr().out
    assert "median × floor" in printed and "inprocess" in printed.split("median × floor")[1]
