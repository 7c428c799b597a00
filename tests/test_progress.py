"""The progress bar starts no tqdm monitor thread (a Ctrl-C while that thread waits on tqdm's
lock can leave the closing bar joining it forever; fedpenalty/progress.py)."""

from __future__ import annotations

import threading

from fedpenalty.progress import ProgressBar


def test_a_shown_bar_starts_no_monitor_thread():
    before = {t.ident for t in threading.enumerate()}
    with ProgressBar(total=10, disable=False, mininterval=0) as bar:
        bar.update(5)
        started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert started == []  # (a plain tqdm elsewhere in the process may have its own monitor)
