"""Counting the secure sessions a client asks owner keys for (docs/design.md §2.6, "Commit,
then reveal"; OWNER.toml ``server.secure_sessions_per_day``).

Every new session id a coordinator asks ``SessionKeys`` or ``RevealShares`` for gives it a fresh
masking graph; were tries free, it could open and abandon sessions until one graph cuts the
honest owners (G tries find one with probability ≤ G·p). An owner server therefore admits at
most ``limit`` new sessions per client identity in any ``window`` seconds: past it, a request for
another session is refused before any key is derived or anything is written. Asking again for a
session already admitted (a retry, the reveal after the keys, a resume) costs nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ..errors import NotPermitted

#: OWNER.toml ``server.secure_sessions_per_day`` unless set.
DEFAULT_SESSIONS_PER_DAY = 100
DAY_SECONDS = 86_400.0


class KeyRequests:
    """Per client identity (None: clients without one, counted together), the sessions admitted
    in the last ``window`` seconds (at most ``limit``, oldest first); ``clock`` in seconds."""

    def __init__(
        self,
        limit: int = DEFAULT_SESSIONS_PER_DAY,
        window: float = DAY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit, self.window, self._clock = limit, window, clock
        self._admitted: dict[str | None, OrderedDict[str, float]] = {}

    def admit(self, client: str | None, session: str) -> None:
        """Count ``session`` for ``client`` (once in a window); ``NotPermitted``, naming the key to
        change, when ``client`` already has ``limit`` other sessions in the window."""
        now = self._clock()
        admitted = self._admitted.setdefault(client, OrderedDict())
        while admitted and next(iter(admitted.values())) <= now - self.window:
            admitted.popitem(last=False)
        if session in admitted:
            return
        if len(admitted) >= self.limit:
            raise NotPermitted(
                f"this owner already gave secure-aggregation keys for {self.limit} sessions to "
                f"this client in the last {self.window / 3600:g} hours (server."
                "secure_sessions_per_day): each new session is a new try at a masking graph "
                "(docs/design.md §2.6); retry later or resume an admitted session"
            )
        admitted[session] = now
