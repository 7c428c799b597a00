"""Owner data: loading CSV/NPZ files and simulating synthetic owners.

CSV files have a header row; the feature column is ``x`` for one-dimensional models and
``x0, x1, …`` otherwise; ``logistic`` has a label column ``y``. NPZ files hold one array per
column name (a 2-D ``x`` of shape ``(n, d)`` is accepted for ``x0..``). Records are validated
and clipped into the model's data domain by ``Model.prepare_records``.

A simulation describes each owner's records by a *source* — a file path, or a synthetic
owner's size and its own seed stream — so that whichever process hosts the owner makes exactly
the same records (docs/design.md §4, "The Ray transport"): ``OwnerRecords`` makes them on
demand, one owner at a time.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from .errors import DataError
from .models import ExpFamModel, Model


@dataclass(frozen=True)
class LoadedRecords:
    """An owner's records as loaded: ``records`` ``(n, p)``, validated and clipped into the
    model's data domain, and ``clipped``, how many of them clipping changed. The count is the
    owner's to read (its log, ``fedpenalty owner report``): it is data-dependent and never
    leaves the owner (docs/design.md §3, invariant 4)."""

    records: np.ndarray
    clipped: int


def load_records(path: str | Path, model: Model) -> np.ndarray:
    """Records ``(n, p)`` for ``model`` from one CSV or NPZ file, validated and clipped."""
    return read_records(path, model).records


def read_records(path: str | Path, model: Model) -> LoadedRecords:
    """``load_records`` with the number of records clipped into the model's data domain."""
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
        records = model.prepare_records(raw)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from exc
    changed = np.asarray(raw, dtype=float).reshape(records.shape) != records
    return LoadedRecords(records, int(changed.any(axis=1).sum()))


#: A CSV body (after the header) of plain numbers only: digits, signs, points, exponents.
_PLAIN = re.compile(r"[0-9eE+\-.,\n]*")


def _read_csv(path: Path, columns: list[str]) -> np.ndarray:
    """The ``columns`` of a CSV file ``(n, len(columns))``: by ``_read_plain_csv`` when the
    file is plain numbers, else row by row (``_read_checked_csv``, which names the bad line)."""
    plain = _read_plain_csv(path, columns)
    return plain if plain is not None else _read_checked_csv(path, columns)


def _read_plain_csv(path: Path, columns: list[str]) -> np.ndarray | None:
    """``_read_checked_csv``'s array, parsed by numpy (a million records in about a second,
    against ten row by row: an owner's start-up), when the body holds only plain numbers and
    every line its header's number of fields; None for anything else (blank fields,
    whitespace, quotes, CR, text such as nan), which the row-by-row reader then reports."""
    try:
        with path.open(newline="") as f:  # CR kept: such a file goes row by row
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    head, _, body = text.partition("\n")
    header = [h.strip() for h in next(csv.reader([head]), [])]
    if any(c not in header for c in columns) or not _PLAIN.fullmatch(body):
        return None
    lines = [line for line in body.split("\n") if line]
    if not lines or any(line.count(",") != len(header) - 1 for line in lines):
        return None
    idx = [header.index(c) for c in columns]
    try:
        return np.loadtxt(io.StringIO(body), delimiter=",", usecols=idx, ndmin=2, comments=None)
    except ValueError:  # a field such as "1e" or "": the checked reader names its line
        return None


def _read_checked_csv(path: Path, columns: list[str]) -> np.ndarray:
    """The ``columns`` of a CSV file ``(n, len(columns))``, read row by row with the csv module
    (blank rows skipped); DataError naming the file and line of the first bad row."""
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


def save_csv(path: str | Path, records: np.ndarray, model: Model, digits: int = 17) -> None:
    """Write ``records`` ``(n, p)`` with the model's column header, ``digits`` significant
    digits each (17: exactly), in the format ``load_records`` reads."""
    np.savetxt(
        path,
        records,
        delimiter=",",
        header=",".join(model.column_names),
        comments="",
        fmt=f"%.{digits}g",
    )


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


@dataclass(frozen=True)
class SyntheticRecords:
    """One synthetic owner's ``n`` records, simulated at ``true_theta`` ``(d,)`` from the
    owner's own seed stream ``seed`` (the same records in every process)."""

    seed: np.random.SeedSequence
    n: int
    true_theta: tuple[float, ...]

    def make(self, model: Model) -> np.ndarray:
        """The records ``(n, p)``, inside the model's data domain."""
        theta = np.asarray(self.true_theta, dtype=float)
        return model.simulate_records(np.random.default_rng(self.seed), theta, self.n)


@dataclass(frozen=True)
class FileRecords:
    """One owner's records in a CSV or NPZ file (``load_records``)."""

    path: str

    def make(self, model: Model) -> np.ndarray:
        """The records ``(n, p)``, validated and clipped."""
        return load_records(self.path, model)


