"""Owner data: loading CSV/NPZ files and simulating synthetic owners.

CSV files have a header row; the feature column is ``x`` for one-dimensional models and
``x0, x1, …`` otherwise; ``logistic`` has a label column ``y``. NPZ files hold one array per
column name (a 2-D ``x`` of shape ``(n, d)`` is accepted for ``x0..``). Records are validated
and clipped into the model's data domain by ``Model.prepare_records``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .errors import DataError
from .models import Model


def load_records(path: str | Path, model: Model) -> np.ndarray:
    """Records ``(n, p)`` for ``model`` from one CSV or NPZ file, validated and clipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        raw = _read_csv(path, model.column_names)
    elif suffix == ".npz":
        raw = _read_npz(path, model.column_names)
    else:
        raise DataError(f"data file {path} must be .csv or .npz")
    try:
        return model.prepare_records(raw)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from exc


def _read_csv(path: Path, columns: list[str]) -> np.ndarray:
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in columns if c not in header]
            if missing:
                raise DataError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header must name "
                    f"{', '.join(columns)}"
                )
            idx = [header.index(c) for c in columns]
            rows = []
            for line_no, row in enumerate(reader, start=2):
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{path}:{line_no}: expected {len(header)} fields, found {len(row)}"
                    )
                try:
                    rows.append([float(row[i]) for i in idx])
                except ValueError as exc:
                    raise DataError(f"{path}:{line_no}: not a number ({exc})") from exc
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read CSV ({exc})") from exc
    if not rows:
        raise DataError(f"{path}: no records")
    return np.asarray(rows, dtype=float)


def _read_npz(path: Path, columns: list[str]) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: np.asarray(npz[k]) for k in npz.files}
    except Exception as exc:  # numpy raises many kinds for a corrupt archive
        raise DataError(f"{path}: cannot read NPZ ({exc})") from exc
    features = [c for c in columns if c != "y"]
    if len(features) > 1 and "x" in arrays and arrays["x"].ndim == 2:
        parts = [arrays["x"]]
    else:
        missing = [c for c in features if c not in arrays]
        if missing:
            raise DataError(
                f"{path}: missing array(s) {', '.join(missing)}; found "
                f"{', '.join(arrays) or 'none'}"
            )
        parts = [arrays[c].reshape(-1, 1) for c in features]
    if "y" in columns:
        if "y" not in arrays:
            raise DataError(f"{path}: missing array y")
        parts.append(arrays["y"].reshape(-1, 1))
    if len({len(p) for p in parts}) != 1:
        raise DataError(f"{path}: arrays have different lengths")
    try:
        return np.hstack([p.astype(float) for p in parts])
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: arrays must be numeric ({exc})") from exc


def synthetic_owners(
    model: Model, rng: np.random.Generator, true_theta: np.ndarray, n_per_owner: list[int]
) -> list[np.ndarray]:
    """One record array per owner, simulated at ``true_theta`` ``(d,)``."""
    return [model.simulate_records(rng, true_theta, n) for n in n_per_owner]
