"""Reporting for the scenario scripts (``scenarios/``; docs/design.md §5): one command line,
runs of the library's own simulation, progress over sweeps, spread over repeats, and the two
files every scenario writes, ``NAME.json`` (every number, the resolved settings, the package
version) and ``NAME.png`` (drawn with matplotlib's Agg backend, no display needed).

Speed appears only as ratios against a baseline measured in the same run (the house rule):
``Simulated.seconds`` is the wall time of one run, for such ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from . import __version__
from .cli import table
from .config import Scenario, resolve
from .progress import ProgressBar
from .simulation import RunResult, run_scenario

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

#: Where scenarios write NAME.json and NAME.png unless told otherwise (``--out``).
DEFAULT_OUT = Path("runs") / "scenarios"


def scenario_parser(description: str, quick: str) -> argparse.ArgumentParser:
    """The options every scenario takes: ``--quick`` (``quick`` says what it shrinks to),
    ``--out DIR``, ``--seed`` (first seed; repeat r uses seed + r) and ``--no-progress``."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"a small version: {quick}")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder for NAME.json and NAME.png (default {DEFAULT_OUT})",
    )
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def progress(total: int, description: str, enabled: bool = True) -> Any:
    """A progress bar on stderr for ``total`` steps (``.update()`` after each; a context
    manager), silent when not ``enabled``."""
    return ProgressBar(total=total, desc=description, disable=not enabled, leave=False, unit="run")


@dataclass(frozen=True)
class Simulated:
    """One ``fedpenalty simulate`` run: the resolved ``scenario``, its ``result`` and its wall
    time in ``seconds`` (owners started, chains run, run directory written). ``stopped`` lists
    the attempts an owner stopped before this one (``seed`` and the owner's ``message``)."""

    scenario: Scenario
    result: RunResult
    seconds: float
    stopped: tuple[dict[str, Any], ...] = ()


#: Seed offset between attempts of a run that an owner stopped.
RETRY_SEED_STEP = 1_000_003


