"""Progress bars: tqdm without its monitor thread.

tqdm's monitor thread wakes every 10 s to refresh stalled bars; a Ctrl-C that lands while it
waits on tqdm's lock can leave the closing bar joining that thread forever (tqdm issues #469,
#1751; the maintainers' advice is ``monitor_interval = 0``). Our bars refresh themselves, so
they go without it.
"""

from __future__ import annotations

from tqdm.auto import tqdm


class ProgressBar(tqdm):
    """``tqdm`` with no monitor thread (the same arguments)."""

    monitor_interval = 0
