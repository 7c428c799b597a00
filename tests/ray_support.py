"""Test-only Ray helpers: the session's local Ray, and Ray actors serving owners built in the
test (so that the oracle contract can compare them with the same owners asked directly)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace

from fedpenalty.cluster.ray_hosts import HostSpec, OwnerSpec, RayHosts
from fedpenalty.coordinator.ray_oracle import RayOracle
from fedpenalty.owner import Ledger, OwnerNode


def ray_oracle_of(
    actors: RayHosts, nodes: Sequence[OwnerNode]
) -> tuple[RayOracle, SimpleNamespace]:
    """A ``RayOracle`` over ``actors`` serving ``nodes``: one actor per ledger file
    (contiguous owners sharing a ledger), each with the node's records, policy, noise key and
    seeded noise generator (a copy at its current state; none for a deployed-style node, which
    then reads its agreement secret from the same ledger file). The test's ledgers are closed
    and each node's ``ledger`` is replaced by a read-only view of the file its actor writes, so
    the test reads what the actors charged. Returns the oracle and a handle whose ``close()``
    releases the owners (the actors stay for the next test: starting one takes seconds)."""
    groups: list[list[OwnerNode]] = []
    for node in nodes:
        if groups and groups[-1][0].ledger is node.ledger:
            groups[-1].append(node)
        else:
            groups.append([node])
    specs = []
    for group in groups:
        ledger = group[0].ledger
        ledger.close()
        view = Ledger(ledger.path, read_only=True)
        for node in group:
            node.ledger = view
        model = group[0].model
        owners = [
            OwnerSpec(
                n.name,
                n.policy,
                n.rng if n.seeded else None,
                n.records,
                simulation=n.diagnostics is not None,
                noise_key=n.noise_key,
                seeded_streams=n.seeded_streams,
                fresh_attempts=n.fresh_attempts,
                simulated_peers=n.simulated_peers,
            )
            for n in group
        ]
        specs.append(HostSpec({"name": model.name, **model.params()}, ledger.path, owners))
    hosts = RayHosts(actors.actors[: len(specs)])
    hosts.build(specs)
    oracle = RayOracle(hosts, [d for block in hosts.described for d in block])
    return oracle, SimpleNamespace(close=hosts.release)


def wait_until_dead(actor, seconds: float = 60.0) -> None:
    """Block until ``actor`` no longer answers: ``ray.kill`` is asynchronous, and a call sent
    right after it was answered now and then under load (the test then saw no failure)."""
    import ray

    deadline = time.monotonic() + seconds
    while True:
        try:
            ray.get(actor.process.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        assert time.monotonic() < deadline, f"the actor still answers {seconds:g} s after ray.kill"
        time.sleep(0.2)
