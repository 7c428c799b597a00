"""The run directory: creating it, its ``run.json``, and the files of what was sampled.

``new_run_dir`` makes the directory (or takes an empty one) before any owner is asked, and
``drawless_run_removed`` removes it again when a run fails before holding a draw; ``finish``
writes samples.npz, privacy.json (``privacy_summary``), diagnostics.json, posterior.nc and the
figures (the files are listed in ``simulation``'s docstring); ``write_info`` and ``run_info``
write and read ``run.json``. I/O edge: nothing here asks an owner.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import plots
from .common import Policy, PrivacyReport
from .config import Scenario, load_scenario
from .coordinator.base import ChainAlgorithm
from .coordinator.driver import ChainResult
from .coordinator.oracle import Unreported
from .coordinator.secure_sum import aggregation_fields, owner_fields, requested
from .diagnostics import summarize
from .errors import ConfigError, Interrupted, OutputFailed, OwnerError
from .inference_data import POSTERIOR_FILE, SpendTrace, posterior_tree, write_posterior
from .kinds import GaussianKind, query_kind
from .models import BoundHierarchy, Model, Reference
from .privacy_rows import privacy_json

CHECKPOINT, RUN_INFO = "checkpoint.npz", "run.json"
NEIGHBOUR_MEANING = {
    "replace_one": "one record of this owner replaced by another",
    "add_remove": "one record added to or removed from this owner's records",
}


@dataclass(frozen=True)
class RunResult:
    """A finished or stopped run. ``theta`` ``(chains, draws, d)`` is what was sampled;
    ``privacy`` is privacy.json's content (``unreported``: owners that could not report);
    ``stopped`` is the owner error that ended the run early (None when it completed);
    ``tree`` is the run as ArviZ data (posterior.nc's content, ``inference_data``)."""

    out: Path
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    theta: np.ndarray
    stopped: OwnerError | Interrupted | None = None
    tree: xr.DataTree | None = None
    #: cost.json's content (``coordinator/cost.py``); None for runs that ask no owner
    cost: dict[str, Any] | None = None


def default_out_dir(scenario: Scenario) -> Path:
    return Path("runs") / f"{scenario['sampler']['algorithm']}-{time.strftime('%Y%m%d-%H%M%S')}"


def new_run_dir(scenario: Scenario, out: str | Path | None) -> tuple[Path, bool]:
    """The run directory (new, or existing and empty) with the resolved scenario in it, and
    whether it existed before; ``OutputFailed`` (nothing left behind) when it cannot be
    created or written — checked before any owner is asked."""
    out = Path(out or scenario["run"]["out"] or default_out_dir(scenario))
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {out} is a file, not a directory: name a new or empty directory (or run.out)"
        )
    existed = out.is_dir()
    try:
        if existed and any(out.iterdir()):
            raise FileExistsError(
                f"run directory {out} exists and is not empty; choose another --out"
            )
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(scenario.to_toml())
    except FileExistsError:
        raise
    except OSError as exc:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise OutputFailed(
            f"cannot write the run directory {out} ({reason(exc)}): name a directory you can "
            "write with --out (or run.out)"
        ) from exc
    return out, existed


def reason(exc: OSError) -> str:
    """What an ``OSError`` says, without its errno and path (the caller names the path)."""
    return exc.strerror or str(exc)


#: Files that hold draws: a run directory with one of these is kept, whatever happened.
_DRAW_FILES = ("samples.npz", CHECKPOINT)


@contextmanager
def drawless_run_removed(out: Path, existed: bool) -> Iterator[None]:
    """Remove the run directory ``out`` (from ``new_run_dir``; emptied instead when it
    ``existed``) when what runs inside fails before it holds any draw (a plan refused at
    session open, a launch failure, Ctrl-C during start-up), so that a rerun may use the same
    ``--out``; a run with draws keeps them with its checkpoint, and one that stopped because a
    file could not be written after the owners answered is kept for ``--resume``."""
    try:
        yield
    except BaseException as exc:
        kept = isinstance(exc, OutputFailed) and exc.kept
        if not kept and not any((out / name).exists() for name in _DRAW_FILES):
            shutil.rmtree(out, ignore_errors=True)
            if existed:
                out.mkdir(parents=True, exist_ok=True)
        raise


def resumed_scenario(out: Path, progress: bool | None) -> Scenario:
    """The run's resolved scenario (its ``config.toml``), with ``run.progress`` set to
    ``progress`` unless that is None (``--no-progress`` on a resume)."""
    scenario = load_scenario(out / "config.toml")
    if progress is not None:
        scenario["run"]["progress"] = progress
    return scenario


def run_info(out: Path) -> dict[str, Any]:
    """The ``run.json`` of the run directory ``out``, or a ``ConfigError`` saying why not."""
    if not out.is_dir():
        raise ConfigError(
            f"{out} is not a run directory: --resume takes the directory of a stopped run (the "
            "`--resume DIR` its stop message printed)"
        )
    try:
        return json.loads((out / RUN_INFO).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{out} is not a resumable run directory (no readable {RUN_INFO}: {exc})"
        ) from exc


