"""A device's connection: :func:`open_connection` picks the local or the SSH one for a device.

The interface (:class:`Connection`, :class:`RunResult`) is in `devices.connection_base`, the implementations in
`devices.connection_local` and `devices.connection_ssh`; this module sits above all three (they never import it),
and is where the rest of the project imports them from.
"""

from __future__ import annotations

from edgemask.devices.connection_base import Connection, RunResult
from edgemask.devices.connection_local import LocalConnection
from edgemask.devices.inventory import DeviceSpec

__all__ = ["Connection", "LocalConnection", "RunResult", "open_connection"]


def open_connection(spec: DeviceSpec, **options: float) -> Connection:
    """The connection for ``spec``: local, or SSH (options: retries, backoff_s, keepalive_s)."""
    if spec.is_local:
        return LocalConnection(spec)
    from edgemask.devices.connection_ssh import SSHConnection  # the only module that imports paramiko

    return SSHConnection(spec, **options)
