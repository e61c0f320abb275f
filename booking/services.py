"""Every write of the booking app. One transaction each; follow-up work is enqueued on commit."""

import logging
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max, Min
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import enqueue, selectors
from booking.cancellation import refund_quote
from booking.locks import lock_capacity, lock_order, lock_order_and_capacity
from booking.models import (
    CHECKPOINT_INTERVAL_HOURS,
    ORDER_TRANSITIONS,
    RELEASING_STATUSES,
    AlertMails,
    Allocation,
    BookingPolicy,
    Order,
    OrderEvent,
    OrderSshKey,
    OrderStatus,
    WindowDays,
)
from booking.rules import (
    BookingError,
    InvalidTransition,
    SoldOut,
    clean_checkpoint_dir,
)
from booking.signals import send_order_status_changed_on_commit
from booking.ssh_keys import SshPublicKey
from inventory.models import MaintenanceWindow

logger = logging.getLogger(__name__)


def order_note(
    *,
    order: Order,
    reason: str,
    actor_kind: str,
    actor: AbstractBaseUser | None = None,
    evidence: dict | None = None,
) -> OrderEvent:
    """Record something notable that is not a transition (a lot moved, an extension asked for, a link revoked)
    in the order's audit trail, at its current status."""
    return OrderEvent.objects.create(
        order=order,
        from_status=order.status,
        to_status=order.status,
        actor_kind=actor_kind,
        actor=actor,
        reason=reason,
        evidence=evidence or {},
    )


@transaction.atomic
def order_transition(
    *,
    order: Order,
    to_status: str,
    actor_kind: str,
    actor: AbstractBaseUser | None = None,
    reason: str = "",
    evidence: dict | None = None,
    now: datetime | None = None,
) -> bool:
    """Move the order to `to_status` if the state machine allows it; False when it is already there.

    Locks the order row, records an OrderEvent, releases the lots when the new state ends the order, and sends
    `order_status_changed` once the transaction commits (booking/signals.py): what other apps do about it runs
    then, and cannot undo the transition.
    """
    locked = lock_order(order.pk)
    if locked.status == to_status:
        order.status = locked.status
        return False
    if to_status not in ORDER_TRANSITIONS[locked.status]:
        raise InvalidTransition(
            _("An order that is “%(current)s” cannot become “%(target)s”.")
            % {"current": locked.get_status_display(), "target": OrderStatus(to_status).label}
        )
    now = now or timezone.now()
    from_status = locked.status
    update_fields = ["status", "updated_at"]
    if to_status in RELEASING_STATUSES:
        # Bumps availability first among the on-commit callbacks (AllocationQuerySet): the booking page shows the
        # lots free before any order page says they were released.
        # A lot a move vacated stays held until the container on its cards is gone (allocations_release_vacated).
        Allocation.objects.filter(order=locked).in_use().update(released_at=now)
        locked.hold_expires_at = None
        update_fields.append("hold_expires_at")
    OrderEvent.objects.create(
        order=locked,
        from_status=from_status,
        to_status=to_status,
        actor_kind=actor_kind,
        actor=actor,
        reason=reason,
        evidence=evidence or {},
    )
    locked.status = to_status
    locked.save(update_fields=update_fields)
    order.status = locked.status
    order.hold_expires_at = locked.hold_expires_at
    send_order_status_changed_on_commit(
        order_id=locked.pk,
        from_status=from_status,
        to_status=to_status,
        actor_kind=actor_kind,
        actor_id=actor.pk if actor is not None else None,
    )
    return True


