"""Owner side: policy, ledger and the transport-independent owner node."""

from .ledger import Ledger
from .node import OwnerDescription, OwnerNode, PrivacyReport, SpendReport
from .policy import ALGORITHMS, LOG_RATIO, SUFF_STATS, Policy

__all__ = ["ALGORITHMS", "LOG_RATIO", "SUFF_STATS", "Ledger", "OwnerDescription", "OwnerNode", "Policy",
           "PrivacyReport", "SpendReport"]
