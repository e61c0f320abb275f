"""Every write of provisioning: approval, runs and their steps, the window's lifecycle, operator actions.

Order transitions go through booking.services.order_transition (with the operator as actor). A run holds a lease
while a worker executes it; steps already done are never redone, so a run interrupted anywhere resumes cleanly.
"""

import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from booking.models import Order, OrderEvent, OrderStatus, Vendor
from booking.rules import BookingError
from booking.services import order_transition
from booking.status_cache import bump_orders
from provisioning import steps
from provisioning.drivers import get_driver
from provisioning.drivers.base import DriverError, HostSpec
from provisioning.models import Access, Host, LifecycleNotice, OperatorSettings, ProvisioningRun, ProvisioningStep

logger = logging.getLogger(__name__)

WARNINGS = [("48h", timedelta(hours=48)), ("24h", timedelta(hours=24)), ("1h", timedelta(hours=1))]


class ProvisioningError(BookingError):
    pass


def username_for(order: Order) -> str:
    return "bn-" + order.public_id.removeprefix("BN-").lower()


def _operator(actor: AbstractBaseUser | None) -> dict:
    return {"actor_kind": OrderEvent.Actor.OPERATOR if actor else OrderEvent.Actor.SYSTEM, "actor": actor}


# --- approval ------------------------------------------------------------------------------------------------


@transaction.atomic
def order_approve(*, order: Order, actor: AbstractBaseUser | None, now: datetime | None = None) -> None:
    now = now or timezone.now()
    order_transition(order=order, to_status=OrderStatus.APPROVED, reason="approved", now=now, **_operator(actor))
    if order.starts_at - timedelta(hours=OperatorSettings.current().provision_lead_hours) <= now:
        provisioning_start(order=order, actor=actor)


@transaction.atomic
def order_reject(*, order: Order, actor: AbstractBaseUser, reason: str) -> None:
    from payments.models import Invoice

    reason = reason.strip()
    if not reason:
        raise ProvisioningError(_("Give the reason for rejecting this order."), field="reason")
    order_transition(order=order, to_status=OrderStatus.REJECTED, reason=f"rejected: {reason}", **_operator(actor))
    # Paid and rejected: a refund is owed.
    Invoice.objects.filter(order=order, status=Invoice.Status.SETTLED).update(needs_operator=True)


def order_paid_hook(*, order: Order) -> None:
    """After an order becomes paid: approve it at once when the operators chose auto-approval."""
    if OperatorSettings.current().auto_approve:
        order_approve(order=order, actor=None)


# --- runs ----------------------------------------------------------------------------------------------------


def _hosts_of(order: Order) -> list[tuple[Host, list[int]]]:
    by_host: dict[int, tuple[Host, list[int]]] = {}
    for allocation in order.allocations.filter(released_at__isnull=True).select_related("lot__host"):
        host = allocation.lot.host
        by_host.setdefault(host.pk, (host, []))[1].extend(allocation.lot.gpu_index_list)
    return [(host, sorted(indices)) for host, indices in by_host.values()]


@transaction.atomic
def _create_run(*, order: Order, kind: str, step_names: list[str], actor: AbstractBaseUser | None) -> ProvisioningRun:
    run = ProvisioningRun.objects.create(order=order, kind=kind, triggered_by=actor)
    position = 0
    for host, gpu_indices in _hosts_of(order) or [(access.host, []) for access in order.accesses.all()]:
        Access.objects.get_or_create(
            order=order,
            host=host,
            defaults={"username": username_for(order), "gpu_indices": ",".join(map(str, gpu_indices))},
        )
        for name in step_names:
            ProvisioningStep.objects.create(run=run, host=host, position=position, name=name)
            position += 1
    from provisioning.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(run.pk))
    return run


@transaction.atomic
def provisioning_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="provisioning started", **_operator(actor))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PROVISION, step_names=steps.PROVISION_STEPS, actor=actor)


def provisioning_retry(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    """Resume the last failed run where it stopped (steps done stay done)."""
    run = order.provisioning_runs.filter(status=ProvisioningRun.Status.FAILED).first()
    if run is None:
        raise ProvisioningError(_("There is no failed run to retry."))
    with transaction.atomic():
        if run.kind == ProvisioningRun.Kind.PROVISION:
            order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="retry", **_operator(actor))
        ProvisioningRun.objects.filter(pk=run.pk).update(
            status=ProvisioningRun.Status.QUEUED, error="", lease_until=None
        )
        from provisioning.tasks import execute_run

        transaction.on_commit(lambda: execute_run.delay(run.pk))
    return run


