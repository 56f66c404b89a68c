import math
import os
import signal

import pytest

from looprl import search
from looprl.interrupts import check_interrupt, terminate_as_interrupt


class _SignalsInDel:
    """Sends SIGTERM from inside ``__del__``: Python runs the handler there, prints its
    KeyboardInterrupt as "Exception ignored" and drops it, as when a signal lands while
    llvmlite frees an object."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecode boundaries, where the handler runs
            pass


# The dropped KeyboardInterrupt is what these tests are about; pytest reports it as a warning.
lost_interrupt = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _lose_a_sigterm():
    thing = _SignalsInDel()
    del thing


@lost_interrupt
def test_a_sigterm_whose_interrupt_was_lost_still_stops_a_search():
    with terminate_as_interrupt():
        _lose_a_sigterm()  # no exception reaches here
        result = search.run("24x16x8", "random", budget_s=math.inf, max_evaluations=200, cache=":memory:", verify_s=None)
    assert result.stopped == "interrupted"
    assert result.evaluations < 200


@lost_interrupt
def test_check_interrupt_raises_only_inside_the_block_that_got_the_signal():
    with terminate_as_interrupt():
        check_interrupt()  # nothing arrived yet
        _lose_a_sigterm()
        with pytest.raises(KeyboardInterrupt):
            check_interrupt()
    check_interrupt()  # the request ended with its block
    with terminate_as_interrupt():
        check_interrupt()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_raise_keyboard_interrupt_inside_the_block_and_the_handlers_are_restored(signum):
    """Ctrl-C (SIGINT, with Python's own handler, as in a terminal) takes SIGTERM's way: the same
    handler, so what tests/cli/ checks of a training run stopped by SIGTERM (a final checkpoint,
    exit status 130) holds for Ctrl-C too."""
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a command line starts
    try:
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            with terminate_as_interrupt():
                assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM)
                os.kill(os.getpid(), signum)
                for _ in range(1000):
                    pass
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        signal.signal(signal.SIGINT, previous_int)


def test_an_ignored_ctrl_c_stays_ignored():
    """A run started in the background by a non-interactive shell has SIGINT ignored: left so."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
