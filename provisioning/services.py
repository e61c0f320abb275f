"""Every write of provisioning: approval, runs and their steps, the window's lifecycle, operator actions.

Order transitions go through booking.services.order_transition (with the operator as actor). A run holds a lease
while a worker executes it, and one run at a time works on an order; steps already done are never redone, so a
run interrupted anywhere resumes cleanly. Provisioning reacts to the order's transitions it does not make itself
(`on_order_status_changed`, connected in provisioning/apps.py): auto-approval once paid, teardown once released.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import notices
from booking.locks import lock_order
from booking.models import RELEASING_STATUSES, Lot, Order, OrderEvent, OrderStatus
from booking.notices import Notice
from booking.rules import BookingError
from booking.services import order_note, order_reassign_lot, order_transition
from provisioning import selectors, steps
from provisioning.drivers.base import DriverError
from provisioning.hosts import host_connect
from provisioning.models import (
    RETRIED_RUN_KINDS,
    Access,
    Host,
    LifecycleNotice,
    OperatorSettings,
    ProvisioningRun,
    ProvisioningStep,
)
from provisioning.rules import (
    HANDING_OVER,
    UNDER_WAY,
    ProvisioningError,
    acting,
    awaits_preflight_decision,
    retry_delay,
    username_for,
)
from provisioning.step_context import StepContext, StepFailed

logger = logging.getLogger(__name__)

WARNINGS = [("48h", timedelta(hours=48)), ("24h", timedelta(hours=24)), ("1h", timedelta(hours=1))]


# --- approval ------------------------------------------------------------------------------------------------


@transaction.atomic
def order_approve(*, order: Order, actor: AbstractBaseUser | None, now: datetime | None = None) -> None:
    now = now or timezone.now()
    order_transition(order=order, to_status=OrderStatus.APPROVED, reason="approved", now=now, **acting(actor))
    if order.starts_at - timedelta(hours=OperatorSettings.current().provision_lead_hours) <= now:
        provisioning_start(order=order, actor=actor)


def order_reject(*, order: Order, actor: AbstractBaseUser, reason: str) -> None:
    """Refuse a paid order; its lots are released, and payments flags the refund owed (on the event)."""
    reason = reason.strip()
    if not reason:
        raise ProvisioningError(_("Give the reason for rejecting this order."), field="reason")
    order_transition(order=order, to_status=OrderStatus.REJECTED, reason=f"rejected: {reason}", **acting(actor))


# --- reactions to the order's transitions ---------------------------------------------------------------------


def on_order_status_changed(*, order_id: int, to_status: str, **kwargs) -> None:
    """Receiver of booking's `order_status_changed`, after the transition's commit (provisioning/apps.py)."""
    if to_status == OrderStatus.PAID:
        order_auto_approve(order_id=order_id)
    elif to_status in RELEASING_STATUSES:
        access_release(order_id=order_id, reason=f"order {to_status}")


def order_auto_approve(*, order_id: int) -> bool:
    """Approve a paid order at once when the operators chose auto-approval. Beat's lifecycle tick calls it too,
    for an order whose event was lost (a worker stopped between the commit and the reaction)."""
    if not OperatorSettings.current().auto_approve:
        return False
    with transaction.atomic():
        order = Order.objects.select_for_update().filter(pk=order_id, status=OrderStatus.PAID).first()
        if order is None:  # approved, rejected or cancelled meanwhile
            return False
        order_approve(order=order, actor=None)
    return True


def access_release(*, order_id: int, reason: str) -> ProvisioningRun | None:
    """An order that ended, or was cancelled, rejected or expired, keeps no access: tear down every access that
    was prepared, or is being prepared. Nothing to do when none was, or when a teardown is under way."""
    order = Order.objects.get(pk=order_id)
    if not order.accesses.exclude(status=Access.Status.REVOKED).exists():
        return None
    try:
        return teardown_start(order=order, reason=reason)
    except ProvisioningError:  # already under way
        return None


# --- runs ----------------------------------------------------------------------------------------------------


def _hosts_of(order: Order) -> list[tuple[Host, list[int]]]:
    by_host: dict[int, tuple[Host, list[int]]] = {}
    for allocation in order.allocations.filter(released_at__isnull=True).select_related("lot__host"):
        host = allocation.lot.host
        by_host.setdefault(host.pk, (host, []))[1].extend(allocation.lot.gpu_index_list)
    return [(host, sorted(indices)) for host, indices in by_host.values()]


def _held_host_ids(order: Order) -> set[int]:
    """The hosts of the order's live lots: those its access is on now (a host it left may still have an access
    until its teardown succeeds)."""
    return set(order.allocations.filter(released_at__isnull=True).values_list("lot__host_id", flat=True).distinct())


def _hosts_left(order: Order) -> list[Host]:
    """Hosts the order has an access on that is not revoked, but no live lot any more (a lot reassigned away)."""
    held = _held_host_ids(order)
    accesses = order.accesses.exclude(status=Access.Status.REVOKED).exclude(host_id__in=held).select_related("host")
    return [access.host for access in accesses]


def _hosts_in_unfinished_runs(order: Order, *kinds: str) -> set[int]:
    """The hosts that a run of the order of one of `kinds` works on and has not finished (queued, running, or
    failed and waiting for its retry)."""
    steps_left = ProvisioningStep.objects.filter(run__order=order, run__kind__in=kinds).exclude(
        run__status=ProvisioningRun.Status.SUCCEEDED
    )
    return set(steps_left.values_list("host_id", flat=True))


def _hosts_for_run(order: Order, kind: str) -> list[tuple[Host, list[int]]]:
    """The hosts a run works on: those of the order's lots; for a teardown or a wipe, also every host the order
    ever had an access on (a lot reassigned away from a host leaves an account there). A teardown leaves out the
    hosts the order left that are released already, or being released by a run of their own (whose retries do
    not hold the order's end back). The release of hosts works on the hosts the order left."""
    if kind == ProvisioningRun.Kind.RELEASE_HOST:
        return [(host, []) for host in _hosts_left(order)]
    hosts = _hosts_of(order)
    if kind in (ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.WIPE) or not hosts:
        known = {host.pk for host, _indices in hosts}
        if kind == ProvisioningRun.Kind.TEARDOWN:
            known |= _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST)
        accesses = order.accesses.select_related("host")
        if kind == ProvisioningRun.Kind.TEARDOWN:
            accesses = accesses.exclude(status=Access.Status.REVOKED)
        hosts += [(access.host, []) for access in accesses if access.host_id not in known]
    return hosts