def preflight_rerun(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        raise ProvisioningError(_("The pre-flight check runs on machines that are ready."))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PREFLIGHT, step_names=steps.PREFLIGHT_STEPS, actor=actor)


def teardown_start(
    *, order: Order, actor: AbstractBaseUser | None = None, reason: str = "window ended"
) -> ProvisioningRun:
    if (
        order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN)
        .exclude(status=ProvisioningRun.Status.FAILED)
        .exists()
    ):
        raise ProvisioningError(_("The teardown of this order is already under way."))
    run = _create_run(order=order, kind=ProvisioningRun.Kind.TEARDOWN, step_names=steps.TEARDOWN_STEPS, actor=actor)
    OrderEvent.objects.create(
        order=order, from_status=order.status, to_status=order.status, reason=f"teardown: {reason}", **_operator(actor)
    )
    return run


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


def _context(order: Order, access: Access, host: Host) -> steps.StepContext:
    hardware = order.hardware_class
    return steps.StepContext(
        username=access.username,
        comment=f"Binome {order.public_id}",
        authorized_keys="".join(f"{key.public_key}\n" for key in order.ssh_keys.all()),
        gpu_indices=[int(index) for index in access.gpu_indices.split(",") if index],
        visible_devices_variable="ROCR_VISIBLE_DEVICES" if hardware.vendor == Vendor.AMD else "CUDA_VISIBLE_DEVICES",
        expect_arch=hardware.architecture,
        expect_vendor=hardware.vendor,
        image_ref=order.environment.image_ref,
        container_runtime=host.container_runtime,
        wipe_data=OperatorSettings.current().wipe_data_on_teardown,
    )


def _take_lease(run: ProvisioningRun, now: datetime) -> bool:
    lease = now + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS)
    taken = ProvisioningRun.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now),
        pk=run.pk,
        status__in=[ProvisioningRun.Status.QUEUED, ProvisioningRun.Status.RUNNING],
    ).update(lease_until=lease, status=ProvisioningRun.Status.RUNNING)
    if taken:
        ProvisioningRun.objects.filter(pk=run.pk, started_at__isnull=True).update(started_at=now)
    return bool(taken)


def run_execute(*, run: ProvisioningRun) -> str:
    """Execute the run's steps that are not done, host by host. Returns the run's status."""
    now = timezone.now()
    if not _take_lease(run, now):
        return "busy"
    run.refresh_from_db()
    order = Order.objects.select_related("hardware_class", "environment").get(pk=run.order_id)
    pending = list(run.steps.exclude(status=ProvisioningStep.Status.DONE).select_related("host"))
    failure = ""
    connections: dict[int, object] = {}
    try:
        for step in pending:
            access = Access.objects.select_related("host").get(order=order, host=step.host)
            ProvisioningRun.objects.filter(pk=run.pk).update(
                lease_until=timezone.now() + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS)
            )
            ProvisioningStep.objects.filter(pk=step.pk).update(
                status=ProvisioningStep.Status.RUNNING,
                attempts=step.attempts + 1,
                started_at=timezone.now(),
                error="",
            )
            try:
                if step.host_id not in connections:
                    driver = get_driver(step.host.driver)
                    connections[step.host_id] = driver.connect(_host_spec(step.host))
                output = steps.STEPS[step.name](connections[step.host_id], _context(order, access, step.host))
            except (DriverError, steps.StepFailed) as exc:
                failure = f"{step.name} on {step.host.name}: {getattr(exc, 'message', None) or exc}"
                ProvisioningStep.objects.filter(pk=step.pk).update(
                    status=ProvisioningStep.Status.FAILED, finished_at=timezone.now(), error=str(failure)[:5000]
                )
                break
            if step.name == "preflight":
                report = json.loads(output)
                Access.objects.filter(pk=access.pk).update(
                    preflight_report=report, preflight_status=report.get("summary", {}).get("status", "")
                )
                bump_orders(order.pk)
                output = f"pre-flight: {report.get('summary', {})}"
            ProvisioningStep.objects.filter(pk=step.pk).update(
                status=ProvisioningStep.Status.DONE, finished_at=timezone.now(), output=output[:20000]
            )
    finally:
        for connection in connections.values():
            connection.close()
    return _finish(run=run, order=order, failure=failure)