@transaction.atomic
def order_reallocate_after_late_payment(
    *, order: Order, evidence: dict, now: datetime | None = None, actor: AbstractBaseUser | None = None
) -> None:
    """A payment confirmed after the hold expired: hold lots again for the same window if enough are free, and
    mark the order paid; otherwise raise SoldOut (the payments app flags the invoice for an operator)."""
    now = now or timezone.now()
    policy = BookingPolicy.current()
    order = lock_order_and_capacity(order.pk)
    if order.start_when_ready:  # planned again from now: its days count from the hand-over anyway
        ready = selectors.ready_start(
            hardware_class=order.hardware_class, days=order.days, lot_count=order.lot_count, policy=policy, now=now
        )
        if ready is None:
            raise SoldOut(_("The lots of this order were taken after it expired."), next_dates=[])
        window = ready.window
        lot_ids = selectors.free_lot_ids(
            hardware_class=order.hardware_class, window=window, limit=order.lot_count, ready_within=ready.ready_within
        )
        order.starts_at, order.ends_at = window.starts_at, window.ends_at
        order.save(update_fields=["starts_at", "ends_at", "updated_at"])
    else:
        window = selectors.order_window(order=order, policy=policy)
        lot_ids = selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=order.lot_count)
    if len(lot_ids) < order.lot_count or order.starts_at <= now:
        raise SoldOut(_("The lots of this order were taken after it expired."), next_dates=[])
    Allocation.objects.bulk_create(
        Allocation(order=order, lot_id=lot_id, starts_at=window.held_from, ends_at=window.held_until)
        for lot_id in lot_ids
    )
    order_transition(
        order=order,
        to_status=OrderStatus.PAID,
        actor_kind=OrderEvent.Actor.ADMIN if actor else OrderEvent.Actor.SYSTEM,
        actor=actor,
        reason="late payment: lots allocated again",
        evidence=evidence,
        now=now,
    )


def _allocation_move(
    *, order: Order, from_lot_id: int, to_lot_id: int, window_of, not_free: str, now: datetime, vacate: bool = False
):
    """Release the order's allocation of `from_lot_id` now (with `vacate`, only mark it vacated: it stays held
    until allocations_release_vacated) and allocate `to_lot_id` for the period `window_of(the allocation)` must be
    free (BookingError `not_free` when it is not), from the later of the old allocation's start and that period's,
    to the old allocation's end. The order is locked; the class's capacity is locked here. The new allocation is
    checked by the same exclusion constraint as a booking."""
    lock_capacity(order.hardware_class_id)
    current = Allocation.objects.select_for_update().filter(order=order, lot_id=from_lot_id).in_use()
    allocation = current.first()
    if allocation is None:
        raise BookingError(_("This lot is not allocated to the order."), field="from_lot")
    window = window_of(allocation)
    free = selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=10_000)
    if to_lot_id not in free:
        raise BookingError(not_free, field="to_lot")
    current.update(**{"vacated_at" if vacate else "released_at": now})
    try:
        with transaction.atomic():
            Allocation.objects.create(
                order=order,
                lot_id=to_lot_id,
                starts_at=max(allocation.starts_at, window.held_from),
                ends_at=allocation.ends_at,
            )
    except IntegrityError as exc:
        raise BookingError(_("That lot was taken meanwhile."), field="to_lot") from exc


# Before access exists on a host, its lots can move; later, tear down first.
REASSIGNABLE = frozenset({OrderStatus.PAID, OrderStatus.APPROVED, OrderStatus.PROVISIONING_FAILED})


@transaction.atomic
def order_reassign_lot(
    *,
    order: Order,
    from_lot_id: int,
    to_lot_id: int,
    actor: AbstractBaseUser,
    vacate: bool = False,
    now: datetime | None = None,
) -> None:
    """Move one of the order's lots to another free lot of the same class, for the same period. The new
    allocation is checked by the same exclusion constraint as a booking. With `vacate` (a container of the order may
    hold the old lot's cards: provisioning knows), the old lot is only vacated, as a move's: nobody can book it
    until provisioning saw that container go (allocations_release_vacated); else it is released at once."""
    now = now or timezone.now()
    order = lock_order(order.pk)
    if order.status not in REASSIGNABLE:
        raise BookingError(_("Lots can be moved before access is prepared, or after a failed provisioning."))
    policy = BookingPolicy.current()
    _allocation_move(
        order=order,
        from_lot_id=from_lot_id,
        to_lot_id=to_lot_id,
        window_of=lambda allocation: selectors.order_window(order=order, policy=policy),
        not_free=_("That lot is not free for this window, or not of this class."),
        now=now,
        vacate=vacate,
    )
    order_note(
        order=order,
        reason="lot reassigned",
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        evidence={"from_lot": from_lot_id, "to_lot": to_lot_id},
    )


