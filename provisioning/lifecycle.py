"""Beat's lifecycle sweep (`lifecycle_tick`): the window's life after approval, driven by the clock. It starts
provisioning in time, opens windows, renews the keys of extended ones, warns before the end (and says when the files
are wiped), tears down what ended or was released, wipes files after their grace period, issues the signed research
record of each window that ran and deletes it with the files, queues failed runs of
RETRIED_RUN_KINDS (teardowns, wipes, releases, moves) again when their retry is due, resumes abandoned runs and
approves what auto-approval missed. Each part re-reads state, handles a capped batch and is safe to run twice at
once.
"""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from booking import links, notices
from booking.models import RELEASING_STATUSES, Allocation, BookingPolicy, Order, OrderEvent, OrderStatus
from booking.notices import Notice
from booking.rules import BookingError
from booking.services import order_transition
from provisioning import enqueue, research_record
from provisioning.models import RETRIED_RUN_KINDS, Access, LifecycleNotice, OperatorSettings, ProvisioningRun
from provisioning.rules import UNDER_WAY, ProvisioningError
from provisioning.runs import _run_requeue, access_keys_renew, access_wipe_start, provisioning_start, teardown_start
from provisioning.selectors import wipe_date
from provisioning.services import access_release, order_auto_approve

WARNINGS = [("48h", timedelta(hours=48)), ("24h", timedelta(hours=24)), ("1h", timedelta(hours=1))]
NEVER_HANDED_OVER = (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.PROVISIONING_FAILED)
# An order carrying another's data that has not taken the volume over yet (its provisioning does).
CARRY_WAITING = (
    OrderStatus.AWAITING_PAYMENT,
    OrderStatus.PAYMENT_PROCESSING,
    OrderStatus.PAID,
    *NEVER_HANDED_OVER,
)
QUEUED_PATIENCE = timedelta(minutes=5)
SWEEP_BATCH = 50  # orders a sweep starts runs for in one tick


def lifecycle_tick(*, now: datetime | None = None) -> dict[str, int]:
    """Beat: every part of the sweep the module's docstring lists, in this order; the counts say what each did."""
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
        # last: a PDF is printed for each record, and nothing of the window's life waits for them
        "records_issued": research_record.records_issue_due(now=now),
        "records_deleted": research_record.records_delete_wiped(),
    }


def _approve_missed() -> int:
    """Paid orders that auto-approval should have approved (its reaction runs after the commit, and a worker
    can stop in between)."""
    if not OperatorSettings.current().auto_approve:
        return 0
    paid = Order.objects.filter(status=OrderStatus.PAID).values_list("pk", flat=True)[:50]
    return sum(order_auto_approve(order_id=order_id) for order_id in paid)


def _provision_due(now: datetime) -> int:
    lead = timedelta(hours=OperatorSettings.current().provision_lead_hours)
    due = Order.objects.filter(status=OrderStatus.APPROVED, starts_at__lte=now + lead)
    return _start_runs(due, provisioning_start, refused=BookingError)


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
                enqueue.send_end_warning(order.pk, due[-1])
                warned += 1
    return warned


def _tear_down_released(now: datetime) -> int:
    """Windows that ended, and released orders that still have access (the teardown their event should have
    started, if it was lost)."""
    # Those with a teardown already: a failed one is retried with backoff (_retry_failed), never started again.
    ended = Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], ends_at__lte=now).exclude(
        Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=ProvisioningRun.Kind.TEARDOWN))
    )
    torn_down = _start_runs(ended, teardown_start, refused=ProvisioningError)
    # Only those without any teardown: a failed one is retried with backoff, not started again every tick. An order
    # whose window passed while its hand-over still waited (a failed pre-flight, a failed run) keeps no container
    # either: its status is the operator's to settle, its machines are free for the next window.
    # A window that starts as soon as ready may still be handed over until its lots' hold runs out: the allowance
    # booked with it, as its live allocations say (less the turnaround), whatever the policy says today.
    held = Allocation.objects.filter(order=OuterRef("pk"), ends_at__gt=now + BookingPolicy.current().turnaround)
    waiting = Q(start_when_ready=True, clock_started_at__isnull=True) & Exists(held.in_use())
    still_open = (
        Order.objects.filter(
            Q(status__in=RELEASING_STATUSES) | (Q(status__in=NEVER_HANDED_OVER, ends_at__lte=now) & ~waiting),
            accesses__status__in=[Access.Status.PENDING, Access.Status.READY],
        )
        .exclude(Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=ProvisioningRun.Kind.TEARDOWN)))
        .values_list("pk", flat=True)
        .distinct()[:50]
    )
    for order_id in still_open:
        torn_down += access_release(order_id=order_id, reason="released with access left") is not None
    return torn_down


