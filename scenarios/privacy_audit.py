"""Empirical privacy audit: a lower bound on ε from distinguishing neighbouring datasets, against
the ε the owner's ledger claims for exactly what the attacker saw.

    python scenarios/privacy_audit.py [--quick] [--json FILE] [--no-progress]

For each mechanism, the auditor holds two neighbouring datasets D and D′ of one owner (one record
replaced, ``replace_one``, chosen to move the answer as far as the policy allows), collects many
independent answers on each, and runs a threshold attack on a score of what it saw ("D′ when the
score exceeds t"). Its false-positive and false-negative rates bound ε from below, as in
Jagielski, Ullman & Oprea (2020) and Nasr et al. (2021): an (ε, δ)-DP mechanism has
FPR + e^ε FNR ≥ 1 − δ and FNR + e^ε FPR ≥ 1 − δ, so

    ε ≥ max{ log((1 − δ − FNR⁺)/FPR⁺), log((1 − δ − FPR⁺)/FNR⁺) }

with FPR⁺, FNR⁺ one-sided Clopper–Pearson upper bounds (``scipy.stats.beta``), each at level
α/2, so both hold together with probability ≥ 1 − α = ``CONFIDENCE`` (0.95). The threshold and
the direction of the test are chosen on the first half of each sample (the candidate thresholds
are 2,001 quantiles of the pooled first halves; the one with the largest bound there wins) and
the bound is computed on the second half only, so no correction for the many thresholds tried
is needed. A lower bound below 0 is reported as 0. ``violation`` is lower bound > claimed ε.

The claimed ε is what the owner's own privacy report says for the answers the attacker scores
(one answer, or the fixed composition of ``answers_per_trial`` answers), at the owner's δ.

Mechanisms (rows):

* ``penalty_answer``: a real owner (``OwnerNode`` + ``OwnerHost``, ``gaussian_mean`` with
  ‖x‖ ≤ 10, Θ = [−½, ½], σ = 0.7) answering noisy log-likelihood ratios at θ = 0, θ′ = step,
  one (session, chain, iteration) key per answer; D holds x = −10 where D′ holds x = +10, which
  moves the answer by 2·10·step, 95% of the sensitivity 2L·step the owner charges (L = 10.5).
  The step makes the claimed μ = 2L·step/σ = 0.75 (ε ≈ 3.1 at δ = 1e-5).
* ``suff_stats_answer``: one noisy sufficient-statistic copy (``penalty_expfam``,
  ``bernoulli``, σ = 4/3): D and D′ differ in one outcome 0 → 1, the full sensitivity 1.
* ``gradient_answer``: one clipped gradient (``sgmcmc``, sampling rate 1, clip 1, noise
  multiplier 8/3) at θ = 0, where x = ∓10 has gradient ∓10, clipped to ∓1: the answers differ
  by 2·clip, the full replace-one sensitivity, so the audit is as tight as a threshold test of
  a Gaussian can be.
* ``broken_sigma_half``: the ``penalty_answer`` owner's noise-free answers with σ/2 noise,
  claiming σ; the audit must flag it.
* ``float_noise_tiny_step``: the old floating-point sampler (λ + σ·``rng.standard_normal()``)
  at step 1e-8, where λ_D and λ_D′ differ by 2e-7 and the ledger claims ε ≈ 0 for the
  ``TINY_ANSWERS`` answers of a trial. Mironov's (2012) attack: floating-point noise takes only
  values with a particular structure, which the answer keeps; here the distinguisher asks, for
  each candidate λ, whether the answer is an output the float computation can produce from λ —
  some double y with fl(λ + y) = answer that is itself a product fl(σ·ξ) of a double ξ
  (``float_consistent``). From the true λ it always is; from the other λ only sometimes
  (about 82% of answers at σ = 0.7: products fl(σ·ξ) miss some doubles), so the score
  #answers inconsistent with λ_D − #answers inconsistent with λ_D′ separates D from D′.
* ``penalty_answer_tiny_step``: the same distinguisher against the real owner API at step
  1e-8 (the attacker recomputes the owner's noise-free λ bit for bit from the public code and
  both candidate datasets). Owners whose answers are exact lattice points defeat it.

Optional row keys: ``trials`` (per dataset: half select the test, half bound ε),
``answers_per_trial``, ``delta``, ``confidence`` and ``attack_accuracy``, the chosen test's
balanced accuracy on the evaluation halves. For a Gaussian answer the best threshold sits far
in a tail, so its accuracy is near ½: the bound comes from the ratio of two tail rates.

Sample sizes (``Settings``): ``--quick`` 20,000 answers per dataset for the owner mechanisms,
200,000 for the simulated σ/2 mechanism and 1,000 trials for the tiny-step rows (about 10 s);
the default 1,000,000, 2,000,000 and 10,000 (about two minutes). Seeds are fixed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from tqdm.auto import tqdm

from fedpenalty.cli import table
from fedpenalty.common import Policy
from fedpenalty.models import ExpFamModel, Model, build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.noise.sources import NoiseKey

DELTA = 1e-5
CONFIDENCE = 0.95
#: μ = Δ/σ the owners claim for one honest answer (ε ≈ 3.1 at δ = 1e-5).
MU = 0.75
DATA_BOUND, THETA_BOUND = 10.0, 0.5
N_RECORDS = 10
#: the log-ratio owners' σ: a number whose float products fl(σ·ξ) miss some doubles (σ = 1,
#: or any power of two, makes fl(σ·ξ) = σ·ξ exact, and then this distinguisher sees nothing).
LOG_RATIO_SIGMA = 0.7
#: above the owners' default min_step (1e-9); charged for itself (``min_charged_step``), ε ≈ 0
TINY_STEP = 1e-8
TINY_ANSWERS = 32
CLIP = 1.0
SEED = 0
THRESHOLDS = 2001
#: Answers per owner request (a batch of chains at one iteration).
BATCH = 50_000


@dataclass(frozen=True)
class Settings:
    """Sample sizes, per dataset: ``trials`` for the honest owner mechanisms, ``broken_trials``
    for the simulated σ/2 mechanism, ``tiny_trials`` (of ``TINY_ANSWERS`` answers each) for
    the two tiny-step rows."""

    trials: int
    broken_trials: int
    tiny_trials: int


QUICK = Settings(trials=20_000, broken_trials=200_000, tiny_trials=1_000)
DEFAULT = Settings(trials=1_000_000, broken_trials=2_000_000, tiny_trials=10_000)


# --- the test ---------------------------------------------------------------------------------
def clopper_pearson_upper(successes: Any, trials: int, alpha: float) -> np.ndarray:
    """One-sided (1 − ``alpha``) Clopper–Pearson upper bounds on binomial proportions, given
    ``successes`` (an int or an array of ints) out of ``trials``: the ``1 − alpha`` quantile of
    Beta(k + 1, n − k), and 1 when k = n."""
    k = np.asarray(successes, dtype=float)
    upper = stats.beta.ppf(1 - alpha, k + 1, np.maximum(trials - k, 1))
    return np.where(k >= trials, 1.0, upper)


def epsilon_lower_bound(
    false_pos: Any, false_neg: Any, n_d: int, n_d_prime: int, delta: float, alpha: float
) -> np.ndarray:
    """The ε an (ε, δ)-DP mechanism must have for a test with these error counts (on ``n_d``
    samples from D and ``n_d_prime`` from D′), with probability ≥ 1 − ``alpha``: both forms of
    the (ε, δ) hypothesis-testing bound, from Clopper–Pearson upper bounds at α/2 each; −inf
    where the bound says nothing."""
    fpr = clopper_pearson_upper(false_pos, n_d, alpha / 2)
    fnr = clopper_pearson_upper(false_neg, n_d_prime, alpha / 2)
    with np.errstate(divide="ignore"):
        first = np.log(np.maximum(1 - delta - fnr, 0) / fpr)
        second = np.log(np.maximum(1 - delta - fpr, 0) / fnr)
    return np.maximum(first, second)


def _errors(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(false positives, false negatives) of the test "D′ when score > t", for each t."""
    d, d_prime = np.sort(scores_d), np.sort(scores_d_prime)
    false_pos = len(d) - np.searchsorted(d, thresholds, side="right")
    return false_pos, np.searchsorted(d_prime, thresholds, side="right")