def order_checkpoint_watch_set(*, order: Order, directory: str, interval_hours: int) -> bool:
    """Where the order's checkpoints are written and how often they are watched (directory "" turns the watch off;
    the interval declared at booking is left as written); refused once the window ended. Returns whether anything
    changed."""
    directory = clean_checkpoint_dir(directory)
    low, high = CHECKPOINT_INTERVAL_HOURS
    if not low <= interval_hours <= high:
        raise BookingError(
            _("Checkpoints are watched every %(low)d to %(high)d hours.") % {"low": low, "high": high},
            field="checkpoint_interval_hours",
        )
    if order.status in (OrderStatus.ENDED, OrderStatus.CANCELLED, OrderStatus.EXPIRED, OrderStatus.REJECTED):
        raise BookingError(_("This window is over: there is nothing left to watch."), field="checkpoint_dir")
    if (order.checkpoint_dir, order.checkpoint_watch_interval_hours) == (directory, interval_hours):
        return False
    # the interval declared at booking stays as written; the watch's own is kept beside it
    order.checkpoint_dir, order.checkpoint_watch_hours = directory, interval_hours
    order.save(update_fields=["checkpoint_dir", "checkpoint_watch_hours"])
    return True


def order_alert_mails_set(*, order: Order, value: str) -> bool:
    """How often the readings' watch may e-mail the order's researcher (AlertMails); returns whether it changed."""
    if value not in AlertMails.values:
        raise BookingError(_("Choose how often these e-mails may come."), field="alert_mails")
    if order.alert_mails == value:
        return False
    order.alert_mails = value
    order.save(update_fields=["alert_mails"])
    return True


def order_start_clock(*, order: Order, now: datetime | None = None) -> bool:
    """An order booked to start as soon as ready is handed over: its days count from now (or from the start of its
    lots' hold, if the hand-over came sooner: the cards are the order's from then only).

    Its lots are held until its planned end and the allowance, as the allocation rows say (not the policy of today,
    which an operator may have changed since). A hand-over later than that holds them longer when nobody booked
    them after (no other booking, no maintenance): the full window. When they are taken, the window ends where they
    are held, and the hours lost are recorded on the order for the operators (a provider fault: a credit or a
    refund). The lots' periods then shrink to the window's end and turnaround, giving the unused allowance back.

    Raises BookingError when the lots are taken before a window could start at all: the hand-over is the operators'
    to settle (provisioning marks it failed). In the caller's transaction; False when the clock was already started,
    or the order is a dated window."""
    now = now or timezone.now()
    order = lock_order_and_capacity(order.pk)
    if not order.start_when_ready or order.clock_started_at is not None:
        return False
    turnaround = BookingPolicy.current().turnaround
    live = Allocation.objects.filter(order=order).in_use()
    held_from, held_until = selectors.order_held_period(order=order)
    if held_until is None:
        raise BookingError(_("This order holds no lots: it cannot be handed over."))
    start = max(now, held_from)
    wanted = start + timedelta(days=order.days)
    held_end = held_until - turnaround
    if wanted > held_end:
        next_use = _lots_next_taken(order=order, after=held_end + turnaround)
        until = wanted + turnaround
        if next_use is None or next_use >= until:
            live.update(ends_at=until)
            held_end = wanted
    end = min(wanted, held_end)
    if end <= start:
        raise BookingError(
            _("The lots of this window are taken from %(end)s UTC: it cannot be handed over now.")
            % {"end": held_end.strftime("%Y-%m-%d %H:%M")}
        )
    planned = order.starts_at
    order.starts_at, order.ends_at, order.clock_started_at = start, end, now
    order.save(update_fields=["starts_at", "ends_at", "clock_started_at", "updated_at"])
    live.filter(ends_at__gt=end + turnaround).update(ends_at=end + turnaround)
    evidence = {"planned_start": planned.isoformat(), "start": start.isoformat(), "end": end.isoformat()}
    if end < wanted:
        evidence["hours_lost"] = round((wanted - end).total_seconds() / 3600, 2)
    order_note(
        order=order,
        reason="window clock started at the hand-over"
        + ("; shortened: its lots are booked after it" if end < wanted else ""),
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence=evidence,
    )
    return True