def simulate(raw: Mapping[str, Any], folder: Path, retries: int = 2) -> Simulated:
    """Resolve the scenario ``raw`` (sections as in a scenario file) and run it with the
    library's own simulation into the new directory ``folder``.

    A run that an owner stops (``RunResult.stopped``: for instance a uniform-in-ball proposal
    shorter than the owners' ``min_step``, which they refuse) is run again, up to ``retries``
    times, with ``run.seed`` advanced by ``RETRY_SEED_STEP``; the stopped attempts stay in
    ``Simulated.stopped`` so that reports show them. ``RuntimeError`` when every attempt stops.
    """
    stopped: list[dict[str, Any]] = []
    for attempt in range(retries + 1):
        sections = {k: dict(v) for k, v in raw.items()}
        sections["run"]["seed"] = sections["run"].get("seed", 0) + attempt * RETRY_SEED_STEP
        scenario = resolve(sections)
        start = time.perf_counter()
        result = run_scenario(scenario, folder / f"attempt-{attempt}")
        seconds = time.perf_counter() - start
        if result.stopped is None:
            return Simulated(scenario, result, seconds, tuple(stopped))
        stopped.append({"seed": scenario["run"]["seed"], "message": str(result.stopped)})
    raise RuntimeError(f"every attempt of the run in {folder} was stopped: {stopped}")


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Mean, sample sd (ddof 1; 0 for one value) and count of the finite ``values``, with the
    values themselves; mean and sd are None when none is finite."""
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not kept:
        return {"mean": None, "sd": None, "n": 0, "values": []}
    sd = float(np.std(kept, ddof=1)) if len(kept) > 1 else 0.0
    return {"mean": float(np.mean(kept)), "sd": sd, "n": len(kept), "values": kept}


def errorbar(
    ax: Any, x: Sequence[float], repeats: Sequence[Sequence[float | None]], **style: Any
) -> None:
    """Plot the mean over repeats at each ``x`` with ± one sd as error bars. ``repeats`` holds,
    for each x, the values of every repeat (None for a repeat that has none)."""
    stats = [spread(r) for r in repeats]
    shown = [(xi, s) for xi, s in zip(x, stats) if s["mean"] is not None]
    if not shown:
        return
    ax.errorbar(
        [xi for xi, _ in shown],
        [s["mean"] for _, s in shown],
        yerr=[s["sd"] for _, s in shown],
        capsize=3,
        marker="o",
        ms=4,
        **style,
    )


def figure(rows: int, cols: int, width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    """A figure of ``rows`` × ``cols`` panels (axes as a 2-D array)."""
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    return fig, axes


def log_x(ax: Any, values: Sequence[float]) -> None:
    """A log-scaled x axis with plain tick labels at ``values`` (the sweep's points)."""
    ax.set_xscale("log")
    ax.set_xticks(list(values), [f"{v:g}" for v in values])
    ax.minorticks_off()


def quantile_distance(draws: np.ndarray, dist: Any) -> dict[str, float]:
    """Distances between the 1-D ``draws`` ``(m,)`` and a continuous distribution ``dist`` (a
    frozen scipy distribution): ``w1``, the Wasserstein-1 distance by the quantile coupling
    (mean |x₍ᵢ₎ − F⁻¹((i − ½)/m)|, units of θ), and ``ks``, the Kolmogorov–Smirnov statistic
    sup |F_m − F|. Both are statistics of the draws, not tests: MCMC draws are correlated."""
    x = np.sort(np.asarray(draws, dtype=float).reshape(-1))
    m = len(x)
    u = (np.arange(m) + 0.5) / m
    cdf = dist.cdf(x)
    ks = max(np.max(np.arange(1, m + 1) / m - cdf), np.max(cdf - np.arange(m) / m))
    return {"w1": float(np.mean(np.abs(x - dist.ppf(u)))), "ks": float(ks)}


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python ones, paths into strings,
    and non-finite floats into None (JSON has no NaN or infinity)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


def cell(value: Any) -> str:
    """One table cell: numbers to 4 significant digits, a ``spread`` as mean ± sd, None as —."""
    if isinstance(value, Mapping) and "mean" in value:
        if value["mean"] is None:
            return "—"
        mean = cell(value["mean"])
        return mean if not value.get("sd") else f"{mean} ± {value['sd']:.2g}"
    if value is None:
        return "—"
    if isinstance(value, (float, np.floating)):
        return f"{value:.4g}" if math.isfinite(value) else "—"
    return str(value)


def headline(
    title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]
) -> str:
    """``title`` over a text table of ``rows``: ``columns`` are (key, header) pairs, each cell
    as ``cell`` writes it. What a scenario prints besides the path of its files."""
    body = [[cell(r.get(key)) for key, _ in columns] for r in rows]
    return f"{title}\n{table([header for _, header in columns], body)}\n"


def over_repeats(
    rows: Sequence[Mapping[str, Any]], by: Sequence[str], keys: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per distinct setting of the ``by`` keys (in the order first met), holding those
    keys and, for each of ``keys``, the ``spread`` of its values over the rows (repeats) of
    that setting."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    return [
        {**dict(zip(by, setting)), **{k: spread(r.get(k) for r in mine) for k in keys}}
        for setting, mine in groups.items()
    ]


def write_report(
    out: Path,
    name: str,
    *,
    argv: Sequence[str],
    settings: Mapping[str, Any],
    results: Any,
    notes: Sequence[str],
    fig: Any,
) -> tuple[Path, Path]:
    """Write ``out/NAME.json`` (scenario, package version, command line, time, ``settings``,
    ``results``, ``notes``) and ``out/NAME.png`` (``fig``, then closed); return both paths."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "scenario": name,
        "fedpenalty_version": __version__,
        "python": sys.version.split()[0],
        "command": ["python", f"scenarios/{name}.py", *argv],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": settings,
        "results": results,
        "notes": list(notes),
    }
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.write_text(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")
    if fig.get_layout_engine() is None:  # a figure laid out its own way keeps it
        fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path