@transaction.atomic
def _create_run(
    *,
    order: Order,
    kind: str,
    step_names: list[str],
    actor: AbstractBaseUser | None,
    hosts: list[tuple[Host, list[int]]] | None = None,
) -> ProvisioningRun:
    run = ProvisioningRun.objects.create(order=order, kind=kind, triggered_by=actor)
    position = 0
    for host, gpu_indices in _hosts_for_run(order, kind) if hosts is None else hosts:
        access, created = Access.objects.get_or_create(
            order=order,
            host=host,
            defaults={"username": username_for(order), "gpu_indices": ",".join(map(str, gpu_indices))},
        )
        if not created and gpu_indices and access.gpu_indices != ",".join(map(str, gpu_indices)):
            access.gpu_indices = ",".join(map(str, gpu_indices))  # a lot reassigned on the same host
            access.save(update_fields=["gpu_indices"])
        if kind == ProvisioningRun.Kind.PROVISION and access.status == Access.Status.REVOKED:
            # A lot moved back to a host the order had left (and was torn down there): prepared afresh.
            _access_reopen(access)
        for name in step_names:
            ProvisioningStep.objects.create(run=run, host=host, position=position, name=name)
            position += 1
    from provisioning.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(run.pk))
    return run


def _access_reopen(access: Access) -> None:
    access.status = Access.Status.PENDING
    access.revoked_at = access.ready_at = access.wiped_at = access.keys_expire_at = None
    access.preflight_report = None
    access.preflight_status = access.handover_note = ""
    access.save(
        update_fields=[
            "status",
            "revoked_at",
            "ready_at",
            "wiped_at",
            "keys_expire_at",
            "preflight_report",
            "preflight_status",
            "handover_note",
        ]
    )


@transaction.atomic
def provisioning_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="provisioning started", **acting(actor))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PROVISION, step_names=steps.PROVISION_STEPS, actor=actor)