def write_info(out: Path, info: dict[str, Any]) -> None:
    """Replace ``out``'s run.json with ``info`` (``OutputFailed`` when it cannot be written)."""
    tmp = out / (RUN_INFO + ".tmp")
    try:
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(out / RUN_INFO)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputFailed(
            f"could not write {out / RUN_INFO} ({reason(exc)}): free space or make {out} writable"
        ) from exc


@dataclass(frozen=True)
class Outputs:
    """What the run's files say about its draws beyond ``theta``: the ``model`` (parameter
    names), the ``algorithm``'s name, the ``reference`` posterior, and ``sample_stats``
    (name → ``(chains, draws)``, ``inference_data``); ``independent``: the draws are
    independent releases (a one-shot baseline), not Markov chains, so there is nothing to mix
    and no mixing warning."""

    model: Model | BoundHierarchy
    algorithm: str
    reference: Reference | None
    sample_stats: dict[str, np.ndarray]
    independent: bool = False
    superchains: int = 0


def chain_diagnostics(chains: ChainResult, algorithm: ChainAlgorithm) -> dict[str, Any]:
    """The driver's own counters for diagnostics.json (kernels that report it: the owners' noise
    excess; MH:
    the step the draws used and how warmup adapted it, ``StepAdaptation.summary``)."""
    if not chains.theta.shape[1]:
        return {}
    out: dict[str, Any] = {
        "queried_fraction": float(chains.queried.mean()),
        "mean_noise_variance": chains.noise_var,
    }
    if algorithm.adapts:
        out["step_adaptation"] = chains.state.tuning.summary()
    if chains.reports_excess:
        out.update(
            excess_noise_ratio=chains.excess_noise_ratio,
            excess_noise_fraction=chains.excess_fraction,
        )
    return out


def finish(
    out: Path,
    theta: np.ndarray,
    accepted: np.ndarray | None,
    privacy: dict[str, Any],
    outputs: Outputs,
    extra: dict[str, Any],
    stopped: OwnerError | Interrupted | None = None,
    spend: SpendTrace | None = None,
) -> RunResult:
    """Write samples, privacy, diagnostics, posterior.nc and the figures of what was sampled:
    ``theta`` ``(chains, draws, d)``, ``accepted`` ``(chains, draws)`` (None without an accept
    step), the owners' running ``spend`` (None without owners' ledgers). A file that cannot be
    written raises ``OutputFailed`` naming it (or ``out``: a full disk fails a write, which
    names no file)."""
    try:
        return _write_outputs(out, theta, accepted, privacy, outputs, extra, stopped, spend)
    except OSError as exc:
        where = exc.filename or f"the run's files in {out}"
        raise OutputFailed(
            f"could not write {where} ({reason(exc)}): free space or make {out} writable"
        ) from exc


