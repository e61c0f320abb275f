"""Executing a provisioning run: the lease that lets one worker, and one run of an order at a time, work on it; its
steps not done yet, host by host through one connection each; and what its end does to the order (hand-over,
failure, readiness, revocation, the wipe's date). A step done is never done again, so a run interrupted anywhere
resumes cleanly.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from booking import notices
from booking import selectors as booking_selectors
from booking.locks import lock_order
from booking.models import RELEASING_STATUSES, BookingPolicy, Order, OrderEvent, OrderStatus
from booking.notices import Notice
from booking.rules import BookingError
from booking.services import allocations_release_vacated, order_note, order_start_clock, order_transition
from inventory.models import Host
from provisioning import enqueue, selectors, steps
from provisioning.drivers.base import DriverError
from provisioning.hosts import host_connect
from provisioning.models import RETRIED_RUN_KINDS, Access, OperatorSettings, ProvisioningRun, ProvisioningStep
from provisioning.rules import HANDING_OVER, acting, awaits_preflight_decision, retry_delay
from provisioning.runs import access_release_left_hosts, accesses_set, handover_start, held_host_ids
from provisioning.step_context import StepContext, StepFailed

logger = logging.getLogger(__name__)


# What still runs once the order is released (every other run stops before its next step).
RELEASED_RUN_KINDS = (
    ProvisioningRun.Kind.TEARDOWN,
    ProvisioningRun.Kind.WIPE,
    ProvisioningRun.Kind.RELEASE_HOST,
    ProvisioningRun.Kind.DOWNLOAD_KEYS,
)


def _window_end(order: Order) -> datetime:
    """The end the keys expire after: the window's; for one that starts as soon as ready and is not handed over yet,
    the latest it may end (its lots' hold, less the turnaround), so that keys written before its clock starts let
    the customer in however late the hand-over comes. The lifecycle sweep rewrites them to the end once known."""
    if order.start_when_ready and order.clock_started_at is None:
        _held_from, held_until = booking_selectors.order_held_period(order=order)
        if held_until is not None:
            return max(order.ends_at, held_until - BookingPolicy.current().turnaround)
    return order.ends_at


def _context(order: Order, access: Access, host: Host, run: ProvisioningRun) -> StepContext:
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
        keys_expire_at=_window_end(order) + timedelta(minutes=operator_settings.key_grace_minutes),
        ssh_port_base=host.ssh_port_base,
        host_port_span=selectors.host_port_span(host),
        publish_address=settings.PROVISIONING_PUBLISH_ADDRESS,
        lots_in_container=lots,
        lots_on_host=max(lots, host.lots.count()),
        disk_gib=host.disk_per_lot_gib * lots,
        device_dir=settings.PROVISIONING_DEVICE_DIR,
        carry_from_username=selectors.carried_volume_username(order, host=host),
        download_until=_download_until(order, operator_settings),
        container_held=access.restarts_held_at is not None,
        # a change of keys in the window never starts a stopped container: the watch does, counted (the hand-over's
        # keys run follows the provision's start, before the customer can stop anything)
        starts_stopped_container=run.kind != ProvisioningRun.Kind.KEYS or order.status in HANDING_OVER,
        **selectors.container_limits(host, lots=lots),
    )


def _download_until(order: Order, operator_settings: OperatorSettings) -> datetime | None:
    """When the download window of a window that is over closes (the wipe's date); None while the order goes on (a
    host it left gets none) or when it never ran (cancelled, rejected: nothing of the customer's is there)."""
    over = order.status == OrderStatus.ENDED or (
        order.status in (OrderStatus.READY, OrderStatus.ACTIVE) and order.ends_at <= timezone.now()
    )
    return order.ends_at + timedelta(days=operator_settings.wipe_after_days) if over else None


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
        # A compare-and-set, so an UPDATE and not a save: of two workers handed the same run, only the one whose
        # UPDATE still finds the lease free or expired takes it. started_at keeps the first take's time.
        taken = ProvisioningRun.objects.filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now),
            pk=run.pk,
            status__in=[ProvisioningRun.Status.QUEUED, ProvisioningRun.Status.RUNNING],
        ).update(
            lease_until=lease, status=ProvisioningRun.Status.RUNNING, started_at=Coalesce("started_at", Value(now))
        )
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
    _save(run, lease_until=timezone.now() + timedelta(seconds=settings.PROVISIONING_LEASE_SECONDS))
    _save(step, status=ProvisioningStep.Status.RUNNING, attempts=step.attempts + 1, started_at=timezone.now(), error="")
    try:
        if step.host_id not in connections:
            connections[step.host_id] = host_connect(host=step.host)
        context = _context(order, access, step.host, run)
        output = steps.STEPS[step.name](connections[step.host_id], context)
    except (DriverError, StepFailed) as exc:
        failure = f"{step.name} on {step.host.name}: {getattr(exc, 'message', None) or exc}"
        _save(step, status=ProvisioningStep.Status.FAILED, finished_at=timezone.now(), error=str(failure)[:5000])
        return failure
    found = getattr(output, "access", {})  # what the step made that the access keeps (step_context.StepOutput)
    if found:
        _save(access, **found)
    _save(step, status=ProvisioningStep.Status.DONE, finished_at=timezone.now(), output=str(output)[:20000])
    return ""