def provisioning_retry(*, order: Order, actor: AbstractBaseUser, run_id: int | None = None) -> ProvisioningRun:
    """Resume a failed run where it stopped (steps done stay done): `run_id` (the console's "retry now" of a
    failing teardown, which would otherwise wait for its next retry), or else the order's last failed run among
    those that the sweep does not retry by itself (provisioning, pre-flight, keys)."""
    if run_id is None:
        runs = order.provisioning_runs.exclude(kind__in=RETRIED_RUN_KINDS)
    else:
        runs = order.provisioning_runs.filter(pk=run_id)
    run = runs.filter(status=ProvisioningRun.Status.FAILED).first()
    if run is None:
        if run_id is not None and runs.filter(status__in=UNDER_WAY).exists():
            raise ProvisioningError(_("This run is being retried already."))
        raise ProvisioningError(_("There is no failed run to retry."))
    with transaction.atomic():
        if not _run_requeue(run_id=run.pk, clear_error=True):  # retried meanwhile (a second click, the sweep)
            raise ProvisioningError(_("This run is being retried already."))
        if run.kind in (ProvisioningRun.Kind.PROVISION, ProvisioningRun.Kind.KEYS) and order.status in HANDING_OVER:
            order_transition(order=order, to_status=OrderStatus.PROVISIONING, reason="retry", **acting(actor))
    return run


def _run_requeue(*, run_id: int, now: datetime | None = None, due: bool = False, clear_error: bool = False) -> bool:
    """Queue a failed run again (its task resumes it at the first step not done), if it is still failed (and, with
    `due`, its next retry is due by `now`): one conditional UPDATE, so two sweeps, or a sweep and an operator, never
    queue it twice. next_retry_at becomes the time it was queued: abandoned queued runs are resumed counting from
    it."""
    now = now or timezone.now()
    failed = ProvisioningRun.objects.filter(pk=run_id, status=ProvisioningRun.Status.FAILED)
    if due:
        failed = failed.filter(next_retry_at__lte=now)
    values = {"status": ProvisioningRun.Status.QUEUED, "lease_until": None, "next_retry_at": now}
    if clear_error:
        values["error"] = ""
    if not failed.update(**values):
        return False
    from provisioning.tasks import execute_run

    transaction.on_commit(lambda: execute_run.delay(run_id))
    return True


def provisioning_hand_over(*, order: Order, actor: AbstractBaseUser, reason: str) -> ProvisioningRun:
    """Hand over machines whose pre-flight check failed; the customer reads `reason` beside the report. The keys
    are written by the hand-over run; the order turns ready when it succeeds."""
    reason = reason.strip()
    if not reason:
        raise ProvisioningError(
            _("Say why the machines are handed over despite the failed check: the customer reads it."), field="reason"
        )
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order.pk)
        if not awaits_preflight_decision(order):
            raise ProvisioningError(_("Only an order whose pre-flight check failed waits for this decision."))
        _accesses_set(order, hosts=_held_host_ids(order), handover_note=reason)
        return _handover_start(order=order, actor=actor)


def _handover_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    """The keys written and each container's sshd answering: only now can the customer log in, so that no process
    of theirs runs before the pre-flight check (or beside it). The order turns ready when this run succeeds."""
    return _create_run(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor)


def preflight_rerun(*, order: Order, actor: AbstractBaseUser) -> ProvisioningRun:
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE) and not awaits_preflight_decision(order):
        raise ProvisioningError(_("The pre-flight check runs on machines that are ready."))
    return _create_run(order=order, kind=ProvisioningRun.Kind.PREFLIGHT, step_names=steps.PREFLIGHT_STEPS, actor=actor)


def access_keys_renew(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    """Rewrite the keys with the window's current end in their expiry-time (after an extension)."""
    return _create_run(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor)


@transaction.atomic
def teardown_start(
    *, order: Order, actor: AbstractBaseUser | None = None, reason: str = "window ended"
) -> ProvisioningRun:
    """Tear down every access of the order. One teardown run per order: a failed one is resumed (now), never
    started again; under the order's lock, so that two sweeps at once start one run."""
    order = lock_order(order.pk)
    teardowns = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN)
    if teardowns.exclude(status=ProvisioningRun.Status.FAILED).exists():
        raise ProvisioningError(_("The teardown of this order is already under way."))
    run = teardowns.first()
    if run is not None:
        _run_requeue(run_id=run.pk)
        reason = f"{reason} (the failed teardown resumed)"
    else:
        run = _create_run(order=order, kind=ProvisioningRun.Kind.TEARDOWN, step_names=steps.TEARDOWN_STEPS, actor=actor)
    order_note(order=order, reason=f"teardown: {reason}", evidence={"run": run.pk}, **acting(actor))
    return run