def _write_outputs(
    out: Path,
    theta: np.ndarray,
    accepted: np.ndarray | None,
    privacy: dict[str, Any],
    outputs: Outputs,
    extra: dict[str, Any],
    stopped: OwnerError | Interrupted | None,
    spend: SpendTrace | None,
) -> RunResult:
    """``finish`` without its error message."""
    kept = theta.shape[1]
    names = outputs.model.param_names
    diagnostics: dict[str, Any] = {"kept_draws": kept, "param_names": names}
    if kept > 1:
        diagnostics.update(
            summarize(theta, accepted, outputs.reference, names, outputs.superchains)
        )
        if outputs.independent:
            diagnostics.update(warnings=[], independent_draws=True)
    diagnostics.update(extra)
    if stopped is not None:
        diagnostics["stopped"] = str(stopped)
    arrays = {"theta": theta} if accepted is None else {"theta": theta, "accepted": accepted}
    np.savez_compressed(out / "samples.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub
    if privacy:
        (out / "privacy.json").write_text(json.dumps(privacy_json(privacy, out), indent=2))
    attrs = {"algorithm": outputs.algorithm, "model": outputs.model.name, "run": str(out)}
    adaptation = extra.get("step_adaptation", {})
    attrs.update({f"step_adaptation_{k}": v for k, v in adaptation.items() if v is not None})
    tree = posterior_tree(
        theta, names, outputs.sample_stats, spend, outputs.reference, attrs, privacy, diagnostics
    )
    try:
        write_posterior(out / POSTERIOR_FILE, tree)
    except ImportError as exc:  # an install without the NetCDF writer: keep the rest of the run
        diagnostics.setdefault("warnings", []).append(
            f"{POSTERIOR_FILE} not written ({exc}); `pip install -e .` installs h5netcdf and h5py"
        )
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    if kept:
        rhat = diagnostics.get("rhat")
        plots.trace_plot(out / "trace.png", theta, names, outputs.reference, rhat)
        if kept > 1 and theta.shape[0] > 1:
            plots.rank_plot(out / "rank.png", theta, names, rhat)
    if spend is not None and len(spend.iterations) > 1:
        plots.privacy_plot(out / "privacy.png", spend)
    return RunResult(out, privacy, diagnostics, theta, stopped, tree)


def privacy_summary(
    entries: list[PrivacyReport | Unreported],
    policies: list[Policy],
    algorithm: ChainAlgorithm,
    scenario: Scenario,
) -> dict[str, Any]:
    """The ``privacy.json`` content from each owner's entry (in owner order, with its policy):
    under ``owners`` each owner's own report of this run's session (``owner_privacy``); under
    ``unreported`` the owners that gave no report (a stopped run: owner, status, error, answers
    received). With secure aggregation: s, t and the assumption ``epsilon`` rests on."""
    reports = [r for r in entries if isinstance(r, PrivacyReport)]
    neighbour = _common([r.neighbour for r in reports])
    primary = algorithm.primary(scenario["sampler"])
    return {
        "delta": _common([r.delta for r in reports]),
        "neighbour": neighbour,
        "neighbour_meaning": NEIGHBOUR_MEANING.get(neighbour, "owners differ"),
        "algorithm": algorithm.name,
        "accounting": query_kind(primary).report_basis,
        **kinds_fields(algorithm, scenario["sampler"], requested(scenario["privacy"]) is not None),
        "trusted_curator": False,
        "release": "each owner's own ledger",
        **aggregation_fields(requested(scenario["privacy"]), reports, _clips(algorithm, scenario)),
        "owners": [
            owner_privacy(r, p, algorithm, scenario)
            for r, p in zip(entries, policies)
            if isinstance(r, PrivacyReport)
        ],
        "unreported": [asdict(r) for r in entries if isinstance(r, Unreported)],
    }


def _clips(algorithm: ChainAlgorithm, scenario: Scenario) -> dict[str, float]:
    """The per-record clip of each clipped kind the run asks (none: {})."""
    return {} if algorithm.clips is None else algorithm.clips(scenario["sampler"])


def kinds_fields(
    algorithm: ChainAlgorithm, sampler: dict[str, Any], secure: bool = False
) -> dict[str, Any]:
    """privacy.json's fields of a run whose kinds are not just its ``query`` (several, or
    another one: docs/design.md §4): ``kind``, the primary kind's ledger name; ``kinds``, each
    kind's answers per chain (``answers_per_run`` for a kind asked once per run), the
    OWNER.toml key of its noise level (``secure``: every kind's is ``total_noise_sd``,
    docs/design.md §2.6) and accounting; and ``target`` when a kind clips each record's term
    (``ChainAlgorithm.target``). None for any other run (its privacy.json as before)."""
    asks = algorithm.asks(sampler)
    kinds = {query_kind(name).ledger_name: count for name, count in asks.items()}
    target = algorithm.target(sampler)
    if list(kinds) == [query_kind(algorithm.query).ledger_name] and target is None:
        return {}
    fields: dict[str, Any] = {
        "kind": next(iter(kinds)),
        "kinds": {
            name: {
                ("answers_per_run" if algorithm.asked_once(name) else "answers_per_chain"): count,
                "noise_key": "total_noise_sd" if secure else query_kind(name).noise_key,
                "accounting": query_kind(name).report_basis,
            }
            for name, count in kinds.items()
        },
        "composition": "each owner's epsilon composes the answers of every kind in its ledger",
    }
    if target is not None:
        fields["target"] = target
    return fields


def owner_privacy(
    report: PrivacyReport, policy: Policy, algorithm: ChainAlgorithm, scenario: Scenario
) -> dict[str, Any]:
    """One owner's privacy.json entry: its own report of this run's session, and
    ``ledger_epsilon``, its ε across every session its ledger has seen; its noise level is the
    run's kind's (``Policy.noise_for``). Gradient runs show the owner's σ as
    ``noise_multiplier`` with the sampling rate and clip they asked for; ``mu`` is null unless
    the owner's ε is the exact GDP one. With secure aggregation the owner's ε from its own
    noise alone, and no σ (its noise is s/√(K − t), ``owner_fields``)."""
    asked = [query_kind(name) for name in algorithm.asks(scenario["sampler"])]
    kind = asked[0]
    gradient = any(not isinstance(k, GaussianKind) for k in asked)
    spend = report.session
    assert spend is not None  # the reports were asked for this run's session
    noise = kind.report_noise(policy.noise_for(kind.ledger_name), scenario["sampler"])
    if len(asked) > 1:  # every kind's level, by its OWNER.toml key
        noise["noise"] = {k.noise_key: policy.noise_for(k.ledger_name) for k in asked}
    if requested(scenario["privacy"]) is not None:
        noise.pop(kind.report_sigma_key)
        noise.pop("noise", None)
    return {
        "owner": report.owner,
        "n": report.n,
        **noise,
        "delta": report.delta,
        "answers": spend.answers,
        "mu": None if gradient else spend.mu,
        "epsilon": spend.epsilon,
        "accountant": spend.accountant,
        "epsilon_paper_bound": _finite_or_none(spend.epsilon_paper_bound),
        "ledger_epsilon": report.total.epsilon,
        "budget_epsilon": report.budget_epsilon,
        "budget_left": report.budget_left,
        **owner_fields(report),
    }


def _common(values: list[Any]) -> Any:
    """The value every owner shares (None when they differ or there are none)."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