def _save(row: ProvisioningRun | ProvisioningStep | Access, **values) -> None:
    """Write `values` on the row and save those fields only: a save, so that what the order page shows of it is
    drawn again (the page caches listen to saves, not to updates)."""
    for name, value in values.items():
        setattr(row, name, value)
    row.save(update_fields=list(values))


@transaction.atomic
def _finish(*, run: ProvisioningRun, order: Order, failure: str) -> str:
    now = timezone.now()
    status = ProvisioningRun.Status.FAILED if failure else ProvisioningRun.Status.SUCCEEDED
    attempts = ProvisioningRun.objects.select_for_update().values_list("attempts", flat=True).get(pk=run.pk) + 1
    order = Order.objects.select_for_update().get(pk=order.pk)
    retry_at = now + retry_delay(attempts) if failure and _retried(run, order) else None
    _save(
        run, status=status, finished_at=now, error=failure, lease_until=None, attempts=attempts, next_retry_at=retry_at
    )
    if retry_at:
        logger.warning("%s run %s failed (attempt %s), retry at %s: %s", run.kind, run.pk, attempts, retry_at, failure)
    if not failure:
        _release_vacated_lots(order=order, run=run)
    if run.kind == ProvisioningRun.Kind.PROVISION and order.status == OrderStatus.PROVISIONING:
        failed_checks = _failed_preflights(order)
        if failure:
            _provisioning_failed(order, "provisioning failed", {"error": failure[:500], "run": run.pk})
        elif failed_checks:  # the hand-over waits for an operator's decision; the customer is told why
            _provisioning_failed(
                order, "pre-flight check failed: waiting for an operator", {"run": run.pk, "failed": failed_checks}
            )
            enqueue.send_preflight_held(order.pk)
        else:
            handover_start(order=order)
    elif run.kind == ProvisioningRun.Kind.PREFLIGHT and not failure and awaits_preflight_decision(order):
        if not _failed_preflights(order):
            handover_start(order=order)
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
    elif run.kind == ProvisioningRun.Kind.MOVE and order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
        _moved(order=order, run=run, now=now, failure=failure)
    elif run.kind == ProvisioningRun.Kind.WIPE and not failure:
        accesses_set(order, wiped_at=now)
    elif run.kind == ProvisioningRun.Kind.RELEASE_HOST and not failure:
        accesses_set(order, hosts=run.steps.values("host_id"), status=Access.Status.REVOKED, revoked_at=now)
    elif run.kind == ProvisioningRun.Kind.TEARDOWN and not failure:
        # The hosts it worked on: a host the order left may still wait for its own release run.
        accesses_set(order, hosts=run.steps.values("host_id"), status=Access.Status.REVOKED, revoked_at=now)
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
            order_transition(
                order=order, to_status=OrderStatus.ENDED, actor_kind=OrderEvent.Actor.SYSTEM, reason="access revoked"
            )
    return status


def _retried(run: ProvisioningRun, order: Order) -> bool:
    """Whether a failed run is queued again by the sweep: the kinds that take access away, always; a move while its
    order is still in its window, unless an operator gave it up or a later move replaced it."""
    if run.kind not in RETRIED_RUN_KINDS or run.given_up_at is not None:
        return False
    return run.kind != ProvisioningRun.Kind.MOVE or order.status in (OrderStatus.READY, OrderStatus.ACTIVE)


# The steps after which the order has no container on a host holding other cards than its lots there: the container
# was made again from the lots it uses, or removed.
_CONTAINER_REMADE_OR_GONE = ("start_container", "remove_container", "wipe_data")