@transaction.atomic
def access_release_left_hosts(
    *, order: Order, actor: AbstractBaseUser | None = None, reason: str
) -> ProvisioningRun | None:
    """Tear down the hosts the order has an access on but no live lot any more, with a run on those hosts only
    (kind release_host, the teardown's steps). On success their accesses are revoked; the order goes on on its
    other hosts. A host that a teardown or release still under way (or failing, and retried) covers is left to
    it. None when no host was left."""
    order = lock_order(order.pk)
    covered = _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.RELEASE_HOST)
    left = [host for host in _hosts_left(order) if host.pk not in covered]
    if not left:
        return None
    run = _create_run(
        order=order,
        kind=ProvisioningRun.Kind.RELEASE_HOST,
        step_names=steps.TEARDOWN_STEPS,
        actor=actor,
        hosts=[(host, []) for host in left],
    )
    names = [host.name for host in left]
    order_note(
        order=order,
        reason=f"teardown of {', '.join(names)}: {reason}",
        evidence={"hosts": names, "run": run.pk},
        **acting(actor),
    )
    return run


@transaction.atomic
def lot_reassign(*, order: Order, from_lot_id: int, to_lot_id: int, actor: AbstractBaseUser) -> ProvisioningRun | None:
    """The console's reassignment: booking moves the lot, then every host the order left is torn down (its
    account, keys and container), in the same transaction. Returns the release run, if a host was left.

    A lot cannot move back to a host whose release is not finished: that teardown would undo the new
    provisioning there."""
    order = lock_order(order.pk)
    to_host_id = Lot.objects.filter(pk=to_lot_id).values_list("host_id", flat=True).first()
    if to_host_id in _hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST):
        host = Host.objects.get(pk=to_host_id)
        raise ProvisioningError(
            _(
                "Access on %(host)s is still being torn down for this order: choose a lot on another host, or move "
                "it back once that teardown has succeeded."
            )
            % {"host": host.name},
            field="to_lot",
        )
    order_reassign_lot(order=order, from_lot_id=from_lot_id, to_lot_id=to_lot_id, actor=actor)
    return access_release_left_hosts(order=order, actor=actor, reason="lot reassigned")


def _context(order: Order, access: Access, host: Host) -> StepContext:
    hardware = order.hardware_class
    operator_settings = OperatorSettings.current()
    gpu_indices = [int(index) for index in access.gpu_indices.split(",") if index]
    lots = max(1, len(gpu_indices) // max(1, hardware.cards_per_lot))
    return StepContext(
        username=access.username,
        comment=f"Binome {order.public_id}",
        authorized_keys="".join(f"{key.public_key}\n" for key in order.ssh_keys.all()),
        gpu_indices=gpu_indices,
        expect_arch=hardware.architecture,
        expect_vendor=hardware.vendor,
        image_ref=order.environment.image_ref,
        image_id=access.image_id,
        # the demo's dry-run hosts run nothing: they stand for a podman host
        container_runtime=host.container_runtime or ("podman" if host.driver == Host.Driver.DRY_RUN else ""),
        keys_expire_at=order.ends_at + timedelta(minutes=operator_settings.key_grace_minutes),
        ssh_port_base=host.ssh_port_base,
        publish_address=settings.PROVISIONING_PUBLISH_ADDRESS,
        lots_in_container=lots,
        lots_on_host=max(lots, host.lots.count()),
        disk_gib=host.disk_per_lot_gib * lots,
        device_dir=settings.PROVISIONING_DEVICE_DIR,
        **selectors.container_limits(host, lots=lots),
    )


def _take_lease(run: ProvisioningRun, now: datetime) -> str:
    """ "taken" when this worker may execute the run now; "waiting" while another run of the same order holds
    its lease (one run at a time works on an order's hosts); "busy" when the run is finished or held."""
    with transaction.atomic():
        lock_order(run.order_id)  # serialises lease taking per order
        sibling_running = (
            ProvisioningRun.objects.filter(
                order_id=run.order_id, status=ProvisioningRun.Status.RUNNING, lease_until__gte=now
            )
            .exclude(pk=run.pk)
            .exists()
        )
        if sibling_running:
            return "waiting"
        lease = now + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS)
        taken = ProvisioningRun.objects.filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now),
            pk=run.pk,
            status__in=[ProvisioningRun.Status.QUEUED, ProvisioningRun.Status.RUNNING],
        ).update(lease_until=lease, status=ProvisioningRun.Status.RUNNING)
        if taken:
            ProvisioningRun.objects.filter(pk=run.pk, started_at__isnull=True).update(started_at=now)
    return "taken" if taken else "busy"


