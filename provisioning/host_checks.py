""" "Check host": how a host keeps one lot's customer away from another's, found by probing it through its driver.

The modes (docs/operations.md), in the order they are tried:
- container: the host's container runtime setting names a runtime that answers `info`; each order gets its own
  container with only its lot's GPUs inside (provisioning.steps). A runtime found on a host whose setting is empty is
  reported, not counted: that host's orders would run in accounts, not containers.
- exclusive: no runtime, and the host has exactly one active lot: there is no other customer to keep out. Only that
  lot is offered until the host is checked again.
- device permissions: no runtime, several lots, and every lot's GPU device nodes exist and are not world-accessible,
  so the per-user ACLs that provisioning adds are what lets a customer open their cards and no others.
- not isolated: anything else; the host's lots are not offered.
The dry-run driver runs nothing: its hosts are labelled "dry run", never reported as isolated.

This module only runs commands and reads their answers (hostile input: parsed and bounded); recording what it
found is provisioning.services.host_check's job.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from provisioning.drivers.base import Connection
from provisioning.models import Isolation

PROBE_TIMEOUT_S = 60
MAX_REPORT_LINES = 60
_CHARACTER_DEVICE = "character special file"


@dataclass(frozen=True)
class LotDevices:
    name: str
    vendor: str  # "nvidia" or "amd"
    gpu_indices: tuple[int, ...]
    active: bool = True


@dataclass(frozen=True)
class Finding:
    mode: str  # an Isolation value
    report: str  # one finding per line, for operators
    exclusive_lot: str = ""  # the lot's name, in the exclusive mode


def device_paths(lot: LotDevices, device_dir: str = "/dev") -> list[str]:
    """The device nodes that give access to the lot's cards (the shared control nodes, /dev/nvidiactl or
    /dev/kfd, open no card by themselves)."""
    if lot.vendor == "amd":
        return [posixpath.join(device_dir, "dri", f"renderD{128 + index}") for index in lot.gpu_indices]
    return [posixpath.join(device_dir, f"nvidia{index}") for index in lot.gpu_indices]


def probe(connection: Connection, *, lots: list[LotDevices], runtime: str = "", device_dir: str = "/dev") -> Finding:
    """Find the host's isolation mode. `runtime`: the host's container runtime setting ("" tries podman, then
    docker); `device_dir`: where the GPU device nodes are (tests point it at mknod stand-ins)."""
    if connection.is_dry_run:
        return Finding(
            Isolation.DRY_RUN,
            "dry-run driver: nothing runs on this host, so nothing was probed; its lots are offered for the demo only",
        )
    lines = []
    runtime_found = _answering_runtime(connection, runtime, lines)
    devices_protected = _devices_protected(connection, lots, device_dir, lines)
    active = [lot for lot in lots if lot.active]
    if runtime_found:
        lines.insert(0, f"mode: container ({runtime_found} answers; one container per order)")
        return Finding(Isolation.CONTAINER, _report(lines))
    if len(active) == 1:
        lines.insert(0, f"mode: exclusive (no container runtime; one active lot: {active[0].name})")
        return Finding(Isolation.EXCLUSIVE, _report(lines), exclusive_lot=active[0].name)
    if devices_protected and active:
        lines.insert(0, f"mode: device permissions (no container runtime; {len(active)} active lots)")
        return Finding(Isolation.DEVICE_PERMISSIONS, _report(lines))
    reason = "no active lot on this host" if not active else "GPU device nodes are missing or world-accessible"
    lines.insert(0, f"mode: not isolated (no container runtime; {len(active)} active lots; {reason})")
    lines.append(
        "to offer its lots: install podman (or docker) on the host, or remove world access to the GPU device "
        "nodes (chmod o-rw), or keep one active lot on it; then check the host again"
    )
    return Finding(Isolation.NOT_ISOLATED, _report(lines))


def _answering_runtime(connection: Connection, runtime: str, lines: list[str]) -> str:
    """The host's runtime when its `info` succeeds ("" if none): a docker client without its daemon does not count.
    With no runtime set, podman and docker are looked for only to tell the operator to set one."""
    for candidate in [runtime] if runtime else ["podman", "docker"]:
        result = connection.run([candidate, "info"], check=False, timeout=PROBE_TIMEOUT_S)
        if result.ok and runtime:
            lines.append(f"{candidate} info: ok")
            return candidate
        if result.ok:
            lines.append(
                f"{candidate} answers, but the host's container runtime is not set: orders run in accounts on the "
                f"host; set it to {candidate} to run each order in a container"
            )
            return ""
        detail = _first_line(result.stderr) or f"exit status {result.exit_status}"
        lines.append(f"{candidate} info: no answer ({detail})")
    return ""


def _devices_protected(connection: Connection, lots: list[LotDevices], device_dir: str, lines: list[str]) -> bool:
    """Whether every lot's device nodes exist as character devices with no access for others."""
    paths = [path for lot in lots for path in device_paths(lot, device_dir)]
    if not paths:
        lines.append("GPU device nodes: none to check (no lot on this host)")
        return False
    # stat prints what exists and fails for the rest; the name is last, so a "|" in it cannot shift the fields.
    result = connection.run(["stat", "-c", "%F|%a|%U|%G|%n", "--", *paths], check=False, timeout=PROBE_TIMEOUT_S)
    seen = {}
    for line in result.stdout.splitlines()[: len(paths)]:
        fields = line.split("|", 4)
        if len(fields) == 5:
            seen[fields[4]] = fields
    protected = True
    for path in paths:
        fields = seen.get(path)
        if fields is None:
            lines.append(f"{path}: missing")
            protected = False
            continue
        kind, mode_text, owner, group, _name = fields
        try:
            mode = int(mode_text, 8)
        except ValueError:
            mode = 0o7777  # unreadable answer: treat as open
        if kind != _CHARACTER_DEVICE:
            lines.append(f"{path}: not a character device ({kind[:40]})")
            protected = False
        elif mode & 0o007:
            lines.append(f"{path}: world-accessible (mode {mode:04o}, {owner[:32]}:{group[:32]})")
            protected = False
        else:
            lines.append(f"{path}: not world-accessible (mode {mode:04o}, {owner[:32]}:{group[:32]})")
    return protected


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _report(lines: list[str]) -> str:
    if len(lines) > MAX_REPORT_LINES:
        lines = [*lines[: MAX_REPORT_LINES - 1], f"… {len(lines) - MAX_REPORT_LINES + 1} more lines"]
    return "\n".join(lines)