@transaction.atomic
def _finish(*, run: ProvisioningRun, order: Order, failure: str) -> str:
    now = timezone.now()
    status = ProvisioningRun.Status.FAILED if failure else ProvisioningRun.Status.SUCCEEDED
    ProvisioningRun.objects.filter(pk=run.pk).update(status=status, finished_at=now, error=failure, lease_until=None)
    order = Order.objects.select_for_update().get(pk=order.pk)
    if run.kind == ProvisioningRun.Kind.PROVISION:
        if failure:
            order_transition(
                order=order,
                to_status=OrderStatus.PROVISIONING_FAILED,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="provisioning failed",
                evidence={"error": failure[:500], "run": run.pk},
            )
        else:
            Access.objects.filter(order=order).update(status=Access.Status.READY, ready_at=now)
            bump_orders(order.pk)
            target = OrderStatus.ACTIVE if order.starts_at <= now else OrderStatus.READY
            order_transition(
                order=order,
                to_status=OrderStatus.READY,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="access ready",
                evidence={"run": run.pk},
            )
            if target == OrderStatus.ACTIVE:
                order_transition(
                    order=order,
                    to_status=OrderStatus.ACTIVE,
                    actor_kind=OrderEvent.Actor.SYSTEM,
                    reason="window started",
                )
            transaction.on_commit(lambda: _send_access_email(order.pk))
    elif run.kind == ProvisioningRun.Kind.TEARDOWN and not failure:
        Access.objects.filter(order=order).update(status=Access.Status.REVOKED, revoked_at=now)
        bump_orders(order.pk)
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
            order_transition(
                order=order, to_status=OrderStatus.ENDED, actor_kind=OrderEvent.Actor.SYSTEM, reason="access revoked"
            )
    return status


def _send_access_email(order_id: int) -> None:
    from provisioning.tasks import send_access_ready

    send_access_ready.delay(order_id)


def access_email_send(*, order: Order) -> None:
    with translation.override(order.language):
        subject = _("Your Binôme machines are ready: order %(number)s") % {"number": order.public_id}
        body = render_to_string(
            "provisioning/email/access_ready.txt",
            {"order": order, "accesses": list(order.accesses.select_related("host"))},
        )
    send_mail(subject, body, None, [order.contact_email])


# --- lifecycle -----------------------------------------------------------------------------------------------


def lifecycle_tick(*, now: datetime | None = None) -> dict[str, int]:
    """Beat: start provisioning in time, open and close windows, warn before the end, resume abandoned runs.
    Each part re-reads state and is safe to run twice at once."""
    now = now or timezone.now()
    counts = {"provisioned": 0, "activated": 0, "warned": 0, "torn_down": 0, "resumed": 0}
    lead = timedelta(hours=OperatorSettings.current().provision_lead_hours)
    for order in Order.objects.filter(status=OrderStatus.APPROVED, starts_at__lte=now + lead)[:50]:
        try:
            provisioning_start(order=order)
            counts["provisioned"] += 1
        except BookingError:
            continue
    for order in Order.objects.filter(status=OrderStatus.READY, starts_at__lte=now)[:200]:
        counts["activated"] += order_transition(
            order=order, to_status=OrderStatus.ACTIVE, actor_kind=OrderEvent.Actor.SYSTEM, reason="window started"
        )
    for order in Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], ends_at__gt=now)[:500]:
        left = order.ends_at - now
        due = [kind for kind, before in WARNINGS if left <= before]
        if due:  # only the most urgent one: a window provisioned late skips the warnings already past
            _notice, created = LifecycleNotice.objects.get_or_create(order=order, kind=due[-1])
            if created:
                from provisioning.tasks import send_end_warning

                send_end_warning.delay_on_commit(order.pk, due[-1])
                counts["warned"] += 1
    for order in Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], ends_at__lte=now)[:50]:
        try:
            teardown_start(order=order)
            counts["torn_down"] += 1
        except ProvisioningError:
            continue
    for run in ProvisioningRun.objects.filter(status=ProvisioningRun.Status.RUNNING, lease_until__lt=now)[:20]:
        from provisioning.tasks import execute_run

        execute_run.delay(run.pk)
        counts["resumed"] += 1
    return counts


def end_warning_send(*, order: Order, kind: str) -> None:
    with translation.override(order.language):
        subject = _("Your Binôme window ends in %(left)s: order %(number)s") % {
            "left": kind.replace("h", " h"),
            "number": order.public_id,
        }
        body = render_to_string("provisioning/email/end_warning.txt", {"order": order, "kind": kind})
    send_mail(subject, body, None, [order.contact_email])