def run_execute(*, run: ProvisioningRun) -> str:
    """Execute the run's steps that are not done, host by host. Returns the run's status, or "waiting" /
    "busy" when it cannot run now (the task tries a waiting run again)."""
    lease = _take_lease(run, timezone.now())
    if lease != "taken":
        return lease
    run.refresh_from_db()
    order = Order.objects.select_related("hardware_class", "environment").get(pk=run.order_id)
    pending = list(run.steps.exclude(status=ProvisioningStep.Status.DONE).select_related("host"))
    failure = ""
    connections: dict[int, object] = {}
    try:
        for step in pending:
            if run.kind not in RELEASED_RUN_KINDS and _released(order):
                failure = f"stopped before {step.name}: the order was {order.get_status_display().lower()}"
                break
            access = Access.objects.select_related("host").get(order=order, host=step.host)
            failure = _execute_step(run=run, step=step, order=order, access=access, connections=connections)
            if failure:
                break
    finally:
        for connection in connections.values():
            connection.close()
    return _finish(run=run, order=order, failure=failure)


def _released(order: Order) -> bool:
    """Whether the order was cancelled, rejected or ended while a run worked on it (read fresh)."""
    order.status = Order.objects.filter(pk=order.pk).values_list("status", flat=True).get()
    return order.status in RELEASING_STATUSES


def _execute_step(
    *, run: ProvisioningRun, step: ProvisioningStep, order: Order, access: Access, connections: dict
) -> str:
    """Run one step through the host's connection (opened once per host). Returns the failure, or ""."""
    # Saved, not updated: the order page shows the run's progress, and a save makes its renderings stale.
    run.lease_until = timezone.now() + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS)
    run.save(update_fields=["lease_until"])
    ProvisioningStep.objects.filter(pk=step.pk).update(
        status=ProvisioningStep.Status.RUNNING, attempts=step.attempts + 1, started_at=timezone.now(), error=""
    )
    try:
        if step.host_id not in connections:
            connections[step.host_id] = host_connect(host=step.host)
        context = _context(order, access, step.host)
        output = steps.STEPS[step.name](connections[step.host_id], context)
    except (DriverError, StepFailed) as exc:
        failure = f"{step.name} on {step.host.name}: {getattr(exc, 'message', None) or exc}"
        ProvisioningStep.objects.filter(pk=step.pk).update(
            status=ProvisioningStep.Status.FAILED, finished_at=timezone.now(), error=str(failure)[:5000]
        )
        return failure
    found = getattr(output, "access", {})  # what the step made that the access keeps (step_context.StepOutput)
    if found:
        for name, value in found.items():
            setattr(access, name, value)
        access.save(update_fields=list(found))
    ProvisioningStep.objects.filter(pk=step.pk).update(
        status=ProvisioningStep.Status.DONE, finished_at=timezone.now(), output=str(output)[:20000]
    )
    return ""


def _accesses_set(order: Order, *, hosts=None, **values) -> None:
    """Write `values` on the order's accesses (on `hosts` only, when given). Revoking leaves an access revoked
    before as it was: the wipe's grace period counts from its first revocation."""
    accesses = order.accesses.all() if hosts is None else order.accesses.filter(host_id__in=hosts)
    if values.get("status") == Access.Status.REVOKED:
        accesses = accesses.exclude(status=Access.Status.REVOKED)
    for access in accesses:
        for name, value in values.items():
            setattr(access, name, value)
        access.save(update_fields=list(values))


