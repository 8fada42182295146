"""SIGTERM taken as Ctrl-C (``common.processes.terminate_as_interrupt``): a terminated command
runs its ``finally`` blocks and exits as interrupted, also when the interrupt lands inside code
that swallows it or turns it into an error of its own (a C library's callback: librdkafka's
logger, a delivery report)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from common.processes import terminate_as_interrupt, uninterrupted


def _terminate_me() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_raises_keyboard_interrupt_and_the_finally_blocks_run() -> None:
    cleaned = []
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            _terminate_me()
            pytest.fail("SIGTERM did not interrupt")
        finally:
            cleaned.append(True)
    assert cleaned == [True]


def test_an_interrupt_turned_into_another_error_still_ends_as_an_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt) as raised, terminate_as_interrupt():
        try:
            _terminate_me()
        except KeyboardInterrupt:
            raise SystemError("returned a result with an exception set") from None
    assert isinstance(raised.value.__cause__, SystemError)


def test_an_interrupt_swallowed_inside_still_ends_the_block_as_an_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt(), contextlib.suppress(KeyboardInterrupt):
        _terminate_me()


def test_without_a_signal_errors_pass_unchanged_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError), terminate_as_interrupt():
        raise ValueError("a plain failure")
    with terminate_as_interrupt():
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_while_a_process_starts_waits_for_its_handle() -> None:
    started = []
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        with uninterrupted():
            _terminate_me()
            started.append("the handle")  # reached: the interrupt waits for the end of the block
        pytest.fail("the interrupt did not come at the end of the block")
    assert started == ["the handle"]


def test_a_termination_is_over_with_its_block() -> None:
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        _terminate_me()
    with uninterrupted():  # later code, outside any terminated block, starts processes undisturbed
        pass
