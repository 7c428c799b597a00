"""Errors shared by owners, transports and the coordinator.

Each owner-side error maps to one gRPC status code (see ``grpc_code``) so that every transport
reports a refusal the same way.
"""

from __future__ import annotations


class FedPenaltyError(Exception):
    """Base class of every error fedpenalty raises on purpose."""


class ConfigError(FedPenaltyError, ValueError):
    """A scenario, owner file or command-line value is malformed; the message names it."""


class DataError(FedPenaltyError, ValueError):
    """A data file or record array cannot be used with the model."""


class Interrupted(FedPenaltyError):
    """The user interrupted a run (Ctrl-C, SIGINT): it stops like a refused run, resumable."""


class OutputFailed(FedPenaltyError):
    """A file of the run could not be written (disk full, read-only, a path under a file); the
    message says which, and what to do. ``kept``: the run directory was kept because the owners
    were charged for what it sampled, and ``--resume`` continues it."""

    def __init__(self, message: str, kept: bool = False):
        super().__init__(message)
        self.kept = kept


class OwnerError(FedPenaltyError):
    """An owner refused a request. ``grpc_code`` is the status name a server reports."""

    grpc_code = "INTERNAL"

    def __init__(self, message: str, owner: str | None = None):
        super().__init__(message if owner is None else f"owner {owner!r}: {message}")
        self.owner = owner


class InvalidRequest(OwnerError):
    """Malformed or out-of-policy request (shape, NaN/inf, θ outside Θ, step too large, ...)."""

    grpc_code = "INVALID_ARGUMENT"


class UnknownSession(OwnerError):
    """The request names a session the owner never opened (or has closed)."""

    grpc_code = "NOT_FOUND"


class ReplayConflict(OwnerError):
    """A different query at an already answered (session, chain, iteration)."""

    grpc_code = "FAILED_PRECONDITION"


class BudgetExhausted(OwnerError):
    """Answering would take the owner past its privacy budget; nothing was charged."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, owner: str | None = None, epsilon_left: float = 0.0):
        super().__init__(message, owner)
        self.epsilon_left = epsilon_left


class NotPermitted(OwnerError):
    """The client may not make this request: its certificate is not in the owner's
    ``server.allowed_clients``, or the session belongs to another client."""

    grpc_code = "PERMISSION_DENIED"


class OwnerUnavailable(OwnerError):
    """The owner cannot be reached (transport failure after retries)."""

    grpc_code = "UNAVAILABLE"


class StorageUnavailable(OwnerUnavailable):
    """The owner's ledger cannot be written (disk full, read-only, I/O error); the request was
    neither answered nor charged, and may be retried once the storage is back."""


class AggregationFailed(OwnerError):
    """The owners' masked answers of a secure session do not sum to a decodable total: an owner
    did not answer (dropout), or owners were shown different peers or terms. Nothing was
    decoded; the run stops and may be resumed (docs/design.md §2.6)."""

    grpc_code = "ABORTED"


class LedgerInUse(FedPenaltyError):
    """Another process (or another ``Ledger`` in this one) already serves this ledger file."""