@transaction.atomic
def _finish(*, run: ProvisioningRun, order: Order, failure: str) -> str:
    now = timezone.now()
    status = ProvisioningRun.Status.FAILED if failure else ProvisioningRun.Status.SUCCEEDED
    attempts = ProvisioningRun.objects.select_for_update().values_list("attempts", flat=True).get(pk=run.pk) + 1
    retry_at = now + retry_delay(attempts) if failure and run.kind in RETRIED_RUN_KINDS else None
    ProvisioningRun.objects.filter(pk=run.pk).update(
        status=status, finished_at=now, error=failure, lease_until=None, attempts=attempts, next_retry_at=retry_at
    )
    if retry_at:
        logger.warning("%s run %s failed (attempt %s), retry at %s: %s", run.kind, run.pk, attempts, retry_at, failure)
    order = Order.objects.select_for_update().get(pk=order.pk)
    if run.kind == ProvisioningRun.Kind.PROVISION and order.status == OrderStatus.PROVISIONING:
        failed_checks = _failed_preflights(order)
        if failure:
            _provisioning_failed(order, "provisioning failed", {"error": failure[:500], "run": run.pk})
        elif failed_checks:  # the hand-over waits for an operator's decision
            _provisioning_failed(
                order, "pre-flight check failed: waiting for an operator", {"run": run.pk, "failed": failed_checks}
            )
        else:
            _handover_start(order=order)
    elif run.kind == ProvisioningRun.Kind.PREFLIGHT and not failure and awaits_preflight_decision(order):
        if not _failed_preflights(order):
            _handover_start(order=order)
    elif run.kind == ProvisioningRun.Kind.KEYS and order.status in HANDING_OVER:
        if failure and order.status == OrderStatus.PROVISIONING:
            _provisioning_failed(order, "hand-over failed", {"error": failure[:500], "run": run.pk})
        elif not failure:
            note = order.accesses.exclude(handover_note="").values_list("handover_note", flat=True).first()
            actor = acting(run.triggered_by) if note else {}
            before = order.provisioning_runs.filter(created_at__lte=run.created_at).exclude(pk=run.pk).first()
            reason = (
                f"handed over despite the pre-flight check: {note}"
                if note
                else "pre-flight check passed on a re-run"
                if before and before.kind == ProvisioningRun.Kind.PREFLIGHT
                else "access ready"
            )
            _hand_over(order=order, now=now, reason=reason, evidence={"run": run.pk}, **actor)
    elif run.kind == ProvisioningRun.Kind.WIPE and not failure:
        _accesses_set(order, wiped_at=now)
    elif run.kind == ProvisioningRun.Kind.RELEASE_HOST and not failure:
        _accesses_set(order, hosts=run.steps.values("host_id"), status=Access.Status.REVOKED, revoked_at=now)
    elif run.kind == ProvisioningRun.Kind.TEARDOWN and not failure:
        # The hosts it worked on: a host the order left may still wait for its own release run.
        _accesses_set(order, hosts=run.steps.values("host_id"), status=Access.Status.REVOKED, revoked_at=now)
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
            order_transition(
                order=order, to_status=OrderStatus.ENDED, actor_kind=OrderEvent.Actor.SYSTEM, reason="access revoked"
            )
    return status


def _provisioning_failed(order: Order, reason: str, evidence: dict) -> None:
    order_transition(
        order=order,
        to_status=OrderStatus.PROVISIONING_FAILED,
        actor_kind=OrderEvent.Actor.SYSTEM,
        reason=reason,
        evidence=evidence,
    )


def _failed_preflights(order: Order) -> dict[str, list[str]]:
    """Host name → the names of the checks that failed, for the accesses whose pre-flight report is a FAIL."""
    failed = {}
    for access in order.accesses.filter(host_id__in=_held_host_ids(order)).select_related("host"):
        if access.preflight_status == "FAIL":
            checks = (access.preflight_report or {}).get("checks") or []
            failed[access.host.name] = [
                str(check.get("name")) for check in checks if isinstance(check, dict) and check.get("status") == "FAIL"
            ]
    return failed


def _hand_over(*, order: Order, now: datetime, reason: str, evidence: dict, **actor) -> None:
    """The access is ready: the order becomes ready (active once its window started) and the customer is told."""
    actor = actor or {"actor_kind": OrderEvent.Actor.SYSTEM}
    _accesses_set(order, hosts=_held_host_ids(order), status=Access.Status.READY, ready_at=now)
    order_transition(order=order, to_status=OrderStatus.READY, reason=reason, evidence=evidence, **actor)
    if order.starts_at <= now:
        order_transition(
            order=order, to_status=OrderStatus.ACTIVE, actor_kind=OrderEvent.Actor.SYSTEM, reason="window started"
        )
    from provisioning.tasks import send_access_ready

    send_access_ready.delay_on_commit(order.pk)


