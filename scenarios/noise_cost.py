"""Cost of exact lattice noise against numpy float Gaussian noise, per owners' request.

    python scenarios/noise_cost.py [--owners 1,64,1024] [--json FILE] [--seconds 1] [--quick]

One request = K owners × 4 chains × width 1 noisy answers (the penalty log-ratio shape), at
σ = 1 and γ = 2^-32 (σ/γ = 2^32). Methods: (a) ``float``: values + σ·rng.standard_normal —
the baseline; (b) ``lattice-seeded``: ``noisy_lattice_answers`` with ``PhiloxSource``
(simulation); (c) ``lattice-secure``: the same with ``ChaChaSource`` (deployed). Absolute times
drift several-fold on a shared box, so the methods are interleaved in rounds and each is
reported as the median over rounds of its cost relative to (a) in the same round, next to
the absolute answers per second. Also measured: the per-call overhead of ``cryptography``'s
ChaCha20 for small outputs (cipher set-up + one ``update``) and its streaming cost per byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from fedpenalty.cli import table
from fedpenalty.owner.noise.lattice import noisy_lattice_answers
from fedpenalty.owner.noise.sources import ChaChaSource, NoiseKey, PhiloxSource

CHAINS, WIDTH, SIGMA, GAMMA = 4, 1, 1.0, 2.0**-32
METHODS = ("float", "lattice-seeded", "lattice-secure")


def rate(request: Callable[[int], object], seconds: float) -> float:
    """Requests per second of ``request(iteration)`` for about ``seconds`` (≥ 3 requests)."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done < 3:
        request(done)
        done += 1
    return done / elapsed


def requests(owners: int) -> dict[str, Callable[[int], object]]:
    """One request function per method for ``owners`` owners (sources built and warmed)."""
    keys = [NoiseKey.derive(0, f"owner-{k}") for k in range(owners)]
    rng = np.random.default_rng(0)
    values = rng.standard_normal((owners, CHAINS, WIDTH))
    sigma = np.full(owners, SIGMA)
    seeded, secure = PhiloxSource(keys), ChaChaSource(keys)
    out = {
        "float": lambda it: values + sigma[:, None, None] * rng.standard_normal(values.shape),
        "lattice-seeded": lambda it: noisy_lattice_answers(
            seeded, "bench", "log_ratio", it, values, sigma, GAMMA
        ),
        "lattice-secure": lambda it: noisy_lattice_answers(
            secure, "bench", "log_ratio", it, values, sigma, GAMMA
        ),
    }
    for request in out.values():  # derive the per-session subkeys before timing
        request(0)
    return out


def measure(owners: int, seconds: float, rounds: int) -> dict:
    """Answers/s of each method (median over rounds) and its cost relative to ``float``."""
    funcs = requests(owners)
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(rounds):
        for method in METHODS:
            rates[method].append(rate(funcs[method], seconds / rounds) * owners * CHAINS * WIDTH)
    row = {"owners": owners, "answers_per_request": owners * CHAINS * WIDTH}
    for method in METHODS:
        row[f"{method}_answers_per_second"] = statistics.median(rates[method])
    for method in METHODS[1:]:
        row[f"{method}_cost_vs_float"] = statistics.median(
            base / r for base, r in zip(rates["float"], rates[method], strict=True)
        )
    return row


def chacha_overhead(seconds: float) -> dict:
    """Microseconds per ChaCha20 call (set-up + update) by output size, and ns per byte."""
    key, nonce = bytes(range(32)), bytes(16)

    def call(size: int) -> Callable[[int], object]:
        zeros = bytes(size)
        return lambda _: Cipher(algorithms.ChaCha20(key, nonce), None).encryptor().update(zeros)

    out = {f"call_us_{size}B": 1e6 / rate(call(size), seconds / 5) for size in (64, 512, 2048)}
    big = 1 << 20
    out["stream_ns_per_byte"] = 1e9 / (rate(call(big), seconds / 5) * big)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--owners", default="1,64,1024", help="comma-separated owner counts")
    parser.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="timed seconds per method and owner count, split over rounds",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="a fast run: 0.3 s, 3 rounds")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    seconds, rounds = (0.3, 3) if args.quick else (args.seconds, args.rounds)
    rows = []
    for owners in [int(k) for k in args.owners.split(",")]:
        rows.append(measure(owners, seconds, rounds))
        print(f"K={owners} done", file=sys.stderr, flush=True)
    overhead = chacha_overhead(seconds)
    print(
        table(
            ["owners", "answers/req"]
            + [f"{m} ans/s" for m in METHODS]
            + ["seeded cost ×", "secure cost ×"],
            [
                [str(r["owners"]), str(r["answers_per_request"])]
                + [f"{r[f'{m}_answers_per_second']:.3g}" for m in METHODS]
                + [
                    f"{r['lattice-seeded_cost_vs_float']:.0f}",
                    f"{r['lattice-secure_cost_vs_float']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nChaCha20 (cryptography) per call: "
        + ", ".join(
            f"{k.removeprefix('call_us_')} {v:.1f} µs"
            for k, v in overhead.items()
            if k.startswith("call")
        )
        + f"; streaming {overhead['stream_ns_per_byte']:.2f} ns/byte"
    )
    if args.json:
        args.json.write_text(json.dumps({"requests": rows, "chacha20": overhead}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