@dataclass(frozen=True)
class Audit:
    """A threshold attack's result: the ε lower bound (≥ 0) on the evaluation halves, the test
    chosen on the selection halves ("D′ when direction·score > threshold") and its balanced
    accuracy on the evaluation halves."""

    epsilon_lower_bound: float
    threshold: float
    direction: int
    accuracy: float


def audit(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, delta: float, confidence: float = CONFIDENCE
) -> Audit:
    """Threshold attack on i.i.d. scores of answers from D and from D′: the threshold and
    direction with the largest bound on the first halves, evaluated on the second halves."""
    alpha = 1 - confidence
    h_d, h_d_prime = len(scores_d) // 2, len(scores_d_prime) // 2
    pooled = np.concatenate([scores_d[:h_d], scores_d_prime[:h_d_prime]])
    best = (-np.inf, 0.0, 1)
    for direction in (1, -1):
        candidates = np.unique(np.quantile(direction * pooled, np.linspace(0, 1, THRESHOLDS)))
        errors = _errors(
            direction * scores_d[:h_d], direction * scores_d_prime[:h_d_prime], candidates
        )
        bounds = epsilon_lower_bound(*errors, h_d, h_d_prime, delta, alpha)
        i = int(np.argmax(bounds))
        if bounds[i] > best[0]:
            best = (float(bounds[i]), float(candidates[i]), direction)
    _, threshold, direction = best
    eval_d, eval_d_prime = direction * scores_d[h_d:], direction * scores_d_prime[h_d_prime:]
    false_pos, false_neg = _errors(eval_d, eval_d_prime, np.array([threshold]))
    bound = epsilon_lower_bound(false_pos, false_neg, len(eval_d), len(eval_d_prime), delta, alpha)[
        0
    ]
    accuracy = 1 - (false_pos[0] / len(eval_d) + false_neg[0] / len(eval_d_prime)) / 2
    return Audit(max(float(bound), 0.0), threshold, direction, float(accuracy))


