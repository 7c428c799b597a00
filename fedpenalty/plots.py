"""The run's figures (docs/design.md §5), drawn with matplotlib (Agg) from arrays:

* ``trace.png`` — per parameter, each chain's marginal density (left) and trace (right), chains
  labelled, the reference posterior overlaid where known;
* ``rank.png`` — per parameter, each chain's histogram of the pooled draws' ranks (uniform when
  the chains mix: the picture behind split R-hat);
* ``privacy.png`` — each owner's ε at δ against iterations, from its own ledger's running total,
  with the penalty paper's bound where it applies; past ``MAX_OWNER_LINES`` owners, the
  median and the min–max band over owners instead of one line each.

Runs with more than ``MAX_PARAMS`` parameters show the ones with the largest R-hat (the worst
mixed) and say so in the title.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from .inference_data import SpendTrace
from .models import Reference

#: Parameters drawn in trace.png and rank.png (the worst R-hat first beyond this many).
MAX_PARAMS = 4
#: Chains drawn and labelled one by one (beyond: one colour, one legend entry).
MAX_CHAIN_LABELS = 8
#: Owners drawn one line each in privacy.png (beyond: median and min–max band).
MAX_OWNER_LINES = 10


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shown_params(d: int, rhat: Sequence[float] | None) -> list[int]:
    """The parameters to draw: all when ``d`` ≤ MAX_PARAMS, else the MAX_PARAMS with the
    largest R-hat (the first ones without R-hat), in parameter order."""
    if d <= MAX_PARAMS:
        return list(range(d))
    if rhat is None:
        return list(range(MAX_PARAMS))
    worst = np.argsort(-np.nan_to_num(np.asarray(rhat, dtype=float), nan=np.inf), kind="stable")
    return sorted(int(j) for j in worst[:MAX_PARAMS])


def _chain_style(c: int, chains: int) -> dict[str, Any]:
    if chains > MAX_CHAIN_LABELS:
        return {"color": "C0", "alpha": 0.4, "label": f"{chains} chains" if c == 0 else None}
    return {"color": f"C{c % 10}", "alpha": 0.85, "label": f"chain {c}"}


def kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Gaussian kernel density of draws ``x`` on ``grid`` (Silverman's bandwidth, computed on a
    fine histogram so it costs O(len(x) + len(grid)²)); a point mass gives a spike."""
    sd = float(np.std(x))
    width = grid[-1] - grid[0]
    h = max(1.06 * sd * len(x) ** -0.2, width / 200)
    counts, edges = np.histogram(x, bins=len(grid), range=(grid[0], grid[-1]))
    centres = 0.5 * (edges[1:] + edges[:-1])
    weights = stats.norm.pdf((grid[:, None] - centres[None, :]) / h) / h
    return weights @ counts / max(len(x), 1)


def trace_plot(
    path: Path,
    theta: np.ndarray,
    names: Sequence[str],
    reference: Reference | None,
    rhat: Sequence[float] | None,
) -> None:
    """trace.png of draws ``theta`` ``(chains, draws, d)``: density | trace per parameter."""
    plt = _pyplot()
    chains, draws, d = theta.shape
    shown = shown_params(d, rhat)
    fig, axes = plt.subplots(
        len(shown), 2, figsize=(10, 2.4 * len(shown)), squeeze=False, width_ratios=(1, 2)
    )
    for row, j in enumerate(shown):
        dens, trace = axes[row]
        lo, hi = float(theta[:, :, j].min()), float(theta[:, :, j].max())
        if reference is not None:
            lo = min(lo, reference.mean[j] - 3 * reference.sd[j])
            hi = max(hi, reference.mean[j] + 3 * reference.sd[j])
        pad = 0.05 * (hi - lo) or 1e-9
        grid = np.linspace(lo - pad, hi + pad, 256)
        steps = np.arange(draws)
        for c in range(chains):
            style = _chain_style(c, chains)
            dens.plot(grid, kde(theta[c, :, j], grid), lw=1, **style)
            trace.plot(steps, theta[c, :, j], lw=0.5, **{**style, "label": None})
        if reference is not None:
            m, s = reference.mean[j], reference.sd[j]
            dens.plot(
                grid,
                stats.norm.pdf(grid, m, s),
                "k--",
                lw=1.2,
                label=f"reference ({reference.source}): normal, its mean and sd",
            )
            trace.axhline(m, color="k", ls="--", lw=1, label="reference mean")
        dens.set_ylabel(names[j])
        dens.set_yticks([])
        trace.set_xlim(0, max(draws - 1, 1))
    axes[0, 0].set_title("marginal density per chain")
    axes[0, 1].set_title(_title("trace of kept draws", shown, d))
    axes[-1, 0].set_xlabel("θ (sampled parameterisation)")
    axes[-1, 1].set_xlabel("draw")
    _legend_below(
        fig,
        [*axes[0, 0].get_legend_handles_labels()[0], *axes[0, 1].get_legend_handles_labels()[0]],
    )
    _save(plt, fig, path)


def _title(what: str, shown: list[int], d: int) -> str:
    return what if len(shown) == d else f"{what} ({len(shown)} of {d} parameters: worst R-hat)"


