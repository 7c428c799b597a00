"""Secure aggregation at several sub-steps (docs/design.md §2.6): answers of one (chain,
iteration) at different sub-steps are masked with different words — else the difference of a
host's two masked replies would be the difference of its owners' answers, unmasked — and the
masks still cancel across hosts at every sub-step; sub-step 0 keeps its words."""

from __future__ import annotations

import numpy as np
import pytest
from test_secure_aggregation import U64, keys_of

from fedpenalty.common import SecureTerms
from fedpenalty.owner.aggregation import SecureSession


@pytest.mark.parametrize("simulation", [False, True], ids=["chacha20", "splitmix-simulation"])
def test_each_substep_has_its_own_masks_which_cancel_across_hosts(simulation):
    count, terms = 5, SecureTerms(5, 1, 1.0)
    private, peers = keys_of(count)
    multiples = np.random.default_rng(0).integers(-(2**40), 2**40, size=(count, 4, 2))
    chains, iterations = np.arange(4), np.array([7, 7, 8, 8])
    totals, first_host = {}, {}
    for substep in (0, 1, 2):
        total = np.zeros((4, 3), dtype=U64)
        for group in ((0, 1), (2, 3, 4)):
            hosted = [(f"o{k}", private[k]) for k in group]
            session = SecureSession("sess", "penalty", terms, peers, hosted, simulation)
            masked = session.mask(
                multiples[list(group)], np.arange(len(group)), chains, iterations, substep
            )
            if group == (0, 1):
                first_host[substep] = masked.sum(axis=0, dtype=U64)
                if substep == 0:  # sub-step 0: the words masks always had
                    before = session.mask(
                        multiples[list(group)], np.arange(len(group)), chains, iterations
                    )
                    np.testing.assert_array_equal(masked, before)
            total += masked.sum(axis=0, dtype=U64)
        totals[substep] = total
        np.testing.assert_array_equal(total[:, :2].view(np.int64), multiples.sum(axis=0))
        assert np.all(total[:, 2] == 0)
    # the same values masked at two sub-steps: the host's replies differ in every word (the
    # masks differ), so their difference reveals nothing of the values
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert np.all(first_host[a] != first_host[b])
