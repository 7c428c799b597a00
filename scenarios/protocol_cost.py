"""Which protocol for K owners on this network? What each method costs an owner — round trips,
megabytes, hours — at equal per-owner ε, on a WAN of 1, 20 and 150 ms one-way latency.

    python scenarios/protocol_cost.py [--quick] [--out DIR] [--seed 0] [--owners 4,100]
                                      [--ray-owners 1000] [--no-progress]

Data: the mean of Gaussian records (``gaussian_mean``, |x| ≤ 2, Θ = [−1, 1], true θ = 0),
n = 200,000 records split equally over K owners (K = 4 and 100, ``--owners``; K = 1,000 with
Ray owners and shorter runs, ``--ray-owners``, not in ``--quick``). Every
configuration is calibrated by the project's accountants (the calibrations of
``privacy_mixing.py``) so that each owner's ledger reports ε = 4 at δ = 1e-5 (penalty MH,
whose ledger charges the step taken rather than the full radius, is rescaled after a pilot
run: ``at_ledger_target``; its planned worst case, ``ε worst``, is higher), and every
configuration asks the same number of answers of each owner (chains × iterations = 9,600;
4,800 in ``--quick``), so their noise is the same and only how the answers are asked
differs:

* ``penalty ×4``: penalty MH, 4 chains (the baseline: one round trip per iteration);
* ``penalty ×16``, ``penalty ×64``: the same answers spread over 16 or 64 chains, each
  request carrying all of them (the answer path is vectorised over chains): 4× or 16× fewer
  round trips, but each chain is shorter and pays its own burn-in;
* ``expfam ×C BB``: penalty MH on the owners' sufficient statistics (docs/design.md §2.2)
  with C chains, one reply carrying B iterations' copies (the block mode, a ``suff_stats``
  query like any other, so it runs over every transport);
* ``sgld ×4``: DP-SGLD at q = 0.02 with tight (PLD) accounting, one round trip per iteration;
* ``sghmc ×4``, ``sgfs ×4``, ``barker ×4``: the other owner-side methods, with the
  calibrations of ``privacy_mixing.py`` (barker's ratio clip binds: it samples the
  clipped-likelihood posterior, docs/design.md §2.8).

Each run goes through ``fedpenalty simulate``'s own path with in-process owners and a
``[network]`` section (one-way latency L for every owner, 10 Mbit/s up and 50 Mbit/s down, no
stragglers): its cost.json gives the simulated wall clock (each query waits for the slowest
owner: its compute share, 2L, the transfer of its request and reply), the MB and round trips
per owner. Reported per (K, L, configuration): ESS per simulated hour (least bulk ESS over the
parameters), its ratio to ``penalty ×4`` on the same network, MB and round trips per owner per
1,000 ESS, the largest ledger ε per owner and the worst case planned, the error of the
posterior mean in posterior sd and the largest split R-hat. Only configurations whose R-hat
is at most 1.1 count as mixed (the ``best`` table): a short many-chain run that has not
mixed reports an ESS nobody should use.

Two smaller tables at K = 4 follow. **Many chains per request** (``many_chains``): exp-family
MH with 4 to 1,024 chains of 96 iterations each, in blocks of 1 and 16, at 150 ms: ESS per
simulated hour against chains and block size, the real chain-iterations per second against 4
chains (is 1,024 chains practical?), and from 16 chains on the nested R-hat of superchains of 4
chains sharing a start (``sampler.superchains``; docs/design.md §5). **Latency distributions**
(``networks``): the baseline and the best K = 4 configurations on a fixed 20 ms, on a
log-normal latency (median 20, p95 150 ms, drawn once per owner) and with stragglers (5 % of
requests 500 ms late).

Writes ``protocol_cost.json`` and ``protocol_cost.png`` (ESS per simulated hour against
latency, one panel per K; a last panel against chains).
"""

from __future__ import annotations

import copy
import math
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the calibrations of privacy_mixing
import privacy_mixing as pm

from fedpenalty import reporting
from fedpenalty.cluster.ray_hosts import connect_ray
from fedpenalty.nested_rhat import MIN_CHAINS
from fedpenalty.privacy.gaussian import epsilon_for_delta, mu_for_epsilon

NAME = "protocol_cost"
EPSILON = 4.0
BANDWIDTH = {"bandwidth_up_mbps": 10.0, "bandwidth_down_mbps": 50.0}
BASELINE = "penalty ×4"
#: chains start uniform in ±INIT_SCALE × Θ (Θ = [−1, 1])
INIT_SCALE = 0.005