RecordSource = SyntheticRecords | FileRecords


class OwnerRecords(Sequence[np.ndarray]):
    """Every owner's records in owner order, made from ``sources`` when indexed; nothing is
    kept, so only one owner's records are in memory at a time."""

    def __init__(self, model: Model, sources: Sequence[RecordSource]):
        self.model, self.sources = model, sources

    def __len__(self) -> int:
        return len(self.sources)

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, k: slice) -> list[np.ndarray]: ...

    def __getitem__(self, k: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(k, slice):
            return [s.make(self.model) for s in self.sources[k]]
        return self.sources[k].make(self.model)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (s.make(self.model) for s in self.sources)

    def pooled(self) -> np.ndarray:
        """All owners' records stacked ``(Σ n_k, p)`` (a trusted curator's view)."""
        return np.concatenate(list(self))

    def stat_total(self) -> tuple[int, np.ndarray]:
        """(Σ n_k, Σ_k Σ_x S(x) ``(s,)``) of an exponential-family model, one owner at a time."""
        model = self.model
        assert isinstance(model, ExpFamModel)  # only exponential-family models have S(x)
        n, total = 0, np.zeros(model.stat_dim)
        for records in self:
            n += len(records)
            total += model.suff_stat(records).sum(axis=0)
        return n, total


#: numpy's default pool size: the one ``SeedSequence(entropy, spawn_key=...)`` takes
_POOL_SIZE = np.random.SeedSequence(0).pool_size


@dataclass(frozen=True)
class ChildSeeds(Sequence[np.random.SeedSequence]):
    """Child seed streams ``indices`` of a seed (``entropy``, ``spawn_key``, ``pool_size``),
    each made when indexed: ``ChildSeeds.of(seed, K)`` holds what ``seed.spawn(K)`` returns,
    but as a few numbers, so a million owners' seeds cost no memory and pickle to a few bytes
    (docs/design.md §4, "Many owners"). Slices are ``ChildSeeds`` too."""

    entropy: int | tuple[int, ...]
    spawn_key: tuple[int, ...]
    pool_size: int
    indices: range

    @classmethod
    def of(cls, seed: np.random.SeedSequence, count: int) -> ChildSeeds:
        """The ``count`` children ``seed.spawn(count)`` would give next, without spawning them
        (``seed`` is left as it is)."""
        first = seed.n_children_spawned
        return cls(seed.entropy, tuple(seed.spawn_key), seed.pool_size, range(first, first + count))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, k: int) -> np.random.SeedSequence: ...

    @overload
    def __getitem__(self, k: slice) -> ChildSeeds: ...

    def __getitem__(self, k: int | slice) -> np.random.SeedSequence | ChildSeeds:
        if isinstance(k, slice):
            return ChildSeeds(self.entropy, self.spawn_key, self.pool_size, self.indices[k])
        return np.random.SeedSequence(
            self.entropy, spawn_key=(*self.spawn_key, self.indices[k]), pool_size=self.pool_size
        )


@dataclass(frozen=True)
class SyntheticSources(Sequence[SyntheticRecords]):
    """Synthetic owners' sources: owner ``indices[j]`` has ``counts[j]`` records drawn at
    ``true_theta`` from child ``indices[j]`` of ``seeds``' seed; each ``SyntheticRecords`` is
    made when indexed, so a million owners' sources are one array (docs/design.md §4, "Many
    owners"). Slices are ``SyntheticSources`` too."""

    seeds: ChildSeeds
    counts: np.ndarray
    true_theta: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.counts)

    @overload
    def __getitem__(self, k: int) -> SyntheticRecords: ...

    @overload
    def __getitem__(self, k: slice) -> SyntheticSources: ...

    def __getitem__(self, k: int | slice) -> SyntheticRecords | SyntheticSources:
        if isinstance(k, slice):
            return SyntheticSources(self.seeds[k], self.counts[k], self.true_theta)
        return SyntheticRecords(self.seeds[k], int(self.counts[k]), self.true_theta)


def synthetic_sources(
    seed: np.random.SeedSequence, true_theta: np.ndarray, n_per_owner: Sequence[int]
) -> SyntheticSources:
    """One source per owner: owner k's records come from the k-th child stream of ``seed``
    (``seed.spawn`` of a fresh ``seed``, without changing ``seed``)."""
    theta = tuple(float(v) for v in np.ravel(true_theta))
    counts = np.asarray(n_per_owner, dtype=np.int64).reshape(-1)
    key = tuple(seed.spawn_key)
    children = ChildSeeds(seed.entropy, key, _POOL_SIZE, range(len(counts)))  # type: ignore[arg-type]
    return SyntheticSources(children, counts, theta)