def rank_plot(
    path: Path, theta: np.ndarray, names: Sequence[str], rhat: Sequence[float] | None
) -> None:
    """rank.png: per parameter, each chain's histogram of the ranks of its draws among all
    chains' draws, against the uniform expectation and its 95% band."""
    plt = _pyplot()
    chains, draws, d = theta.shape
    shown = shown_params(d, rhat)
    bins = int(np.clip(draws // 10, 2, 20))
    fig, axes = plt.subplots(1, len(shown), figsize=(max(3.6 * len(shown), 6), 3.4), squeeze=False)
    expected = draws / bins
    band = 1.96 * np.sqrt(draws * (1 / bins) * (1 - 1 / bins))
    for ax, j in zip(axes[0], shown):
        ranks = stats.rankdata(theta[:, :, j].ravel()).reshape(chains, draws)
        edges = np.linspace(0.5, chains * draws + 0.5, bins + 1)
        for c in range(chains):
            counts, _ = np.histogram(ranks[c], bins=edges)
            ax.stairs(counts, np.arange(bins + 1), baseline=None, lw=1.2, **_chain_style(c, chains))
        ax.axhspan(
            expected - band,
            expected + band,
            color="0.85",
            zorder=0,
            label="95% band of independent draws",
        )
        ax.axhline(expected, color="k", lw=0.8)
        label = names[j] if rhat is None else f"{names[j]} (R-hat {rhat[j]:.3f})"
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"rank bin (of {bins})")
        ax.set_xticks([])
    axes[0, 0].set_ylabel("draws per bin")
    fig.suptitle(_title("rank plot per chain", shown, d), fontsize=10)
    _legend_below(fig, axes[0, 0].get_legend_handles_labels()[0])
    _save(plt, fig, path)


def privacy_plot(path: Path, spend: SpendTrace) -> None:
    """privacy.png of ``privacy_figure(spend)``."""
    _save(_pyplot(), privacy_figure(spend), path)


def privacy_figure(spend: SpendTrace) -> Any:
    """Each owner's ε at its δ against iterations, exact (solid) and the paper's bound (dashed)
    where it applies over at least two points; many owners as median and min–max band. The
    legend names only what is drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    x = spend.iterations
    paper = np.where(np.isfinite(spend.epsilon_paper_bound), spend.epsilon_paper_bound, np.nan)
    # a bound that applies at one point only (iteration 0 of a lattice owner: nothing spent
    # yet) draws no line
    paper[np.isfinite(paper).sum(axis=1) < 2] = np.nan
    drawn = np.isfinite(paper).any()
    k = len(spend.owners)
    if k <= MAX_OWNER_LINES:
        for i, owner in enumerate(spend.owners):
            color = f"C{i % 10}"
            ax.plot(x, spend.epsilon[i], color=color, lw=1.5, label=owner)
            if np.isfinite(paper[i]).any():
                ax.plot(x, paper[i], color=color, ls="--", lw=1)
        ax.plot([], [], "k-", lw=1.5, label="ε, exact (owner's ledger)")
        if drawn:
            ax.plot([], [], "k--", lw=1, label="ε, the penalty paper's bound")
    else:
        _band(ax, x, spend.epsilon, "C0", f"ε over {k} owners (ledger)")
        if drawn:
            _band(ax, x, paper, "C1", f"paper's bound over {k} owners")
    budgets = np.unique(spend.budget_epsilon)
    for b in budgets:
        ax.axhline(b, color="k", ls=":", lw=1)
    ax.plot([], [], "k:", label="budget ε" if len(budgets) == 1 else "budgets ε")
    if drawn and np.nanmax(paper) > 20 * max(np.nanmax(spend.epsilon), 1e-12):
        ax.set_yscale("log")
    deltas = np.unique(spend.delta)
    at = f"δ = {deltas[0]:g}" if len(deltas) == 1 else "each owner's δ"
    ax.set_title(f"each owner's privacy spend in this run (ε at {at})", fontsize=10)
    ax.set_xlabel("iterations done (warmup included)")
    ax.set_ylabel("ε")
    ax.legend(fontsize=7, framealpha=0.7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _band(ax: Any, x: np.ndarray, values: np.ndarray, color: str, label: str) -> None:
    """Median line and min–max band of ``values`` ``(owners, points)`` (NaN ignored)."""
    with warnings.catch_warnings():  # points where no owner has a paper's bound: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, med, hi = np.nanmin(values, 0), np.nanmedian(values, 0), np.nanmax(values, 0)
    ax.fill_between(x, lo, hi, color=color, alpha=0.25, label=f"{label}: min–max")
    ax.plot(x, med, color=color, lw=1.5, label=f"{label}: median")


def _legend_below(fig: Any, handles: list[Any]) -> None:
    """One legend for the figure, under its panels (five entries a row)."""
    shown = [h for h in handles if not str(h.get_label()).startswith("_")]
    fig.legend(handles=shown, loc="lower center", ncols=min(len(shown), 5), fontsize=7)
    rows = (len(shown) + 4) // 5
    fig.tight_layout(rect=(0, (0.1 + 0.18 * rows) / fig.get_figheight(), 1, 1))


def _save(plt: Any, fig: Any, path: Path) -> None:
    if not fig.legends:
        fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