def _start_runs(
    orders: QuerySet[Order], start: Callable[..., ProvisioningRun], *, refused: type[Exception] | tuple = ()
) -> int:
    """Start a run with `start(order=...)` for each order of `orders`, a capped batch (the rest wait for the next
    tick); an order whose start is `refused` (already under way, changed meanwhile) is skipped. Returns how many
    runs were started."""
    started = 0
    for order in orders[:SWEEP_BATCH]:
        try:
            start(order=order)
        except refused:
            continue
        started += 1
    return started


def _run_under_way(kind: str, statuses=UNDER_WAY) -> Exists:
    """Whether the order has a run of `kind` queued or running (or in `statuses`): one run's condition, never two
    runs' (an `exclude()` over two conditions on a multi-valued relation may match them on different runs)."""
    return Exists(ProvisioningRun.objects.filter(order=OuterRef("pk"), kind=kind, status__in=statuses))


def _renew_moved_keys(now: datetime) -> int:
    """Windows whose end moved since their keys were written (an extension, a credit of lost time, the clock of a
    window that started as soon as ready, earlier or later than planned): the expiry-time moves with it."""
    grace = timedelta(minutes=OperatorSettings.current().key_grace_minutes)
    moved = (
        Order.objects.filter(
            Q(accesses__keys_expire_at__lt=F("ends_at") + grace) | Q(accesses__keys_expire_at__gt=F("ends_at") + grace),
            status__in=[OrderStatus.READY, OrderStatus.ACTIVE],
            ends_at__gt=now,
            accesses__status=Access.Status.READY,
        )
        # a keys run that failed waits for the operator's retry (console), not a new run every tick
        .exclude(_run_under_way(ProvisioningRun.Kind.KEYS, statuses=(*UNDER_WAY, ProvisioningRun.Status.FAILED)))
        .distinct()
    )
    return _start_runs(moved, access_keys_renew)


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
        # Data carried to a next order waits for it: that order's provisioning moves the volume out of this order's
        # reach (after which the wipe finds nothing of it), or it is released and the wipe goes on.
        .exclude(Exists(Order.objects.filter(carry_data_from=OuterRef("pk"), status__in=CARRY_WAITING)))
        .distinct()
    )
    return _start_runs(due, access_wipe_start)


def _retry_failed(now: datetime) -> int:
    """Failed teardowns, wipes, releases of hosts and moves (not given up) whose next retry is due, oldest due
    first, a capped batch: each queued again (the same run, at its failed step) by a conditional update, so two
    sweeps at once queue it once. Its next failure sets the next retry, twice as far (retry_delay)."""
    due = (
        ProvisioningRun.objects.filter(
            kind__in=RETRIED_RUN_KINDS,
            status=ProvisioningRun.Status.FAILED,
            next_retry_at__lte=now,
            given_up_at__isnull=True,
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
        enqueue.execute_run_now(run_id)
        resumed += 1
    return resumed


def end_warning_send(*, order: Order, kind: str) -> None:
    """The end is near: when, when the files go, and a fresh link to the order page, where the window can be
    extended (minted here, in the task, so that no secret travels through the broker)."""
    notices.send(
        Notice.END_WARNING,
        order=order,
        kind=kind,
        wipe_at=wipe_date(order),
        wipe_after_days=OperatorSettings.current().wipe_after_days,
        link=links.mailed_order_link(order=order),
    )