def _release_vacated_lots(*, order: Order, run: ProvisioningRun) -> None:
    """The lots a move vacated on the hosts where this run made the order's container again or removed it are free
    to book again: no container of the order holds their cards any more."""
    done = run.steps.filter(name__in=_CONTAINER_REMADE_OR_GONE, status=ProvisioningStep.Status.DONE)
    hosts = set(done.values_list("host_id", flat=True))
    if hosts:
        allocations_release_vacated(order=order, host_ids=hosts)


def _moved(*, order: Order, run: ProvisioningRun, now: datetime, failure: str) -> None:
    """The new lots of a moved order are ready (its access there too), and the hosts it left are torn down now;
    the customer is e-mailed how to log in. A failed move leaves the customer on the machine they work on (its lot
    held, vacated, for no one) and is retried with backoff (lifecycle._retry_failed) until it succeeds or an operator
    gives it up (moves.move_give_up)."""
    if failure:
        if run.attempts <= 1:  # once: its retries are counted on the run, not in the order's history
            order_note(
                order=order,
                reason="move failed: the customer stays on the previous machine; the move is retried until it "
                "succeeds or an operator gives it up",
                actor_kind=OrderEvent.Actor.SYSTEM,
                evidence={"run": run.pk, "error": failure[:500]},
            )
        return
    accesses_set(order, hosts=run.steps.values("host_id"), status=Access.Status.READY, ready_at=now)
    access_release_left_hosts(order=order, reason="order moved after a provider fault")
    order_note(order=order, reason="moved: the new lots are handed over", actor_kind=OrderEvent.Actor.SYSTEM,
               evidence={"run": run.pk})  # fmt: skip
    enqueue.send_order_moved(order.pk, run.pk, "done")


def order_moved_email_send(
    *, order: Order, run_id: int, stage: str, data_kept: bool = False, credit: str = "", hours_lost: int = 0
) -> None:
    """Tell the customer their order moves ("started": where, whether their files follow, how the lost time is
    credited) or moved ("done": how to log in to the new machine)."""
    run = order.provisioning_runs.filter(pk=run_id, kind=ProvisioningRun.Kind.MOVE).first()
    if run is None or stage not in ("started", "done"):
        return
    hosts = list(run.steps.order_by("position").values_list("host_id", flat=True))
    hosts = hosts[:1] if stage == "started" else hosts  # where it moves (then also the host whose container narrows)
    notices.send(
        Notice.ORDER_MOVED,
        order=order,
        stage=stage,
        accesses=list(order.accesses.filter(host_id__in=hosts).select_related("host")),
        data_kept=data_kept,
        credit=credit,
        hours_lost=hours_lost,
    )


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
    for access in order.accesses.filter(host_id__in=held_host_ids(order)).select_related("host"):
        if access.preflight_status == "FAIL":
            checks = (access.preflight_report or {}).get("checks") or []
            failed[access.host.name] = [
                str(check.get("name")) for check in checks if isinstance(check, dict) and check.get("status") == "FAIL"
            ]
    return failed


def _hand_over(*, order: Order, now: datetime, reason: str, evidence: dict, **actor) -> None:
    """The access is ready: the order becomes ready (active once its window started) and the customer is told."""
    actor = actor or {"actor_kind": OrderEvent.Actor.SYSTEM}
    try:
        if order_start_clock(order=order, now=now):  # booked to start as soon as ready: its days count from now
            order.refresh_from_db(fields=["starts_at", "ends_at", "clock_started_at"])
    except BookingError as exc:  # its lots are taken before a window could start: the operators settle it
        _provisioning_failed(order, "hand-over too late: the window's lots are taken", {"error": exc.message})
        return
    accesses_set(order, hosts=held_host_ids(order), status=Access.Status.READY, ready_at=now)
    order_transition(order=order, to_status=OrderStatus.READY, reason=reason, evidence=evidence, **actor)
    if order.starts_at <= now:
        order_transition(
            order=order, to_status=OrderStatus.ACTIVE, actor_kind=OrderEvent.Actor.SYSTEM, reason="window started"
        )
    enqueue.send_access_ready(order.pk)


def preflight_held_email_send(*, order: Order) -> None:
    """Tell the customer that the pre-flight check failed and the hand-over waits for an operator, with the checks
    that failed on each host (nothing is sent once the order has moved on: re-run, moved or handed over)."""
    if not awaits_preflight_decision(order):
        return
    notices.send(Notice.PREFLIGHT_HELD, order=order, failed=_failed_preflights(order))


def access_email_send(*, order: Order) -> None:
    notices.send(Notice.ACCESS_READY, order=order, accesses=list(order.accesses.select_related("host")))