@dataclass(frozen=True)
class Config:
    """One way of asking: ``method`` (privacy_mixing's calibration) with ``chains`` chains and
    ``block`` copies per reply (exp-family only)."""

    label: str
    method: str
    chains: int
    block: int | None = None


CONFIGS = (
    Config(BASELINE, "penalty", 4),
    Config("penalty ×16", "penalty", 16),
    Config("penalty ×64", "penalty", 64),
    Config("expfam ×4 B1", "penalty_expfam", 4, 1),
    Config("expfam ×4 B32", "penalty_expfam", 4, 32),
    Config("expfam ×16 B16", "penalty_expfam", 16, 16),
    Config("expfam ×64 B16", "penalty_expfam", 64, 16),
    Config("sgld ×4", "sgld", 4),
    Config("sghmc ×4", "sghmc", 4),
    Config("sgfs ×4", "sgfs", 4),
    Config("barker ×4", "barker", 4),
)
#: the largest split R-hat of a configuration counted as mixed (short many-chain runs are
#: checked against it before their ESS is believed): Gelman & Rubin's classic 1.1, looser
#: than the 1.01 of the run's own warnings, which runs this short rarely reach
MIXED_RHAT = 1.1


@dataclass(frozen=True)
class Setup:
    """Records ``n``, owner counts, answers per owner, latencies (ms), configurations; the
    many-chains sweep (``chain_counts`` × ``blocks`` at ``chain_iterations`` per chain, K = 4)
    and the network sweep (``networks`` names of NETWORKS, configurations ``network_configs``,
    K = 4)."""

    n: int
    owners: tuple[int, ...]
    answers: int
    latencies: tuple[float, ...]
    configs: tuple[str, ...]
    chain_counts: tuple[int, ...]
    blocks: tuple[int, ...]
    chain_iterations: int
    networks: tuple[str, ...]
    network_configs: tuple[str, ...]
    ray_owners: tuple[int, ...] = ()
    ray_answers: int = 960
    ray_latencies: tuple[float, ...] = (20.0, 150.0)
    ray_configs: tuple[str, ...] = (BASELINE, "expfam ×4 B32", "sgld ×4")


#: the network sweep: one-way latency (a number, or a log-normal's median and p95 drawn once per
#: owner) and stragglers (probability of an extra delay per request)
NETWORKS: dict[str, dict[str, Any]] = {
    "20 ms": {"latency_ms": 20.0},
    "20 ms, 5 % +500 ms": {
        "latency_ms": 20.0,
        "straggler_probability": 0.05,
        "straggler_delay_ms": 500.0,
    },
    "median 20, p95 150": {"latency_ms": {"median": 20.0, "p95": 150.0}},
    "median 20, p95 150, 5 % +500 ms": {
        "latency_ms": {"median": 20.0, "p95": 150.0},
        "straggler_probability": 0.05,
        "straggler_delay_ms": 500.0,
    },
}

FULL = Setup(
    200_000,
    (4, 100),
    9_600,
    (1.0, 20.0, 150.0),
    tuple(c.label for c in CONFIGS),
    (4, 64, 256, 1024),
    (1, 16),
    96,
    tuple(NETWORKS),
    (BASELINE, "expfam ×4 B32", "sgld ×4"),
    (1000,),
)
QUICK = Setup(
    200_000,
    (4,),
    4_800,
    (1.0, 150.0),
    (BASELINE, "penalty ×16", "expfam ×16 B16"),
    (4, 64),
    (16,),
    96,
    ("20 ms", "median 20, p95 150, 5 % +500 ms"),
    (BASELINE, "expfam ×16 B16"),
)
#: chains per superchain (chains sharing a start) in the many-chains sweep
CHAINS_PER_SUPERCHAIN = 4