# --- Mironov's floating-point distinguisher ---------------------------------------------------
def _neighbourhood(x: np.ndarray, ulps: int) -> list[np.ndarray]:
    """``x`` and the ``ulps`` nearest doubles on either side of each value."""
    out, down, up = [x], x, x
    for _ in range(ulps):
        down, up = np.nextafter(down, -np.inf), np.nextafter(up, np.inf)
        out += [down, up]
    return out


def float_consistent(answers: np.ndarray, lam: float, sigma: float, ulps: int = 2) -> np.ndarray:
    """Whether each answer is one the float sampler fl(λ + fl(σ·ξ)) can produce from ``lam``:
    some double y within ``ulps`` of answer − λ with fl(λ + y) = answer, and some double ξ
    within ``ulps`` of y/σ with fl(σ·ξ) = y. Every answer computed from λ passes (rounding moves
    y and ξ by at most an ulp); from another λ, only where the products happen to land."""
    found = np.zeros(answers.shape, dtype=bool)
    for y in _neighbourhood(answers - lam, ulps):
        product = np.zeros(answers.shape, dtype=bool)
        for xi in _neighbourhood(y / sigma, ulps):
            product |= sigma * xi == y
        found |= (lam + y == answers) & product
    return found


def float_scores(answers: np.ndarray, lam_d: float, lam_d_prime: float, sigma: float) -> np.ndarray:
    """Per trial (row of ``answers``), how many answers cannot come from λ_D minus how many
    cannot come from λ_D′: ≤ 0 whenever the answers came from D, ≥ 0 from D′."""
    against_d = (~float_consistent(answers, lam_d, sigma)).sum(axis=1)
    return against_d - (~float_consistent(answers, lam_d_prime, sigma)).sum(axis=1)


def old_float_answers(
    lam: float, sigma: float, rng: np.random.Generator, shape: tuple[int, ...]
) -> np.ndarray:
    """The old sampler: λ + σ·ξ in float64, ξ numpy's standard normal."""
    return lam + sigma * rng.standard_normal(shape)