def access_email_send(*, order: Order) -> None:
    notices.send(Notice.ACCESS_READY, order=order, accesses=list(order.accesses.select_related("host")))


# --- lifecycle -----------------------------------------------------------------------------------------------


def lifecycle_tick(*, now: datetime | None = None) -> dict[str, int]:
    """Beat: start provisioning in time, open and close windows, warn before the end, tear down what was
    released, resume abandoned runs, approve what auto-approval missed. Each part re-reads state, handles a capped
    batch and is safe to run twice at once."""
    now = now or timezone.now()
    return {
        "approved": _approve_missed(),
        "provisioned": _provision_due(now),
        "activated": _activate_started(now),
        "warned": _warn_ending(now),
        "torn_down": _tear_down_released(now),
        "keys_renewed": _renew_moved_keys(now),
        "wiped": _wipe_due(now),
        "retried": _retry_failed(now),
        "resumed": _resume_abandoned(now),
    }


def _approve_missed() -> int:
    """Paid orders that auto-approval should have approved (its reaction runs after the commit, and a worker
    can stop in between)."""
    if not OperatorSettings.current().auto_approve:
        return 0
    paid = Order.objects.filter(status=OrderStatus.PAID).values_list("pk", flat=True)[:50]
    return sum(order_auto_approve(order_id=order_id) for order_id in paid)


def _provision_due(now: datetime) -> int:
    provisioned = 0
    lead = timedelta(hours=OperatorSettings.current().provision_lead_hours)
    for order in Order.objects.filter(status=OrderStatus.APPROVED, starts_at__lte=now + lead)[:50]:
        try:
            provisioning_start(order=order)
            provisioned += 1
        except BookingError:
            continue
    return provisioned


def _activate_started(now: datetime) -> int:
    return sum(
        order_transition(
            order=order, to_status=OrderStatus.ACTIVE, actor_kind=OrderEvent.Actor.SYSTEM, reason="window started"
        )
        for order in Order.objects.filter(status=OrderStatus.READY, starts_at__lte=now)[:200]
    )


def _warn_ending(now: datetime) -> int:
    warned = 0
    for order in Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], ends_at__gt=now)[:500]:
        left = order.ends_at - now
        due = [kind for kind, before in WARNINGS if left <= before]
        if due:  # only the most urgent one: a window provisioned late skips the warnings already past
            _notice, created = LifecycleNotice.objects.get_or_create(
                order=order, kind=due[-1], window_end=order.ends_at
            )
            if created:
                from provisioning.tasks import send_end_warning

                send_end_warning.delay_on_commit(order.pk, due[-1])
                warned += 1
    return warned


def _tear_down_released(now: datetime) -> int:
    """Windows that ended, and released orders that still have access (the teardown their event should have
    started, if it was lost)."""
    torn_down = 0
    # Those with a teardown already: a failed one is retried with backoff (_retry_failed), never started again.
    ended = Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], ends_at__lte=now).exclude(
        Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=ProvisioningRun.Kind.TEARDOWN))
    )
    for order in ended[:50]:
        try:
            teardown_start(order=order)
            torn_down += 1
        except ProvisioningError:
            continue
    # Only those without any teardown: a failed one is retried with backoff, not started again every tick. An order
    # whose window passed while its hand-over still waited (a failed pre-flight, a failed run) keeps no container
    # either: its status is the operator's to settle, its machines are free for the next window.
    still_open = (
        Order.objects.filter(
            Q(status__in=RELEASING_STATUSES) | Q(status__in=NEVER_HANDED_OVER, ends_at__lte=now),
            accesses__status__in=[Access.Status.PENDING, Access.Status.READY],
        )
        .exclude(Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=ProvisioningRun.Kind.TEARDOWN)))
        .values_list("pk", flat=True)
        .distinct()[:50]
    )
    for order_id in still_open:
        torn_down += access_release(order_id=order_id, reason="released with access left") is not None
    return torn_down


NEVER_HANDED_OVER = (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.PROVISIONING_FAILED)


def _run_under_way(kind: str, statuses=UNDER_WAY) -> Exists:
    """Whether the order has a run of `kind` queued or running (or in `statuses`): one run's condition, never two
    runs' (an `exclude()` over two conditions on a multi-valued relation may match them on different runs)."""
    return Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=kind, status__in=statuses))


