"""Stopping long runs cleanly: SIGTERM handled like Ctrl-C.

A scheduler's preemption, ``kill`` or a run started in the background by a non-interactive
shell (which starts it with SIGINT ignored, so Ctrl-C never arrives) all stop a process with
SIGTERM. Inside :func:`terminate_as_interrupt` that raises ``KeyboardInterrupt``, so the code
that saves a final checkpoint or a partial result on Ctrl-C runs for it too.
"""

from __future__ import annotations

import contextlib
import signal
import threading


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block, SIGTERM raises KeyboardInterrupt (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