# A provider fault: an order whose machines are prepared (or in use) moves to other lots for the rest of its window.
MOVABLE = frozenset({OrderStatus.READY, OrderStatus.ACTIVE})


def move_window(*, order: Order, allocation: Allocation, now: datetime) -> selectors.Window:
    """The period a lot must be free for to take over `allocation` of an order in its window: from now (or the
    lot's held start, if later) to the allocation's end."""
    held_from = max(now, allocation.starts_at)
    return selectors.Window(
        starts_at=max(now, order.starts_at), ends_at=order.ends_at, held_from=held_from, held_until=allocation.ends_at
    )


def free_lots_for_move(*, order: Order, now: datetime | None = None, limit: int = 50) -> list[int]:
    """Lots of the order's class free for the rest of its window (what the console offers to move a lot to)."""
    now = now or timezone.now()
    allocation = order.allocations.in_use().order_by("ends_at").last()
    if allocation is None:
        return []
    window = move_window(order=order, allocation=allocation, now=now)
    return selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=limit)


@transaction.atomic
def order_move_lot(
    *, order: Order, from_lot_id: int, to_lot_id: int, actor: AbstractBaseUser, now: datetime | None = None
) -> None:
    """Move one lot of a ready or active order to another free lot of its class, from now to the window's end (a
    provider fault: the old lot's host failed). The old allocation is vacated now: the order no longer uses it, but
    nobody can book it until provisioning saw the container holding its cards go (its move replaced the container,
    or the teardown of the host left removed it: allocations_release_vacated). The new one is checked by the same
    exclusion constraint as a booking. Provisioning prepares the new lot, then tears down what the order left."""
    now = now or timezone.now()
    order = lock_order(order.pk)
    if order.status not in MOVABLE or order.ends_at <= now:
        raise BookingError(_("Only a ready or running window can be moved to other lots."))
    _allocation_move(
        order=order,
        from_lot_id=from_lot_id,
        to_lot_id=to_lot_id,
        window_of=lambda allocation: move_window(order=order, allocation=allocation, now=now),
        not_free=_("That lot is not free for the rest of this window, or not of this class."),
        now=now,
        vacate=True,
    )
    order_note(
        order=order,
        reason="lot moved (provider fault)",
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        evidence={"from_lot": from_lot_id, "to_lot": to_lot_id, "at": now.isoformat()},
    )


def allocations_release_vacated(*, order: Order, host_ids: set[int], now: datetime | None = None) -> int:
    """Provisioning saw the order's container go from these hosts, or made again without the cards of the lots a
    move vacated there: those lots are free to book again. Returns how many were released."""
    now = now or timezone.now()
    vacated = Allocation.objects.filter(
        order=order, lot__host_id__in=host_ids, vacated_at__isnull=False, released_at__isnull=True
    )
    lots = list(vacated.values_list("lot_id", flat=True))
    if not lots:
        return 0
    vacated.update(released_at=now)
    order_note(
        order=order,
        reason="lots the move left released: the container on their cards is gone",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={"lots": lots},
    )
    return len(lots)


