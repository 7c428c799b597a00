"""The in-process request path's cheaper forms compute what their definitions say, bit for bit
(docs/design.md §4, "Fewer objects and calls per request")."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedpenalty.coordinator import mh
from fedpenalty.owner.noise.seeded import (
    LOOKAHEAD_ITERATIONS,
    LOOKAHEAD_VALUES,
    SeededNormals,
    lookahead_iterations,
)
from fedpenalty.owner.validation import row_digests


def test_row_digests_are_sha256_of_tag_and_row():
    """Each digest is SHA-256(tag ‖ row as little-endian float64), whatever tags came before:
    70 tags (past the 64 kept hashes) asked twice each, so a kept hash that a digest changed,
    or one kept for the wrong tag, fails."""
    rng = np.random.default_rng(3)
    tags = [b"penalty"] + [b"clip" + bytes([i]) for i in range(69)]
    for tag in tags + tags[::-1]:
        rows = rng.normal(size=(5, 2))
        expected = [hashlib.sha256(tag + row.astype("<f8").tobytes()).digest() for row in rows]
        assert row_digests(tag, rows) == expected


@pytest.mark.parametrize("dim", [1, 2, 3, 10])
@pytest.mark.parametrize("min_radius", [0.0, 0.3])
def test_proposals_follow_their_formula(dim, min_radius):
    """θ' = θ + direction·radius·(hole + (1 − hole)·u)^(1/d), computed in place, equals the
    formula's own expression for 500 steps of one stream (bytes compared)."""
    theta = np.random.default_rng(5).normal(size=(4, dim))
    ours, reference = np.random.default_rng(9), np.random.default_rng(9)
    for _ in range(500):
        proposed = mh.propose_in_ball(ours, theta, 0.7, min_radius)
        direction = reference.standard_normal((4, dim))
        direction /= np.sqrt(np.add.reduce(direction * direction, axis=1, keepdims=True))
        hole = (min_radius / 0.7) ** dim
        length = 0.7 * (hole + (1.0 - hole) * reference.random(4)) ** (1.0 / dim)
        assert proposed.tobytes() == (theta + direction * length[:, None]).tobytes()


def test_lookahead_normals_are_the_values_asked_one_by_one():
    """Seeded normals served from a lookahead block (every owner, one iteration, asked in
    order) are bit for bit the values drawn for that key alone — after a jump either way, a
    skipped iteration at a block's end, a repeat, a subset of chains, another width — and
    read-only (the block is shared by later asks)."""
    seeds = [bytes([k]) * 32 for k in range(5)]
    served = SeededNormals(seeds)
    chains = np.array([0, 2, 5])
    asks = [(chains, i, 2) for i in range(70)]  # past two blocks of 32
    asks += [(chains, 500, 2), (chains, 501, 2), (chains, 3, 2), (chains, 501, 2)]
    asks += [(chains, 531, 2), (chains, 533, 2)]  # past the block, an iteration skipped
    asks += [(chains[:2], 502, 2), (chains, 502, 2), (chains, 502, 1), (chains, 503, 1)]
    for asked, iteration, width in asks:
        iterations = np.full(len(asked), iteration)
        got = served.normals("s", "penalty", None, asked, iterations, width)
        alone = SeededNormals(seeds).normals("s", "penalty", np.arange(5), asked, iterations, width)
        np.testing.assert_array_equal(got, alone)
        assert got.shape == (5, len(asked), width)
        assert not got.flags.writeable
    assert lookahead_iterations(5 * 3 * 2) == LOOKAHEAD_ITERATIONS
    assert lookahead_iterations(LOOKAHEAD_VALUES // 2) == 2
    assert lookahead_iterations(LOOKAHEAD_VALUES + 1) == 1  # no block: drawn per iteration
