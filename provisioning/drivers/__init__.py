"""Provisioning drivers. SSH libraries are imported here and nowhere else in the portal."""

from __future__ import annotations

from .base import CommandFailed, CommandResult, Connection, Driver, DriverError, HostSpec

__all__ = ["CommandFailed", "CommandResult", "Connection", "Driver", "DriverError", "HostSpec", "get_driver"]


def get_driver(name: str) -> Driver:
    """The driver called `name`: "ssh" (the real one) or "dry_run" (records, touches nothing)."""
    if name == "ssh":
        from .ssh import SSHDriver  # paramiko is only imported when the real driver is asked for

        return SSHDriver()
    if name == "dry_run":
        from .dry_run import DryRunDriver

        return DryRunDriver()
    raise ValueError(f"unknown provisioning driver {name!r} (expected 'ssh' or 'dry_run')")