@transaction.atomic
def order_credit_time(*, order: Order, lost: timedelta, actor: AbstractBaseUser) -> datetime:
    """Give back time lost to a provider fault as a longer window: the end and the lots' periods move by `lost`,
    if the lots are free for it (no other booking, no maintenance of their hosts), else BookingError. Returns the
    new end. The end warnings are kept per window end, so they run again before the new one.

    An extension waiting for its payment keeps its days after the new end when the lots are free for them too (its
    hold moves with the end); when they are not, the credit is still given and the hold ends with the new window:
    a payment of that extension is then refused and refunded (payments/settlement.py)."""
    order = lock_order(order.pk)
    if order.status not in MOVABLE:
        raise BookingError(_("Only a ready or running window can be lengthened."))
    turnaround = BookingPolicy.current().turnaround
    window_held_until = order.ends_at + turnaround
    held_until = window_held_until + lost
    next_use = _lots_next_taken(order=order, after=window_held_until)
    if next_use is not None and next_use < held_until:
        raise BookingError(
            _("The lots are taken after this window: credit the lost time as a refund instead."), field="credit"
        )
    live = Allocation.objects.filter(order=order).in_use()
    extension_days_held = timedelta(0)
    if order.extension_held_until is not None:
        lots_held_until = live.aggregate(until=Max("ends_at"))["until"] or window_held_until
        extension_days_held = max(lots_held_until - window_held_until, timedelta(0))
    extension_kept = next_use is None or next_use >= held_until + extension_days_held
    live.update(ends_at=held_until + (extension_days_held if extension_kept else timedelta(0)))
    order.ends_at += lost
    order.save(update_fields=["ends_at", "updated_at"])
    evidence = {"hours": round(lost.total_seconds() / 3600, 2), "new_end": order.ends_at.isoformat()}
    if extension_days_held:
        evidence["extension_hold"] = "kept after the new end" if extension_kept else "dropped: its payment is refunded"
    order_note(
        order=order,
        reason="window lengthened: time lost to a provider fault",
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        evidence=evidence,
    )
    return order.ends_at


def _lots_next_taken(*, order: Order, after: datetime) -> datetime | None:
    """When the order's lots are next taken after `after` (another booking or a maintenance of their hosts), or
    None."""
    return min((moment for moment in _lots_busy_from(order=order, after=after) if moment is not None), default=None)


def _lots_busy_from(*, order: Order, after: datetime) -> tuple[datetime | None, datetime | None]:
    """When the order's lots are next taken after `after`: the earliest start of another live allocation of them,
    and of a maintenance window of their hosts, still running at `after` (either None when there is none)."""
    lot_ids = list(order.allocations.in_use().values_list("lot_id", flat=True))
    booked = (
        Allocation.objects.filter(lot_id__in=lot_ids, released_at__isnull=True, ends_at__gt=after)
        .exclude(order=order)
        .aggregate(first=Min("starts_at"))["first"]
    )
    maintenance = MaintenanceWindow.objects.filter(host__lots__id__in=lot_ids, ends_at__gt=after).aggregate(
        first=Min("starts_at")
    )["first"]
    return booked, maintenance


def days_to_next_booking(*, order: Order) -> int | None:
    """The whole days the order's lots stay free after its window, when they are taken again (another booking, a
    host's maintenance) before the longest window on sale would end, and that is not already one of the windows
    on sale: an extension of exactly those days is offered. None otherwise, or with less than a day left."""
    turnaround = BookingPolicy.current().turnaround
    busy = _lots_busy_from(order=order, after=order.ends_at + turnaround)
    return _days_left(order=order, busy=busy, turnaround=turnaround)


def _days_left(*, order: Order, busy: tuple[datetime | None, datetime | None], turnaround: timedelta) -> int | None:
    starts = [moment for moment in busy if moment is not None]
    if not starts:
        return None
    days = (min(starts) - turnaround - order.ends_at) // timedelta(days=1)
    if days < 1 or days >= max(WindowDays.values) or days in WindowDays.values:
        return None
    return days


