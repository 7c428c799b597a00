"""A flooding client of a real owner (tests/test_owner_floods.py), run as its own process:

    python flood_client.py ADDRESS SESSION SECONDS

It reads the owner's policy (Describe), opens ``SESSION`` and, from ``--inflight`` threads on
one channel, sends the largest log-ratio request the owner admits (max_answers_per_request
chains, within the message size) at just above the smallest step it admits (min_step), each
at a fresh iteration so that every answer is new and stored, until SECONDS have passed. Prints
one JSON line: requests answered and refused, answers, the first refusal's message.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import grpc

from fedpenalty.proto import owner_pb2 as pb
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

#: chains that fit a 4 MiB message (each chain: ≤ 3 bytes of index, θ and θ′ as doubles)
MESSAGE_CHAINS = 150_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("session")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--inflight", type=int, default=4)
    args = parser.parse_args()
    with grpc.insecure_channel(args.address) as channel:
        stub = pb_grpc.OwnerStub(channel)
        policy = stub.Describe(pb.DescribeRequest(), timeout=30).owners[0].policy
        stub.OpenSession(
            pb.OpenSessionRequest(session=args.session, algorithm="penalty", planned_answers=1),
            timeout=30,
        )
        chains = min(policy.max_answers_per_request, MESSAGE_CHAINS)
        step = 1.5 * policy.min_step  # the smallest admitted step, with room for rounding
        template = pb.LogRatioRequest(
            session=args.session,
            chains=range(chains),
            theta=[0.1] * chains,
            theta_prop=[0.1 + step] * chains,
        ).SerializeToString()
        counts = {"chains": chains, "step": step, "answered": 0, "refused": 0, "answers": 0}
        lock = threading.Lock()
        iterations = iter(range(10**9))
        deadline = time.monotonic() + args.seconds

        def flood() -> None:
            while time.monotonic() < deadline:
                request = pb.LogRatioRequest.FromString(template)
                with lock:
                    request.iteration = next(iterations)
                try:
                    stub.LogRatio(request, timeout=60)
                    with lock:
                        counts["answered"] += 1
                        counts["answers"] += chains
                except grpc.RpcError as exc:
                    with lock:
                        counts["refused"] += 1
                        counts.setdefault("refusal", exc.details())

        threads = [threading.Thread(target=flood) for _ in range(args.inflight)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
