"""Stopping long runs cleanly: SIGTERM handled like Ctrl-C.

A scheduler's preemption, ``kill`` or a run started in the background by a non-interactive
shell (which starts it with SIGINT ignored, so Ctrl-C never arrives) all stop a process with
SIGTERM. Inside :func:`terminate_as_interrupt` that raises ``KeyboardInterrupt``, so the code
that saves a final checkpoint or a partial result on Ctrl-C runs for it too.

Python runs a signal handler wherever the main thread happens to be. When that is a
``__del__`` method or a callback from native code (llvmlite frees its objects in ``__del__``),
the ``KeyboardInterrupt`` is printed ("Exception ignored in ...") and lost, and the run would
go on to its full budget. The handler therefore also records the request, and long loops call
:func:`check_interrupt` at their safe points, which raises it again.
"""

from __future__ import annotations

import contextlib
import signal
import threading

# Set by the handler, cleared when a terminate_as_interrupt block starts and ends: the
# process's signal state, which is process-wide by nature.
_stop_requested = threading.Event()


def _raise_interrupt(signum, frame) -> None:
    _stop_requested.set()
    raise KeyboardInterrupt


def check_interrupt() -> None:
    """Raise ``KeyboardInterrupt`` if a stop signal arrived in the current
    :func:`terminate_as_interrupt` block (even one whose first ``KeyboardInterrupt`` was lost)."""
    if _stop_requested.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block, SIGTERM (and Ctrl-C, unless SIGINT is ignored) raises
    KeyboardInterrupt and is remembered for :func:`check_interrupt` (main thread only;
    elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stop_requested.clear()
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        _stop_requested.clear()
