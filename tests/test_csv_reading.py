"""Owners' CSV files (fedpenalty/data.py): the numpy reader of plain files gives exactly the
array of the row-by-row reader, and every other file goes row by row, so that its records or
its error message are the row-by-row reader's."""

from __future__ import annotations

import numpy as np
import pytest

from fedpenalty.data import _read_checked_csv, _read_csv, _read_plain_csv
from fedpenalty.errors import DataError


def plain_numbers(tmp_path):
    """17-digit values from 1e-300 to 1e300 of both signs, a blank line inside and at the end."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((500, 3)) * np.array([1e-300, 1.0, 1e300])
    lines = [",".join(f"{v:.17g}" for v in row) for row in values]
    lines.insert(200, "")
    path = tmp_path / "plain.csv"
    path.write_text("x0,x1,x2\n" + "\n".join(lines) + "\n\n")
    return path


@pytest.mark.parametrize("columns", [["x0", "x1", "x2"], ["x2", "x0"], ["x1"]])
def test_a_plain_file_reads_bit_for_bit_as_row_by_row(tmp_path, columns):
    path = plain_numbers(tmp_path)
    fast = _read_plain_csv(path, columns)
    assert fast is not None  # the numpy reader took it
    checked = _read_checked_csv(path, columns)
    assert fast.shape == checked.shape == (500, len(columns)) and fast.dtype == checked.dtype
    assert np.array_equal(fast.view(np.int64), checked.view(np.int64))  # every bit, -0.0 too


def test_one_record_is_one_row(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("x\n-0.5\n")
    assert _read_plain_csv(path, ["x"]).shape == _read_checked_csv(path, ["x"]).shape == (1, 1)


#: Bodies the numpy reader must leave to the row-by-row one (which accepts or refuses them).
UNUSUAL = {
    "spaces": "1.5 , 2\n",
    "quotes": '"1.5",2\n',
    "crlf": "1.5,2\r\n3,4\r\n",
    "nan": "nan,2\n",
    "extra field": "1,2\n3,4,5\n",
    "missing field": "1,2\n3\n",
    "commas only": "1,2\n,\n3,4\n",
    "empty field": "1,\n",
    "bad number": "1e,2\n",
    "no records": "\n",
}


@pytest.mark.parametrize("name", UNUSUAL)
def test_any_other_file_is_read_row_by_row(tmp_path, name):
    path = tmp_path / "odd.csv"
    path.write_text("x,y\n" + UNUSUAL[name])
    assert _read_plain_csv(path, ["x", "y"]) is None
    try:
        expected = _read_checked_csv(path, ["x", "y"])
    except DataError as exc:
        with pytest.raises(DataError) as got:
            _read_csv(path, ["x", "y"])
        assert str(got.value) == str(exc)
    else:
        np.testing.assert_array_equal(_read_csv(path, ["x", "y"]), expected)


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "cols.csv"
    path.write_text("a,b\n1,2\n")
    assert _read_plain_csv(path, ["x"]) is None
    with pytest.raises(DataError, match="missing column"):
        _read_csv(path, ["x"])