def _renew_moved_keys(now: datetime) -> int:
    """Windows whose end moved (an extension) since their keys were written: the expiry-time moves with it."""
    grace = timedelta(minutes=OperatorSettings.current().key_grace_minutes)
    moved = (
        Order.objects.filter(
            status__in=[OrderStatus.READY, OrderStatus.ACTIVE],
            ends_at__gt=now,
            accesses__status=Access.Status.READY,
            accesses__keys_expire_at__lt=F("ends_at") + grace,
        )
        # a keys run that failed waits for the operator's retry (console), not a new run every tick
        .exclude(_run_under_way(ProvisioningRun.Kind.KEYS, statuses=(*UNDER_WAY, ProvisioningRun.Status.FAILED)))
        .distinct()[:50]
    )
    renewed = 0
    for order in moved:
        access_keys_renew(order=order)
        renewed += 1
    return renewed


def wipe_date(order: Order) -> datetime:
    """When the customer's files are deleted: announced in the end-of-window e-mails."""
    return order.ends_at + timedelta(days=OperatorSettings.current().wipe_after_days)


def access_wipe_start(*, order: Order, actor: AbstractBaseUser | None = None) -> ProvisioningRun:
    return _create_run(order=order, kind=ProvisioningRun.Kind.WIPE, step_names=steps.WIPE_STEPS, actor=actor)


def _wipe_due(now: datetime) -> int:
    """Accesses revoked more than the announced number of days ago whose files are still on the host. The days
    count from the later of the window's end and the revocation (an early teardown keeps the announced date)."""
    grace = timedelta(days=OperatorSettings.current().wipe_after_days)
    due = (
        Order.objects.filter(
            accesses__status=Access.Status.REVOKED,
            accesses__wiped_at__isnull=True,
            accesses__revoked_at__lte=now - grace,
            ends_at__lte=now - grace,
        )
        # A failed wipe is retried with backoff (_retry_failed), not started again every tick.
        .exclude(_run_under_way(ProvisioningRun.Kind.WIPE, (*UNDER_WAY, ProvisioningRun.Status.FAILED)))
        .distinct()[:50]
    )
    started = 0
    for order in due:
        access_wipe_start(order=order)
        started += 1
    return started


def _retry_failed(now: datetime) -> int:
    """Failed teardowns, wipes and releases of hosts whose next retry is due, oldest due first, a capped batch:
    each queued again (the same run, at its failed step) by a conditional update, so two sweeps at once queue it
    once. Its next failure sets the next retry, twice as far (retry_delay)."""
    due = (
        ProvisioningRun.objects.filter(
            kind__in=RETRIED_RUN_KINDS, status=ProvisioningRun.Status.FAILED, next_retry_at__lte=now
        )
        .order_by("next_retry_at", "pk")
        .values_list("pk", flat=True)[:20]
    )
    retried = 0
    for run_id in due:
        with transaction.atomic():
            retried += _run_requeue(run_id=run_id, now=now, due=True)
    return retried


def _resume_abandoned(now: datetime) -> int:
    """Runs whose worker stopped (lease expired), and queued runs whose task was lost or kept waiting (counted
    from when they were queued: created, or queued again)."""
    from provisioning.tasks import execute_run

    abandoned = (
        ProvisioningRun.objects.annotate(queued_at=Coalesce("next_retry_at", "created_at"))
        .filter(
            Q(status=ProvisioningRun.Status.RUNNING, lease_until__lt=now)
            | Q(status=ProvisioningRun.Status.QUEUED, lease_until__isnull=True, queued_at__lt=now - QUEUED_PATIENCE)
        )
        .values_list("pk", flat=True)[:20]
    )
    resumed = 0
    for run_id in abandoned:
        execute_run.delay(run_id)
        resumed += 1
    return resumed


QUEUED_PATIENCE = timedelta(minutes=5)
# What still runs once the order is released (every other run stops before its next step).
RELEASED_RUN_KINDS = (ProvisioningRun.Kind.TEARDOWN, ProvisioningRun.Kind.WIPE, ProvisioningRun.Kind.RELEASE_HOST)


def end_warning_send(*, order: Order, kind: str) -> None:
    notices.send(
        Notice.END_WARNING,
        order=order,
        kind=kind,
        wipe_at=wipe_date(order),
        wipe_after_days=OperatorSettings.current().wipe_after_days,
    )
