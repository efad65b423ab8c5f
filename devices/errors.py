"""Errors of the devices stage."""

from __future__ import annotations

from edgemask.errors import EdgemaskError


class DeviceError(EdgemaskError):
    """A device cannot be reached or did not answer: the message names the host and what to do.

    The profiling stage retries jobs that fail with this error; a model that fails on a healthy device is a
    ``Measurement(ok=False)`` instead.
    """


class HostKeyError(DeviceError):
    """The host key is unknown or changed. Never retried: a person must decide to trust the key."""


class RunTimeout(DeviceError):
    """A command on the device ran past its time limit."""


class RunInterrupted(DeviceError):
    """A command on the device was cut short on purpose (Ctrl-C on the host): not a result, not a link fault."""


class BoardBusy(EdgemaskError):
    """Another campaign holds the board (its lock in the device's workdir): the message names the holder (host,
    pid, campaign, since) and how to wait for it. Not a link fault: never retried, never a job's failure."""
