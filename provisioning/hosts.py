"""The fleet as the portal keeps it: how it reaches a host (its driver, the pinned host key, the admin account) and
the "check host" finding recorded on the host, by an operator or by the beat's re-check. The probe itself, the
commands and what their answers mean, is provisioning/host_probe.py.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from booking.models import EnvironmentImage, Order
from booking.services import order_note
from inventory.models import Host
from provisioning import enqueue, host_probe, ports, selectors
from provisioning.drivers import get_driver
from provisioning.drivers.base import Connection, DriverError, HostSpec
from provisioning.rules import ProvisioningError, acting

logger = logging.getLogger(__name__)


def host_connect(*, host: Host) -> Connection:
    """A connection to the host through its driver, as the portal logs in to it; DriverError when it cannot."""
    return get_driver(host.driver).connect(_host_spec(host))


def _host_spec(host: Host) -> HostSpec:
    return HostSpec(
        name=host.name,
        address=host.address,
        port=host.ssh_port,
        username=host.admin_user,
        host_key=host.host_key,
        client_key_path=settings.PROVISIONING_SSH_KEY_FILE,
        use_sudo=host.use_sudo,
    )


@dataclass(frozen=True)
class HostCheck:
    finding: host_probe.Finding
    orders_left_unisolated: list[Order]  # booked orders on a host that just stopped being isolated


def host_check(
    *, host: Host, actor: AbstractBaseUser | None = None, device_dir: str = "", now: datetime | None = None
) -> HostCheck:
    """Probe the host through its driver and record its isolation mode. A host found not isolated stops offering
    its lots; orders already booked on it are not cancelled but noted for an operator. A host that cannot be
    reached keeps its last finding (ProvisioningError): unreachable is not evidence either way."""
    lots = list(host.lots.select_related("hardware_class").order_by("name"))
    devices = [
        host_probe.LotDevices(
            name=lot.name,
            vendor=lot.hardware_class.vendor,
            gpu_indices=tuple(lot.gpu_index_list),
            active=lot.status == lot.Status.ACTIVE,
        )
        for lot in lots
    ]
    try:
        with host_connect(host=host) as connection:
            finding = host_probe.probe(
                connection,
                lots=devices,
                runtime=host.container_runtime,
                device_dir=device_dir or settings.PROVISIONING_DEVICE_DIR,
                images=list(
                    EnvironmentImage.objects.filter(
                        is_active=True, hardware_classes__in={lot.hardware_class_id for lot in lots}
                    )
                    .values_list("image_ref", flat=True)
                    .distinct()
                ),
                customer_ports=ports.customer_ports(host.ssh_port_base, selectors.host_port_span(host)),
            )
    except DriverError as exc:
        raise ProvisioningError(
            _("Could not check %(host)s: %(error)s") % {"host": host.name, "error": exc.message}
        ) from exc
    now = now or timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        was_offering = host.offers_lots
        host.isolation_mode = finding.mode
        host.isolation_checked_at = now
        host.isolation_report = finding.report
        host.exclusive_lot = next((lot for lot in lots if lot.name == finding.exclusive_lot), None)
        host.save(update_fields=["isolation_mode", "isolation_checked_at", "isolation_report", "exclusive_lot"])
        host.refresh_from_db(fields=["offers_lots"])
        left = []
        if was_offering and not host.offers_lots:
            left = list(selectors.orders_booked_on(host=host))
            for order in left:
                order_note(
                    order=order,
                    reason=f"host {host.name} found not isolated: the order is kept; reassign its lots or restore "
                    "isolation before its window",
                    evidence={"host": host.name, "isolation_report": finding.report[:2000]},
                    **acting(actor),
                )
    logger.info("host %s checked: %s", host.name, finding.mode)
    return HostCheck(finding=finding, orders_left_unisolated=left)


# A check asked this long ago and still queued or running was lost with its worker: it may be asked again.
CHECK_STALE_AFTER = timedelta(minutes=10)


def host_check_request(*, host: Host, actor: AbstractBaseUser | None = None, now: datetime | None = None) -> bool:
    """Queue "check host" on the provisioning queue, whose worker holds the SSH key (the web process has none and
    must not wait on SSH): the host's `check_state` says where it stands, for the console. False, and nothing
    queued, when a check of the host is already queued or running (parallel clicks: one check)."""
    now = now or timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        in_flight = host.check_state in (Host.CheckState.QUEUED, Host.CheckState.RUNNING)
        if in_flight and host.check_requested_at and host.check_requested_at > now - CHECK_STALE_AFTER:
            return False
        host.check_state, host.check_requested_at, host.check_error = Host.CheckState.QUEUED, now, ""
        host.save(update_fields=["check_state", "check_requested_at", "check_error"])
        actor_id = actor.pk if actor is not None and actor.is_authenticated else None
        transaction.on_commit(lambda: _queue_check(host_id=host.pk, actor_id=actor_id))
    return True


def _queue_check(*, host_id: int, actor_id: int | None) -> None:
    try:
        enqueue.check_host_now(host_id, actor_id)
    except Exception as exc:  # kombu and redis raise many types; any of them means "not queued"
        logger.warning("the check of host %s could not be queued: %s", host_id, exc)
        Host.objects.filter(pk=host_id, check_state=Host.CheckState.QUEUED).update(
            check_state=Host.CheckState.FAILED, check_error=_("The task queue could not be reached: try again.")
        )


def host_check_run(*, host_id: int, actor_id: int | None = None) -> str:
    """The worker's side of "check host": run it and record where it stands. Returns the mode found, "failed" or
    "unknown" (no such host)."""
    from django.contrib.auth import get_user_model

    host = Host.objects.filter(pk=host_id).first()
    if host is None:
        return "unknown"
    Host.objects.filter(pk=host_id).update(check_state=Host.CheckState.RUNNING)
    actor = get_user_model().objects.filter(pk=actor_id, is_active=True).first() if actor_id else None
    try:
        check = host_check(host=host, actor=actor)
    except ProvisioningError as exc:
        error = exc.message
    except Exception as exc:  # an unknown failure is this check's, recorded for the operator; the worker goes on
        logger.exception("host %s: the check failed", host.name)
        error = _("The check failed unexpectedly (%(error)s): see the worker's log.") % {"error": type(exc).__name__}
    else:
        Host.objects.filter(pk=host_id).update(check_state=Host.CheckState.DONE, check_error="")
        return check.finding.mode
    Host.objects.filter(pk=host_id).update(check_state=Host.CheckState.FAILED, check_error=error[:2000])
    return "failed"


HOST_CHECK_INTERVAL = timedelta(hours=6)


def hosts_check_due(*, now: datetime | None = None, limit: int = 10) -> dict[str, int]:
    """The beat's re-check of the fleet, so that a host's mode follows it without an operator: active SSH hosts
    never checked or last checked more than HOST_CHECK_INTERVAL ago, oldest first, a capped batch. Safe to run
    twice at once (the finding is written under the host's row lock). A host that cannot be reached keeps its
    finding and is only logged."""
    now = now or timezone.now()
    due = (
        Host.objects.filter(is_active=True, driver=Host.Driver.SSH)
        .filter(Q(isolation_checked_at__isnull=True) | Q(isolation_checked_at__lt=now - HOST_CHECK_INTERVAL))
        .order_by(F("isolation_checked_at").asc(nulls_first=True), "name")[:limit]
    )
    counts = {"checked": 0, "unreachable": 0}
    for host in due:
        try:
            host_check(host=host, now=now)
        except ProvisioningError as exc:
            logger.warning("host %s not checked: %s", host.name, exc.message)
            counts["unreachable"] += 1
        else:
            counts["checked"] += 1
    return counts