def extension_check(*, order: Order, days: int) -> selectors.Window:
    """The extension window right after the order's end if the same lots are free for it (no other booking, no
    maintenance of their hosts), else BookingError. `days` is one of the windows on sale, or the days left to the
    lots' next booking (the policy and the lots' next uses are read once for both)."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        raise BookingError(_("Only a ready or active window can be extended."))
    refused = BookingError(
        _("Choose an extension of 3, 7 or 30 days, or the days left before the next booking."), field="days"
    )
    if not isinstance(days, int):
        raise refused
    turnaround = BookingPolicy.current().turnaround
    held_from, held_until = order.ends_at + turnaround, order.ends_at + timedelta(days=days) + turnaround
    booked, maintenance = _lots_busy_from(order=order, after=held_from)
    if days not in WindowDays.values and days != _days_left(
        order=order, busy=(booked, maintenance), turnaround=turnaround
    ):
        raise refused
    if booked is not None and booked < held_until:
        raise BookingError(_("The same lots are booked after this window: it cannot be extended."))
    if maintenance is not None and maintenance < held_until:
        raise BookingError(_("The cards' host is in maintenance after this window: it cannot be extended that long."))
    return selectors.Window(
        starts_at=order.ends_at,
        ends_at=order.ends_at + timedelta(days=days),
        held_from=held_from,
        held_until=held_until,
    )


def extension_price(*, order: Order, days: int) -> Decimal:
    """What extending the order by `days` costs, if the extension is possible now (else BookingError): the
    catalog's price for a window on sale; for the days left to the next booking, that many days at the daily rate
    of the longest window on sale not longer than them (of the shortest when they are fewer), to the cent."""
    extension_check(order=order, days=days)
    prices = dict(order.hardware_class.prices.values_list("days", "amount_per_lot"))
    if days in prices:
        return prices[days] * order.lot_count
    shorter = [window for window in prices if window <= days]
    base = max(shorter) if shorter else min(prices, default=None)
    if base is None or days in WindowDays.values:
        raise BookingError(_("This window is not on sale for this hardware class."), field="days")
    per_lot = (prices[base] * days / base).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return per_lot * order.lot_count


# A payment sent just before an extension's quote expires still has its lots when it confirms.
EXTENSION_PAYMENT_GRACE = timedelta(minutes=30)


def _check_data_not_carried_past(*, order: Order, days: int) -> None:
    """The order whose data volume this order hands over takes it when it is prepared: this window cannot run into
    that order's (its container would still hold the volume). Said before the lots' own check: it is the reason."""
    carrying = selectors.order_data_carried(order=order) if isinstance(days, int) else None
    if carrying is not None and carrying.starts_at < order.ends_at + timedelta(days=days):
        raise BookingError(
            _(
                "Your data is carried to order %(number)s, which starts on %(start)s UTC: this window cannot be "
                "extended past it."
            )
            % {"number": carrying.public_id, "start": carrying.starts_at.strftime("%Y-%m-%d %H:%M")},
            field="days",
        )


@transaction.atomic
def extension_hold(*, order: Order, days: int, actor: AbstractBaseUser | None = None, now: datetime | None = None):
    """Hold the order's lots for an extension of `days` while its invoice is open: the lots' periods grow now, so
    nobody books them meanwhile, and give the days back if the hold passes unpaid (extension_holds_release).
    Returns the end of the hold (the invoice's quote must not outlast it). One extension at a time."""
    now = now or timezone.now()
    order = lock_order(order.pk)
    if order.extension_held_until is not None and order.extension_held_until > now:
        raise BookingError(_("An extension of this window is already waiting for its payment."), field="days")
    _check_data_not_carried_past(order=order, days=days)
    window = extension_check(order=order, days=days)
    policy = BookingPolicy.current()
    until = now + timedelta(minutes=policy.hold_minutes) + EXTENSION_PAYMENT_GRACE
    Allocation.objects.filter(order=order).in_use().update(ends_at=window.held_until)
    order.extension_held_until = until
    order.save(update_fields=["extension_held_until", "updated_at"])
    order_note(
        order=order,
        reason=f"lots held for an extension of {days} days",
        actor_kind=OrderEvent.Actor.OPERATOR if actor else OrderEvent.Actor.CUSTOMER,
        actor=actor,
        evidence={"days": days, "held_until": until.isoformat(), "lots_until": window.held_until.isoformat()},
    )
    return until


def extension_holds_release(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Give back the days held for extensions whose payment did not come in time: the lots' periods end with the
    window again (a payment that still arrives extends the window if the lots are still free then)."""
    now = now or timezone.now()
    released = 0
    candidate_ids = list(Order.objects.filter(extension_held_until__lt=now).values_list("pk", flat=True)[:batch_size])
    for order_id in candidate_ids:
        with transaction.atomic():
            order = (
                Order.objects.select_for_update(skip_locked=True)
                .filter(pk=order_id, extension_held_until__lt=now)
                .first()
            )
            if order is None:
                continue
            window_end = order.ends_at + BookingPolicy.current().turnaround
            shrunk = Allocation.objects.filter(order=order, ends_at__gt=window_end).in_use().update(ends_at=window_end)
            order.extension_held_until = None
            order.save(update_fields=["extension_held_until", "updated_at"])
            if shrunk:  # not when the order ended or was cancelled meanwhile: its lots are already free
                order_note(order=order, reason="extension hold expired unpaid", actor_kind=OrderEvent.Actor.SYSTEM)
                released += 1
    return released


@transaction.atomic
def order_extend(*, order: Order, days: int, evidence: dict, price: Decimal = Decimal(0)) -> None:
    """The extension is paid (`price`, counted in what a cancellation refunds): move the end and the lots'
    periods. The exclusion constraint re-checks them; the end warnings are kept per window end, so they run again
    before the new one."""
    order = lock_order(order.pk)
    window = extension_check(order=order, days=days)
    Allocation.objects.filter(order=order).in_use().update(ends_at=window.held_until)
    order.ends_at = window.ends_at
    order.extension_held_until = None
    order.extensions_price += price
    order.save(update_fields=["ends_at", "extension_held_until", "extensions_price", "updated_at"])
    order_note(
        order=order,
        reason=f"window extended by {days} days",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={**evidence, "new_end": window.ends_at.isoformat()},
    )


def order_record_fault_refund(*, order: Order, amount: Decimal) -> None:
    """Payments refunded `amount` of the price for time lost to a provider fault: a cancellation refunds only what
    is left of the price (booking/cancellation.py). In the caller's transaction."""
    order = lock_order(order.pk)
    order.fault_refunds += amount
    order.save(update_fields=["fault_refunds", "updated_at"])


def order_end_early(*, order: Order, now: datetime | None = None) -> None:
    """The customer ends their window now: access is torn down at once (provisioning reacts to the transition) and
    the lots can be booked again. What the unused days return is the terms' to say; the order records them."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = lock_order(order.pk)
        if not locked.can_be_ended_early:
            raise InvalidTransition(_("Only a ready or running window can be ended early."))
        unused = max(locked.ends_at - max(now, locked.starts_at), timedelta(0))
        order_transition(
            order=locked,
            to_status=OrderStatus.ENDED,
            actor_kind=OrderEvent.Actor.CUSTOMER,
            reason="ended early by the customer",
            evidence={
                "booked_end": locked.ends_at.isoformat(),
                "unused_hours": round(unused.total_seconds() / 3600, 2),
            },
            now=now,
        )
    order.status = locked.status


MAX_SSH_KEYS = 10  # as at booking (booking.ssh_keys.parse_authorized_keys)


@transaction.atomic
def order_keys_change(
    *, order: Order, add: list[SshPublicKey] = (), remove_ids: list[int] = ()
) -> tuple[list[str], list[str]]:
    """Add and remove the order's SSH keys (a lost laptop's key, a collaborator's), keeping between one and
    MAX_SSH_KEYS; a key already there is not added twice, an id that is not the order's key is ignored. Noted in the
    order's events. Returns the fingerprints added and removed (both empty: nothing changed)."""
    order = lock_order(order.pk)
    if not order.keys_can_change:
        raise BookingError(_("The keys of this order can no longer be changed."))
    existing = list(order.ssh_keys.all())
    known = {key.fingerprint for key in existing}
    removing = [key for key in existing if key.pk in set(remove_ids)]
    adding = list({key.fingerprint: key for key in add if key.fingerprint not in known}.values())
    remaining = len(existing) - len(removing) + len(adding)
    if remaining < 1:
        raise BookingError(_("Keep at least one key: add the new one before removing the last."), field="ssh_keys")
    if remaining > MAX_SSH_KEYS:
        raise BookingError(
            _("An order takes at most %(max)d keys: remove one before adding another.") % {"max": MAX_SSH_KEYS},
            field="ssh_keys",
        )
    if not removing and not adding:
        return [], []
    OrderSshKey.objects.filter(pk__in=[key.pk for key in removing]).delete()
    OrderSshKey.objects.bulk_create(
        OrderSshKey(
            order=order, key_type=key.key_type, bits=key.bits, fingerprint=key.fingerprint, public_key=key.openssh()
        )
        for key in adding
    )
    added, removed = [key.fingerprint for key in adding], [key.fingerprint for key in removing]
    order_note(
        order=order,
        reason="ssh keys changed",
        actor_kind=OrderEvent.Actor.CUSTOMER,
        evidence={"added": added, "removed": removed},
    )
    return added, removed


def order_cancel_by_customer(*, order: Order, refund_shown: Decimal | None = None, now: datetime | None = None) -> None:
    """Cancel the order and release its lots. Unpaid: nothing is owed. Paid and not started: the refund its terms
    give now is recorded as owed, but only if it is the amount the customer was shown (a deadline passed between
    the page and the click changes it: they are asked again, with the new amount). Paid or not is read from the
    locked row: a payment settled since the page was read takes the paid path (and its refund check)."""
    now = now or timezone.now()
    with transaction.atomic():
        order = lock_order(order.pk)
        if order.can_be_cancelled_by_customer:
            order_transition(
                order=order,
                to_status=OrderStatus.CANCELLED,
                actor_kind=OrderEvent.Actor.CUSTOMER,
                reason="cancelled by customer",
                now=now,
            )
            return
        if not order.can_be_cancelled_with_refund:
            raise InvalidTransition(_("This order can no longer be cancelled here: write to us instead."))
        quote = refund_quote(order=order, now=now)
        if refund_shown is None or refund_shown != quote.amount:
            raise BookingError(
                _(
                    "The refund for cancelling changed since the page was drawn: it is now %(amount)s %(currency)s. "
                    "Nothing was cancelled; confirm again if you still want to cancel."
                )
                % {"amount": quote.amount, "currency": quote.currency}
            )
        order.refund_due = quote.amount
        order.save(update_fields=["refund_due", "updated_at"])
        order_transition(
            order=order,
            to_status=OrderStatus.CANCELLED,
            actor_kind=OrderEvent.Actor.CUSTOMER,
            reason="paid order cancelled by customer",
            evidence={
                "refund_due": str(quote.amount),
                "currency": quote.currency,
                "rule": quote.rule,
                "terms_version": order.terms_version.number,
            },
            now=now,
        )
        enqueue.send_order_cancelled(order.pk)


def order_cancel_by_operator(*, order: Order, actor: AbstractBaseUser, reason: str = "") -> bool:
    """Cancel the order and release its lots. What follows (a refund flag on a paid invoice, the teardown of
    access already prepared) happens in the apps that own it, on the order_status_changed event."""
    return order_transition(
        order=order,
        to_status=OrderStatus.CANCELLED,
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        reason=f"cancelled by an operator: {reason}".strip(": "),
    )


@transaction.atomic
def order_hold_extend(*, order: Order, until: datetime, reason: str, evidence: dict | None = None) -> bool:
    """Keep an unpaid order's lots held until `until` (never shortens a hold). Payments calls it when the chain it
    is paid on could not be checked: a hold must not run out while nobody can see the payment."""
    order = lock_order(order.pk)
    if order.status != OrderStatus.AWAITING_PAYMENT or order.hold_expires_at is None or order.hold_expires_at >= until:
        return False
    held_until = order.hold_expires_at
    order.hold_expires_at = until
    order.save(update_fields=["hold_expires_at", "updated_at"])
    order_note(
        order=order,
        reason=reason,
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={**(evidence or {}), "held_until": held_until.isoformat(), "now_held_until": until.isoformat()},
    )
    return True


def orders_expire_stale_holds(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Expire orders whose hold ran out unpaid; releases their lots. Safe to run twice at once."""
    now = now or timezone.now()
    expired = 0
    candidate_ids = list(
        Order.objects.filter(status=OrderStatus.AWAITING_PAYMENT, hold_expires_at__lt=now)
        .order_by("hold_expires_at")
        .values_list("pk", flat=True)[:batch_size]
    )
    for order_id in candidate_ids:
        with transaction.atomic():
            order = (
                Order.objects.select_for_update(skip_locked=True)
                .filter(pk=order_id, status=OrderStatus.AWAITING_PAYMENT, hold_expires_at__lt=now)
                .first()
            )
            if order is None:  # paid, cancelled or being handled by another sweep meanwhile
                continue
            expired += order_transition(
                order=order,
                to_status=OrderStatus.EXPIRED,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="hold expired before payment",
                now=now,
            )
    return expired
