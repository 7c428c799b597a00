"""Owner side: the ledger, one owner's record (``OwnerNode``) and the answer path
(``OwnerHost``), the gRPC server and OWNER.toml. Imports nothing from ``coordinator``."""

from .host import OwnerHost
from .ledger import Ledger
from .node import OwnerNode
from .session_request import SessionRequest

__all__ = ["Ledger", "OwnerHost", "OwnerNode", "SessionRequest"]