def noise_free_log_ratio(
    model: ExpFamModel, records: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray
) -> float:
    """An exponential-family owner's clipped log-likelihood ratio before noise, computed as its
    host does (Δηᵀ Σ S(x) − n ΔA, clipped to ±nL‖θ′−θ‖) so that it is the same double:
    the attacker's knowledge of the public code and of the candidate dataset."""
    prepared = model.prepare_records(records)
    stat_sum = model.suff_stat(prepared).sum(axis=0)[None, :]
    n = np.array([len(prepared)], dtype=float)
    step = np.linalg.norm(theta_prop - theta, axis=1)
    d_eta = model.natural_param(theta_prop) - model.natural_param(theta)
    d_a = model.log_partition(theta_prop) - model.log_partition(theta)
    total = stat_sum @ d_eta.T - n[:, None] * d_a[None, :]
    bound = n[:, None] * (model.lipschitz * step)[None, :]
    return float(np.clip(total, -bound, bound)[0, 0])


# --- mechanisms through the owner API ---------------------------------------------------------
Ask = Callable[[OwnerHost, str, int, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class OwnerMechanism:
    """One owner's answers on D and on D′ through the public owner API: ``ask(host, session,
    iteration, chains)`` returns the ``(C,)`` answers of one request."""

    model: Model
    records_d: np.ndarray
    records_d_prime: np.ndarray
    policy: Policy
    algorithm: str
    ask: Ask
    sampling_rate: float | None = None

    def host(self, records: np.ndarray, seed: list[int]) -> OwnerHost:
        """A fresh owner on ``records`` with its own in-memory ledger, answering as a deployed
        owner does (exact lattice noise), from a noise key derived from ``seed`` so that the
        audit is reproducible."""
        rng = np.random.default_rng(seed)
        key = NoiseKey.derive(repr(seed).encode(), "owner")
        node = OwnerNode(
            "owner", self.model, records, self.policy, Ledger(":memory:"), rng, noise_key=key
        )
        return OwnerHost([node])

    def answers(
        self, host: OwnerHost, session: str, total: int, bar: tqdm | None = None
    ) -> np.ndarray:
        """``total`` answers, each to a fresh (session, chain, iteration) key, in requests of at
        most ``BATCH`` chains."""
        host.open_session(session, self.algorithm, total, self.sampling_rate)
        out = []
        for iteration, start in enumerate(range(0, total, BATCH)):
            chains = np.arange(min(BATCH, total - start))
            out.append(self.ask(host, session, iteration, chains))
            if bar is not None:
                bar.update(len(chains))
        return np.concatenate(out)

    def claimed_epsilon(self, answers: int) -> float:
        """ε at the owner's δ that a fresh owner on D reports for one session of ``answers``
        answers — exactly what the attacker scores per trial."""
        host = self.host(self.records_d, [SEED, 99])
        self.answers(host, "claim", answers)
        report = host.privacy_reports("claim")[0].session
        assert report is not None and report.answers == answers
        return report.epsilon

    def sample(
        self, total: int, seed: int, progress: bool, desc: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """``total`` answers from an owner on D and from one on D′."""
        with tqdm(total=2 * total, desc=desc, disable=not progress, leave=False) as bar:
            return (
                self.answers(self.host(self.records_d, [SEED, seed, 0]), "audit", total, bar),
                self.answers(self.host(self.records_d_prime, [SEED, seed, 1]), "audit", total, bar),
            )


def _neighbours(base: np.ndarray, record_d: float, record_d_prime: float) -> tuple[np.ndarray, ...]:
    """``base`` with its first record set to ``record_d`` (D) and to ``record_d_prime`` (D′)."""
    d, d_prime = base.copy(), base.copy()
    d[0], d_prime[0] = record_d, record_d_prime
    return d, d_prime


def _gaussian_mean() -> Model:
    """The model of the log-ratio and gradient owners: d = 1, ‖x‖ ≤ 10, Θ = [−½, ½], L = 10.5."""
    return build_model(
        {"name": "gaussian_mean", "dim": 1, "data_bound": DATA_BOUND, "theta_bound": THETA_BOUND}
    )


def normal_step() -> float:
    """The step at which one log-ratio answer is charged μ = ``MU``: Δ = 2L·step = MU·σ."""
    return MU * LOG_RATIO_SIGMA / (2 * _gaussian_mean().lipschitz)


def penalty_mechanism(step: float) -> OwnerMechanism:
    """Noisy log-likelihood ratios at θ = 0, θ′ = ``step`` (≤ ``normal_step()``, the owner's
    max_step) from a ``gaussian_mean`` owner whose datasets differ in one record, x = −10 (D)
    against x = +10 (D′)."""
    # charged for ``step`` itself (an owner's default charges at least max_step/10): the audit
    # weighs each answer against exactly what it claims
    policy = Policy(
        sigma=LOG_RATIO_SIGMA,
        max_step=normal_step(),
        budget_epsilon=1e12,
        delta=DELTA,
        max_answers_per_request=BATCH,
        min_charged_step=step,
    )

    def ask(host: OwnerHost, session: str, iteration: int, chains: np.ndarray) -> np.ndarray:
        theta = np.zeros((len(chains), 1))
        return host.log_ratio(session, iteration, chains, theta, theta + step)[0]

    d, d_prime = _neighbours(np.zeros((N_RECORDS, 1)), -DATA_BOUND, DATA_BOUND)
    return OwnerMechanism(_gaussian_mean(), d, d_prime, policy, "penalty", ask)


def suff_stats_mechanism() -> OwnerMechanism:
    """Noisy Σx copies (one per key) from a ``bernoulli`` owner; D and D′ differ in one outcome,
    0 → 1 (sensitivity 1, σ = 1/MU)."""
    policy = Policy(sigma=1 / MU, budget_epsilon=1e12, delta=DELTA, max_answers_per_request=BATCH)

    def ask(host: OwnerHost, session: str, iteration: int, chains: np.ndarray) -> np.ndarray:
        return host.suff_stats(session, chains, iteration, 1)[0, :, 0, 0]

    d, d_prime = _neighbours(np.zeros((N_RECORDS, 1)), 0.0, 1.0)
    return OwnerMechanism(
        build_model({"name": "bernoulli"}), d, d_prime, policy, "penalty_expfam", ask
    )


def gradient_mechanism() -> OwnerMechanism:
    """Clipped gradients at θ = 0 with sampling rate 1 from a ``gaussian_mean`` owner: x = ∓10
    has gradient ∓10, clipped to ∓``CLIP`` (the other records' gradients are 0), so D and D′
    differ by the full 2·clip; noise multiplier 2/MU."""
    policy = Policy(sigma=2 / MU, budget_epsilon=1e12, delta=DELTA, max_answers_per_request=BATCH)

    def ask(host: OwnerHost, session: str, iteration: int, chains: np.ndarray) -> np.ndarray:
        theta = np.zeros((len(chains), 1))
        return host.gradient(session, iteration, chains, theta, CLIP)[0, :, 0]

    d, d_prime = _neighbours(np.zeros((N_RECORDS, 1)), -DATA_BOUND, DATA_BOUND)
    return OwnerMechanism(_gaussian_mean(), d, d_prime, policy, "sgmcmc", ask, sampling_rate=1.0)


# --- the audit --------------------------------------------------------------------------------
def row(
    mechanism: str,
    claimed: float,
    scores_d: np.ndarray,
    scores_d_prime: np.ndarray,
    answers_per_trial: int = 1,
) -> dict[str, Any]:
    """One output row: the audit of these scores against the ``claimed`` ε."""
    result = audit(scores_d, scores_d_prime, DELTA)
    return {
        "mechanism": mechanism,
        "claimed_epsilon": claimed,
        "audited_epsilon_lower_bound": result.epsilon_lower_bound,
        "violation": bool(result.epsilon_lower_bound > claimed),
        "trials": len(scores_d),
        "answers_per_trial": answers_per_trial,
        "delta": DELTA,
        "confidence": CONFIDENCE,
        "attack_accuracy": result.accuracy,
    }


def audit_owner(
    name: str, mechanism: OwnerMechanism, trials: int, seed: int, progress: bool
) -> dict[str, Any]:
    """The row of one honest owner mechanism: single answers, scored as they are."""
    scores_d, scores_d_prime = mechanism.sample(trials, seed, progress, name)
    return row(name, mechanism.claimed_epsilon(1), scores_d, scores_d_prime)


def noise_free_pair(mechanism: OwnerMechanism, step: float) -> tuple[float, float]:
    """(λ_D, λ_D′): the log-ratio owner's answers at θ = 0, θ′ = ``step`` before noise."""
    assert isinstance(mechanism.model, ExpFamModel)
    theta = np.zeros((1, 1))
    lam_d = noise_free_log_ratio(mechanism.model, mechanism.records_d, theta, theta + step)
    lam_d_prime = noise_free_log_ratio(
        mechanism.model, mechanism.records_d_prime, theta, theta + step
    )
    return lam_d, lam_d_prime


def audit_broken(trials: int, seed: int) -> dict[str, Any]:
    """The ``penalty_answer`` owner's noise-free answers with σ/2 noise, claiming σ's ε."""
    mechanism = penalty_mechanism(normal_step())
    lam_d, lam_d_prime = noise_free_pair(mechanism, normal_step())
    sigma = mechanism.policy.sigma / 2
    rng = np.random.default_rng([SEED, seed])
    scores_d = lam_d + sigma * rng.standard_normal(trials)
    scores_d_prime = lam_d_prime + sigma * rng.standard_normal(trials)
    return row("broken_sigma_half", mechanism.claimed_epsilon(1), scores_d, scores_d_prime)


def audit_tiny_step(trials: int, seed: int, progress: bool) -> list[dict[str, Any]]:
    """The rows ``float_noise_tiny_step`` (the old float sampler) and
    ``penalty_answer_tiny_step`` (the real owner), both at step ``TINY_STEP``, each trial
    ``TINY_ANSWERS`` answers scored by ``float_scores``."""
    mechanism = penalty_mechanism(TINY_STEP)
    sigma = mechanism.policy.sigma
    lam_d, lam_d_prime = noise_free_pair(mechanism, TINY_STEP)
    claimed = mechanism.claimed_epsilon(TINY_ANSWERS)
    shape = (trials, TINY_ANSWERS)
    rng = np.random.default_rng([SEED, seed])
    old = (
        old_float_answers(lam_d, sigma, rng, shape),
        old_float_answers(lam_d_prime, sigma, rng, shape),
    )
    owner = mechanism.sample(trials * TINY_ANSWERS, seed, progress, "penalty_answer_tiny_step")
    rows = []
    for name, (d, d_prime) in (("float_noise_tiny_step", old), ("penalty_answer_tiny_step", owner)):
        scores_d = float_scores(d.reshape(shape), lam_d, lam_d_prime, sigma)
        scores_d_prime = float_scores(d_prime.reshape(shape), lam_d, lam_d_prime, sigma)
        rows.append(row(name, claimed, scores_d, scores_d_prime, TINY_ANSWERS))
    return rows


def run_audit(settings: Settings, progress: bool = False) -> list[dict[str, Any]]:
    """Every row, in the order of the module docstring."""
    rows = [
        audit_owner(
            "penalty_answer", penalty_mechanism(normal_step()), settings.trials, 1, progress
        ),
        audit_owner("suff_stats_answer", suff_stats_mechanism(), settings.trials, 2, progress),
        audit_owner("gradient_answer", gradient_mechanism(), settings.trials, 3, progress),
        audit_broken(settings.broken_trials, 4),
    ]
    return rows + audit_tiny_step(settings.tiny_trials, 5, progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer trials (under a minute)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run_audit(QUICK if args.quick else DEFAULT, progress=not args.no_progress)
    print(
        table(
            [
                "mechanism",
                "claimed ε",
                "audited ε ≥",
                "violation",
                "trials",
                "answers/trial",
                "accuracy",
            ],
            [
                [
                    r["mechanism"],
                    f"{r['claimed_epsilon']:.4g}",
                    f"{r['audited_epsilon_lower_bound']:.4g}",
                    "YES" if r["violation"] else "no",
                    str(r["trials"]),
                    str(r["answers_per_trial"]),
                    f"{r['attack_accuracy']:.3f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\nδ = {DELTA:g}, {CONFIDENCE:.0%} confidence (Clopper–Pearson; threshold chosen on "
        f"half the trials, bound on the other half); {time.perf_counter() - start:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