def raw_scenario(setup: Setup, config: Config, owners: int, seed: int) -> dict[str, Any]:
    """The calibrated scenario (unresolved) of ``config`` at K = ``owners``: each chain runs
    answers/chains iterations (whole blocks), a third of them warmup; chains start uniform
    within ±0.005 of the true θ = 0 (data independent; ±2.2 posterior sd at n = 200,000), so
    that every chain pays its own burn-in, as many chains do in practice."""
    steps = setup.answers // config.chains
    if config.block:
        steps = steps // config.block * config.block
    warmup = steps // 3
    pm_setup = pm.Setup(setup.n, config.chains, warmup, steps - warmup, (EPSILON,), 1, ("equal",))
    n_k = [setup.n // owners] * owners
    crowd = pm.Owners(pm_setup, n_k, np.ones(owners), config.chains * steps, 1 / math.sqrt(setup.n))
    algorithm, calibrate = pm.CALIBRATE[config.method]
    raw = calibrate(crowd, EPSILON, pm.scenario(crowd, algorithm, seed))
    raw["data"]["true_theta"] = 0.0
    raw["sampler"]["init_scale"] = INIT_SCALE
    if config.block:
        raw["sampler"]["block"] = config.block
    return raw


def at_ledger_target(raw: dict, n: int, folder: Path) -> tuple[dict, float]:
    """Penalty MH at the target ε *as its owners' ledgers report it*; returns the scenario and
    the worst case it plans (every answer at the full radius, ε at δ).

    privacy_mixing's calibration charges every answer at the full proposal radius a; the
    ledger charges the step taken (uniform in the ball: E|step|² = a²/3 in one dimension), so
    the ledger ends near 2.15, not 4. A pilot run at that calibration gives the ledger's total
    μ; μ ∝ a/σ with the same seed (the proposal lengths scale with a; the chains stay inside
    Θ), so a × target μ / pilot μ reaches the target: the radius grows (σ kept, Σσ_k² = 4)
    up to MAX_RADIUS_SD posterior sd, σ shrinks for the rest. The owners' budget is raised to
    the new worst case, which their ledger never reaches."""
    pilot = reporting.simulate(copy.deepcopy(raw), folder / "pilot")
    mu = max(o["mu"] for o in pilot.result.privacy["owners"])
    target = mu_for_epsilon(EPSILON, pm.DELTA)  # also the pilot's worst case, at radius a
    factor = target / mu
    radius = raw["sampler"]["step"]
    wider = min(radius * factor, pm.MAX_RADIUS_SD / math.sqrt(n))
    shrink = wider / (radius * factor)
    worst = epsilon_for_delta(target * factor, pm.DELTA)
    out = copy.deepcopy(raw)
    out["sampler"]["step"] = wider
    out["privacy"]["sigma"] = [s * shrink for s in raw["privacy"]["sigma"]]
    out["privacy"]["budget_epsilon"] = worst * 1.001
    return out, worst


def measure(sim: reporting.Simulated, config: Config, owners: int, latency: float) -> dict:
    """One run's figures from its cost.json, diagnostics and the owners' ledgers."""
    d, cost = sim.result.diagnostics, sim.result.cost
    assert cost is not None  # every owner-asking run has one
    ess = float(min(d["ess_bulk"]))
    return {
        "config": config.label,
        "method": config.method,
        "chains": config.chains,
        "block": config.block,
        "owners": owners,
        "latency_ms": latency,
        "ess_bulk": ess,
        "simulated_hours": cost["simulated_wall_seconds"] / 3600,
        "ess_per_hour": cost["ess_per_hour"],
        "round_trips_per_owner": cost["totals"]["round_trips"] / owners,
        "megabytes_per_owner": (cost["totals"]["bytes_received"] + cost["totals"]["bytes_sent"])
        / 1e6
        / owners,
        "round_trips_per_1000_ess": cost["per_1000_ess"]["round_trips_per_owner"],
        "megabytes_per_1000_ess": cost["per_1000_ess"]["megabytes_per_owner"],
        "epsilon_max": max(o["epsilon"] for o in sim.result.privacy["owners"]),
        "mean_error_in_sd": d["error"]["mean_in_sd"][0],
        "rhat": max(d["rhat"]) if d["rhat"] else None,
        "mixed": bool(d["rhat"]) and max(d["rhat"]) <= MIXED_RHAT,
    }


def against_baseline(rows: list[dict], same: tuple[str, ...]) -> list[dict]:
    """``rows`` with ``vs_baseline``: ESS per simulated hour over BASELINE's in the row that
    agrees on the keys ``same``."""
    for row in rows:
        base = next(
            r for r in rows if r["config"] == BASELINE and all(r[k] == row[k] for k in same)
        )
        row["vs_baseline"] = row["ess_per_hour"] / base["ess_per_hour"]
    return rows


def calibrated(
    setup: Setup, config: Config, owners: int, seed: int, where: Path
) -> tuple[dict, float]:
    """``raw_scenario`` at the target ledger ε (penalty MH: ``at_ledger_target``) and the worst
    case its owners plan."""
    raw = raw_scenario(setup, config, owners, seed)
    if config.method == "penalty":
        return at_ledger_target(raw, setup.n, where)
    return raw, EPSILON


def runs(setup: Setup, seed: int, folder: Path, bar: Any) -> list[dict]:
    """Every configuration at every K and latency (the same seed: the same draws on every
    network, only the clock differs)."""
    rows = []
    for owners in setup.owners:
        for config in (c for c in CONFIGS if c.label in setup.configs):
            where = folder / f"{owners}-{config.method}-{config.chains}-{config.block}"
            raw, worst = calibrated(setup, config, owners, seed, where)
            for latency in setup.latencies:
                raw["network"] = {"latency_ms": latency, **BANDWIDTH}
                sim = reporting.simulate(raw, where / f"{latency:g}")
                rows.append({**measure(sim, config, owners, latency), "epsilon_planned": worst})
                bar.update()
    return against_baseline(rows, ("owners", "latency_ms"))


def many_chains(setup: Setup, seed: int, folder: Path, bar: Any) -> list[dict]:
    """ESS per simulated hour against chains C and block size B (K = 4, 150 ms): exp-family MH,
    every chain ``chain_iterations`` iterations (C × that answers per owner, each run
    calibrated to ε = 4 for its own answers: more chains, more noise per answer). From 16
    chains on, superchains of CHAINS_PER_SUPERCHAIN chains share a start and diagnostics.json
    has their nested R-hat. ``speed_vs_4`` is the real chain-iterations per second (the run's
    wall time, owners in process) against the fewest chains at the same B."""
    rows = []
    for block in setup.blocks:
        for chains in setup.chain_counts:
            config = Config(f"expfam ×{chains} B{block}", "penalty_expfam", chains, block)
            raw = raw_scenario(
                replace(setup, answers=chains * setup.chain_iterations), config, 4, seed
            )
            many = chains >= MIN_CHAINS
            raw["sampler"]["superchains"] = chains // CHAINS_PER_SUPERCHAIN if many else 0
            raw["network"] = {"latency_ms": 150.0, **BANDWIDTH}
            sim = reporting.simulate(raw, folder / f"chains-{chains}-{block}")
            nested = sim.result.diagnostics.get("nested_rhat")
            rows.append(
                {
                    **measure(sim, config, 4, 150.0),
                    "chain_iterations_per_second": chains * setup.chain_iterations / sim.seconds,
                    "nested_rhat": None if nested is None else max(nested["values"]),
                    "nested_mixed": None if nested is None else nested["mixed"],
                }
            )
            bar.update()
    for row in rows:
        fewest = min(r["chains"] for r in rows if r["block"] == row["block"])
        base = next(r for r in rows if (r["block"], r["chains"]) == (row["block"], fewest))
        row["speed_vs_fewest"] = (
            row["chain_iterations_per_second"] / base["chain_iterations_per_second"]
        )
    return rows


def network_runs(setup: Setup, seed: int, folder: Path, bar: Any) -> list[dict]:
    """``network_configs`` at K = 4 on each of ``networks`` (latency distributions and
    stragglers, NETWORKS; same bandwidth): the same draws on every network."""
    rows = []
    for config in (c for c in CONFIGS if c.label in setup.network_configs):
        where = folder / f"net-{config.method}-{config.chains}-{config.block}"
        raw, worst = calibrated(setup, config, 4, seed, where)
        for i, name in enumerate(setup.networks):
            raw["network"] = {**NETWORKS[name], **BANDWIDTH}
            sim = reporting.simulate(raw, where / str(i))
            row = {**measure(sim, config, 4, math.nan), "epsilon_planned": worst}
            rows.append({**row, "network": name})
            bar.update()
    return against_baseline(rows, ("network",))


def ray_runs(setup: Setup, seed: int, folder: Path, bar: Any) -> list[dict]:
    """``ray_configs`` at each of ``ray_owners`` (K = 1,000) with Ray owners (one local Ray for
    all, owners grouped on one actor per core), ``ray_answers`` answers per owner (shorter
    runs: minutes on a shared machine), at ``ray_latencies``; rows as ``runs``."""
    if not setup.ray_owners:
        return []
    short = replace(setup, answers=setup.ray_answers)
    rows = []
    runtime = connect_ray("")
    try:
        for owners in setup.ray_owners:
            for config in (c for c in CONFIGS if c.label in setup.ray_configs):
                where = folder / f"ray-{owners}-{config.method}-{config.chains}-{config.block}"
                raw, worst = calibrated(short, config, owners, seed, where)
                raw["run"]["transport"] = "ray"
                for latency in setup.ray_latencies:
                    raw["network"] = {"latency_ms": latency, **BANDWIDTH}
                    sim = reporting.simulate(raw, where / f"{latency:g}")
                    row = {**measure(sim, config, owners, latency), "epsilon_planned": worst}
                    rows.append({**row, "transport": "ray", "real_seconds": sim.seconds})
                    bar.update()
    finally:
        runtime.stop()
    return against_baseline(rows, ("owners", "latency_ms"))


def best(rows: list[dict]) -> list[dict]:
    """Per (K, latency) the configuration with the most ESS per simulated hour among those
    that mixed (split R-hat ≤ MIXED_RHAT; an unmixed run's ESS is not believed)."""
    out = []
    for key in dict.fromkeys((r["owners"], r["latency_ms"]) for r in rows):
        mine = [r for r in rows if (r["owners"], r["latency_ms"]) == key and r["mixed"]]
        if not mine:
            continue
        top = max(mine, key=lambda r: r["ess_per_hour"])
        out.append({"owners": key[0], "latency_ms": key[1], "best": top["config"], **top})
    return out


def figure(results: dict[str, list[dict]], setup: Setup) -> Any:
    """ESS per simulated hour against latency (log–log), one line per configuration, a panel
    per K; configurations that did not mix (R-hat > MIXED_RHAT) dashed with open markers. A
    last panel: ESS per simulated hour against chains at 150 ms, one line per block size."""
    rows = results["runs"]
    fig, axes = reporting.figure(1, len(setup.owners) + 1, width=5.5, height=4.2)
    for ax, owners in zip(np.ravel(axes), setup.owners):
        for label in setup.configs:
            mine = [r for r in rows if r["owners"] == owners and r["config"] == label]
            mixed = all(r["mixed"] for r in mine)
            ax.plot(
                [r["latency_ms"] for r in mine],
                [r["ess_per_hour"] for r in mine],
                marker="o",
                linestyle="-" if mixed else "--",
                markerfacecolor=None if mixed else "none",
                label=label if mixed else f"{label} (R-hat > {MIXED_RHAT:g})",
            )
        ax.set(xscale="log", yscale="log", xlabel="one-way latency (ms)")
        ax.set(ylabel="ESS per simulated hour", title=f"K = {owners} owners, ε = {EPSILON:g}")
        ax.legend(fontsize=7)
    ax = np.ravel(axes)[-1]
    for block in setup.blocks:
        mine = [r for r in results["many_chains"] if r["block"] == block]
        x, y = [r["chains"] for r in mine], [r["ess_per_hour"] for r in mine]
        (line,) = ax.plot(x, y, "-", label=f"expfam B = {block} (open: not mixed)")
        for r in mine:  # not mixed: split R-hat above MIXED_RHAT or nested R-hat above its limit
            mixed = r["mixed"] and r["nested_mixed"] is not False
            face = line.get_color() if mixed else "none"
            ax.plot(r["chains"], r["ess_per_hour"], "o", color=line.get_color(), mfc=face)
    ax.set(xscale="log", yscale="log", xlabel="chains (one request carries all)")
    ax.set(
        ylabel="ESS per simulated hour",
        title=f"K = 4, 150 ms, {setup.chain_iterations} iterations per chain",
    )
    ax.legend(fontsize=7)
    return fig


COLUMNS = (
    ("owners", "K"),
    ("latency_ms", "ms"),
    ("config", "configuration"),
    ("ess_per_hour", "ESS/h"),
    ("vs_baseline", "× penalty×4"),
    ("megabytes_per_1000_ess", "MB/1k ESS"),
    ("round_trips_per_1000_ess", "trips/1k ESS"),
    ("epsilon_max", "ε ledger"),
    ("epsilon_planned", "ε worst"),
    ("mean_error_in_sd", "|err|/sd"),
    ("rhat", "R-hat"),
)
CHAIN_COLUMNS = (
    ("chains", "chains"),
    ("block", "B"),
    ("ess_per_hour", "ESS/h at 150 ms"),
    ("round_trips_per_owner", "trips/owner"),
    ("chain_iterations_per_second", "chain-its/s"),
    ("speed_vs_fewest", "× 4 chains"),
    ("epsilon_max", "ε ledger"),
    ("mean_error_in_sd", "|err|/sd"),
    ("rhat", "R-hat"),
    ("nested_rhat", "nested R-hat"),
)
NETWORK_COLUMNS = (
    ("network", "network"),
    ("config", "configuration"),
    ("ess_per_hour", "ESS/h"),
    ("vs_baseline", "× penalty×4"),
    ("simulated_hours", "sim. hours"),
    ("epsilon_max", "ε ledger"),
    ("rhat", "R-hat"),
)
NOTES = [
    "every configuration asks each owner the same answers (chains × iterations), calibrated to "
    "the same ledger ε (penalty MH rescaled after a pilot run; 'epsilon_planned' its worst "
    "case): only how they are asked differs",
    "simulated wall clock: the run's own coordinator time plus, per query, the slowest "
    "owner's compute share, two one-way latencies and its transfer (coordinator/network.py)",
    "one seed per configuration: the draws are the same on every network",
    "many_chains: K = 4 at 150 ms, chains × chain_iterations answers per owner (each run at "
    "ε = 4 for its own answers), superchains of 4 chains sharing a start from 16 chains on; "
    "chain-its/s is real time with in-process owners on a shared machine",
    "networks: K = 4; a latency distribution is drawn once per owner from the run's seed",
    "in-process owners at K = 4 and 100; Ray owners at K = 1,000 ('ray': shorter runs, "
    "ray_answers answers per owner, at ray_latencies)",
]


def sweeps(setup: Setup, seed: int, progress: bool) -> dict[str, list[dict]]:
    """Every run of the scenario: the main table, the many-chains and the network sweeps."""
    total = (
        len(setup.owners) * len(setup.configs) * len(setup.latencies)
        + len(setup.chain_counts) * len(setup.blocks)
        + len(setup.networks) * len(setup.network_configs)
        + len(setup.ray_owners) * len(setup.ray_configs) * len(setup.ray_latencies)
    )
    with tempfile.TemporaryDirectory() as tmp, reporting.progress(total, NAME, progress) as bar:
        rows = runs(setup, seed, Path(tmp), bar)
        many = many_chains(setup, seed, Path(tmp), bar)
        networks = network_runs(setup, seed, Path(tmp), bar)
        ray = ray_runs(setup, seed, Path(tmp), bar)
    return {
        "runs": rows,
        "best": best(rows + ray),
        "many_chains": many,
        "networks": networks,
        "ray": ray,
    }


def owner_counts(parser: Any, flag: str, text: str) -> tuple[int, ...]:
    """Positive whole numbers, comma-separated, or the parser's error naming ``flag``."""
    try:
        counts = tuple(int(k) for k in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        parser.error(f"{flag}: positive whole numbers, comma-separated (4,100)")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME,
        "K = 4, 4,800 answers per owner, latencies 1 and 150 ms, three configurations; 4 and "
        "64 chains at B = 16; two networks",
    )
    parser.add_argument("--owners", help="owner counts K, comma-separated (default 4,100)")
    parser.add_argument(
        "--ray-owners", help="owner counts run with Ray owners (default 1000; none in --quick)"
    )
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.owners:
        setup = replace(setup, owners=owner_counts(parser, "--owners", args.owners))
    if args.ray_owners:
        setup = replace(setup, ray_owners=owner_counts(parser, "--ray-owners", args.ray_owners))
    results = sweeps(setup, args.seed, not args.no_progress)
    settings = {
        "setup": setup.__dict__,
        "epsilon": EPSILON,
        "delta": pm.DELTA,
        "neighbour": pm.NEIGHBOUR,
        "model": pm.MODEL,
        "network": BANDWIDTH,
        "networks": {name: NETWORKS[name] for name in setup.networks},
        "configs": [c.__dict__ for c in CONFIGS if c.label in setup.configs],
        "seed": args.seed,
    }
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=NOTES,
        fig=figure(results, setup),
    )
    print(reporting.headline("Protocol cost at equal per-owner ε", results["runs"], COLUMNS))
    if results["ray"]:
        title = f"K = 1,000 with Ray owners ({setup.ray_answers} answers per owner)"
        print(reporting.headline(title, results["ray"], COLUMNS))
    print(reporting.headline("Many chains per request", results["many_chains"], CHAIN_COLUMNS))
    print(reporting.headline("Latency distributions", results["networks"], NETWORK_COLUMNS))
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
