"""The health of each host with running windows, checked by beat through the host's driver: SSH reachable, the
lots' GPUs answer the vendor's tool, the disks keep enough free space. The finding is recorded on the host; the
operators are alerted when a host turns to failing, once per failure (not at every run while it stays failing).

The answers are input like any other (bounded, parsed field by field): a GPU counts as present only when the
vendor's tool lists its index; a disk only when df's line parses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from booking import notices
from booking.models import OrderStatus
from inventory.models import HealthStatus, Host
from provisioning.drivers.base import Connection, DriverError
from provisioning.hosts import host_connect
from provisioning.models import Access
from provisioning.readings import SAMPLE_TIMEOUT_S, gpu_tool_command
from provisioning.step_context import VOLUME_ROOT

logger = logging.getLogger(__name__)

HOSTS_PER_SWEEP = 50
MAX_DF_LINES = 20
# The file systems whose free space matters: the customers' data volumes (when the host has them) and the root.
DISK_PATHS = (VOLUME_ROOT, "/")


@dataclass
class Health:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return HealthStatus.FAILING if self.problems else HealthStatus.OK

    @property
    def report(self) -> str:
        return "\n".join([*(f"FAIL {line}" for line in self.problems), *(f"ok {line}" for line in self.notes)])


def _check_gpus(connection: Connection, *, expected: dict[str, set[int]], health: Health) -> None:
    for vendor, indices in sorted(expected.items()):
        argv, parse = gpu_tool_command(vendor)
        result = connection.run(argv, timeout=SAMPLE_TIMEOUT_S, check=False)
        found = set(parse(result.stdout)) if result.exit_status == 0 else set()
        missing = sorted(indices - found)
        if result.exit_status != 0:
            health.problems.append(f"{argv[0]} exited {result.exit_status}: GPUs {sorted(indices)} not seen")
        elif missing:
            health.problems.append(f"GPUs missing from {argv[0]}: {missing} (found {sorted(found)})")
        else:
            health.notes.append(f"GPUs {sorted(indices)} answer {argv[0]}")


def _check_disks(connection: Connection, *, health: Health) -> None:
    minimum_gib = settings.HOST_HEALTH_MIN_FREE_GIB
    result = connection.run(["df", "-P", "-k", "--", *DISK_PATHS], timeout=SAMPLE_TIMEOUT_S, check=False)
    seen = set()
    for line in result.stdout.splitlines()[1:MAX_DF_LINES]:
        fields = line.split()
        if len(fields) < 6 or not fields[3].isdigit() or fields[5] in seen:
            continue
        seen.add(fields[5])
        free_gib = int(fields[3]) / (1024 * 1024)
        if free_gib < minimum_gib:
            health.problems.append(f"disk {fields[5]}: {free_gib:.1f} GiB free, under {minimum_gib} GiB")
        else:
            health.notes.append(f"disk {fields[5]}: {free_gib:.1f} GiB free")
    if not seen:
        health.problems.append(f"df answered nothing readable (exit {result.exit_status})")


def host_health_probe(*, host: Host, expected: dict[str, set[int]]) -> Health:
    """Ask the host through its driver; an SSH failure is a finding, not an error."""
    health = Health()
    try:
        with host_connect(host=host) as connection:
            if connection.is_dry_run:
                health.notes.append("dry run: nothing was probed")
                return health
            health.notes.append("SSH reachable")
            _check_gpus(connection, expected=expected, health=health)
            _check_disks(connection, health=health)
    except DriverError as exc:
        health.problems.append(f"SSH unreachable: {exc.message}")
    return health


def host_health_record(*, host: Host, health: Health, now: datetime) -> bool:
    """Record the finding on the host; alert the operators when it turns to failing. Under the host's row lock, so
    two sweeps at once alert once. Returns whether an alert was sent."""
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        turned_failing = health.status == HealthStatus.FAILING and locked.health_status != HealthStatus.FAILING
        # an update, not save(): a health finding changes nothing that can be booked
        Host.objects.filter(pk=host.pk).update(
            health_status=health.status, health_checked_at=now, health_report=health.report[:10_000]
        )
        if turned_failing:
            transaction.on_commit(
                lambda: notices.send(notices.Notice.HOST_FAILING, host_name=host.name, problems=health.problems)
            )
    if health.status == HealthStatus.FAILING:
        logger.warning("host %s failing its health check: %s", host.name, "; ".join(health.problems))
    return turned_failing


def hosts_health_check(*, now: datetime | None = None) -> dict[str, int]:
    """Beat's health sweep: every host with a ready or active window (a capped batch), once each."""
    now = now or timezone.now()
    running = (
        Access.objects.filter(status=Access.Status.READY, order__status__in=[OrderStatus.READY, OrderStatus.ACTIVE])
        .select_related("order__hardware_class")
        .order_by("host_id")
    )
    by_host: dict[int, dict[str, set[int]]] = {}
    for access in running[: HOSTS_PER_SWEEP * 16]:
        expected = by_host.setdefault(access.host_id, {})
        expected.setdefault(access.order.hardware_class.vendor, set()).update(access.gpu_index_list)
    counts = {"ok": 0, "failing": 0, "alerted": 0}
    for host in Host.objects.filter(pk__in=list(by_host)[:HOSTS_PER_SWEEP]).order_by("name"):
        health = host_health_probe(host=host, expected=by_host[host.pk])
        counts["alerted"] += host_health_record(host=host, health=health, now=now)
        counts["ok" if health.status == HealthStatus.OK else "failing"] += 1
    return counts
