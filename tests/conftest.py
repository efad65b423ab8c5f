"""Suite-wide: Ctrl-C reaches the commands the tests start as a terminal delivers it.

A shell starts a background job (``bash .ci/run &`` in a script) with SIGINT ignored, and every process the suite
starts inherits that: the tests that press Ctrl-C on a running campaign (``tests/profiling/test_interrupt_and_lock.py``)
would see it ignored and the campaign run to its end. Python's own handler, installed here, becomes the default
action again in a child at exec, as in a terminal's foreground job."""

import signal


def pytest_configure(config):
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
